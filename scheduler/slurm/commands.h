// What dlbatch says to Slurm's command-line tools and how it reads their
// answers: sbatch's arguments and batch script, squeue's and sinfo's lines,
// scancel's outcome, and what each Slurm job state means for a dlbatch job.
// Pure functions of their inputs (no process is run here), so every case of
// Slurm 22.05's output is unit-tested.
#ifndef DLBATCH_SCHEDULER_SLURM_COMMANDS_H_
#define DLBATCH_SCHEDULER_SLURM_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlbatch::scheduler::slurm {

// A profile whose machines belong to Slurm, as the scheduler's
// configuration declares it.
struct SlurmProfile {
  std::string name;
  std::string partition;  // required
  std::string account;    // optional: sbatch --account
  std::string qos;        // optional: sbatch --qos
  // GPUs each node of the partition gives a job; 0 for CPU-only nodes.
  int gpus_per_node = 0;
  std::string gres_name = "gpu";  // --gres=<gres_name>:<count>
  // More sbatch arguments, as given (e.g. "--constraint=a100").
  std::vector<std::string> sbatch_args;
  // Where dlbatch-worker is on the cluster's nodes.
  std::string bin_dir = "/usr/bin";
  // A folder that exists on every node, writable by the jobs' owners:
  // Slurm's output file of each job goes there, and the ephemeral workers
  // make their job folders in it.
  std::string node_dir = "/tmp";
};

// A scheduler's instance id: 8 lowercase hex digits, made on its first
// start and kept in its store (Store::InstanceId), so that schedulers
// sharing one Slurm cluster tell their Slurm jobs apart.
inline constexpr int kInstanceIdLength = 8;
bool IsInstanceId(absl::string_view id);

// Slurm job names dlbatch gives its jobs: "dlbatch-<instance>-<job id>"
// (17 characters and the id). Versions before instance ids named them
// "dlbatch-<job id>" (ParseSlurmJobName's `instance` is then empty). Any
// other name is not dlbatch's.
// REQUIRES: IsInstanceId(instance).
std::string SlurmJobName(absl::string_view instance, int64_t job_id);
struct ParsedSlurmName {
  std::string instance;  // empty: the old form, of no known instance
  int64_t job_id = 0;
  bool operator==(const ParsedSlurmName&) const = default;
};
std::optional<ParsedSlurmName> ParseSlurmJobName(absl::string_view name);

// One dlbatch job attempt as one Slurm batch job.
struct BatchRequest {
  std::string instance;  // the scheduler's (IsInstanceId)
  int64_t job_id = 0;
  int attempt = 1;
  int nodes = 1;          // --nodes and --ntasks: one worker per node
  int gpus_per_node = 0;  // 0: no --gres
  // --cpus-per-task of the one task on each node: a core for each of the
  // node's ranks (its GPUs, or on CPU-only nodes its CPU slots). 0: none
  // asked (Slurm's default of one).
  int cpus_per_node = 0;
  int64_t time_limit_s = 0;  // 0: the partition's default
  // Submit as this user (the scheduler runs as root): --uid/--gid.
  std::optional<uint32_t> uid, gid;
};

// How much longer Slurm's --time is than the job's own time limit: the
// ephemeral worker stops the job at the limit itself, then needs this long
// to report and upload what the job made before Slurm kills the step.
constexpr int64_t kSlurmTimeMarginS = 60;

// sbatch's --time for a dlbatch limit: whole minutes (Slurm's resolution),
// rounded up, including the margin above. "" for no limit.
std::string SlurmTimeLimit(int64_t time_limit_s);

// The argv of the sbatch call (without the script, which goes on stdin):
// fixed counts only, never ranges (22.05.5-8 reject some range forms).
std::vector<std::string> SbatchArgv(const SlurmProfile& profile,
                                    const BatchRequest& request);

// What the batch script needs to start the workers.
struct WorkerLaunch {
  std::string scheduler;  // the address the nodes reach the scheduler at
  std::string ca_pem;     // empty for a unix: address
  std::string token;      // the job's one-job worker credential
};

// The batch script: srun starts one dlbatch-worker per node for exactly
// this job (on one node the script runs it itself, without a job step);
// each exits when the job ends. The credential is in the script
// (readable by the job's owner and Slurm's administrators only), never on
// a command line.
std::string BatchScript(const SlurmProfile& profile,
                        const BatchRequest& request,
                        const WorkerLaunch& launch);

// sbatch --parsable prints "<id>" or "<id>;<cluster>".
absl::StatusOr<int64_t> ParseSbatchParsable(absl::string_view out);

// squeue's format and what one of its lines holds.
inline constexpr char kSqueueFormat[] = "%i|%j|%T|%u|%N|%r";
struct SqueueRow {
  int64_t slurm_id = 0;
  std::string name;
  std::string state;  // e.g. RUNNING, "CANCELLED by 1000"
  std::string user;
  std::string nodes;   // e.g. "n[1-2]"
  std::string reason;  // e.g. Resources; "None" when none
};
// The argv of the one squeue call that reads every job of the partitions
// (pending, running and recently ended). squeue's --name takes exact
// names only, never a pattern, so it reads every job of the partitions;
// the reconciler keeps those of its own instance (ParseSlurmJobName).
std::vector<std::string> SqueueArgv(const std::vector<std::string>& partitions);
// squeue -h -o kSqueueFormat's lines. A line that does not parse is an
// error naming it: the reconciler must not guess.
absl::StatusOr<std::vector<SqueueRow>> ParseSqueue(absl::string_view out);

// What a Slurm job's state means for its dlbatch job.
enum class SlurmPhase {
  kPending,  // dlbatch: queued (waiting in Slurm)
  kRunning,  // dlbatch: starting or running (the workers report)
  kEnded,    // the Slurm job is over
  kUnknown,  // a state this version does not know: leave the job be
};
struct SlurmVerdict {
  SlurmPhase phase = SlurmPhase::kUnknown;
  // For kEnded: the job may run again (within its retry limit) because its
  // machines failed it, not its own code: NODE_FAIL, PREEMPTED, BOOT_FAIL.
  bool retryable = false;
  // For kPending: why it waits, e.g. "waiting in Slurm: Resources
  // (partition gpu)". For kEnded: why the Slurm job ended, for the job's
  // reason when its workers did not report the end themselves.
  std::string reason;
  // For kEnded: Slurm ended the job itself (scancel, its time limit, a lost
  // node, preemption, memory), signalling the job's processes as it did;
  // false where the batch script ended by itself (COMPLETED, FAILED).
  bool by_slurm = false;
  // For kEnded: Slurm preempted it (PREEMPTED: its PreemptMode CANCEL, or
  // REQUEUE for a job it may not requeue) to start a job of a higher
  // partition tier or QOS. Its dlbatch job is queued again as preempted.
  bool preempted = false;
};
SlurmVerdict MapSlurmState(const SqueueRow& row, absl::string_view partition);

// One partition's limits, from sinfo, for refusing at submit what could
// never run.
struct PartitionLimits {
  std::string partition;
  int nodes = 0;              // nodes in the partition
  int max_gpus_per_node = 0;  // of the GRES named in the profile
  int64_t max_time_s = 0;     // 0: unlimited
  int max_cpus_per_node = 0;  // 0: not known (not checked)
};
inline constexpr char kSinfoFormat[] = "%D|%G|%l|%c";
// With --exact, so that nodes of different CPU counts are never one line
// whose %c reads "2+" (the least of them).
std::vector<std::string> SinfoArgv(const std::string& partition);
// sinfo -h -e -p P -o kSinfoFormat's lines (one per group of like nodes).
absl::StatusOr<PartitionLimits> ParseSinfo(absl::string_view out,
                                           const std::string& partition,
                                           const std::string& gres_name);
// Slurm's view of a partition's nodes for `dlbatch profiles`: one line per
// node (sinfo -N -O), padded fields each ended by '|'.
struct PartitionView {
  std::string partition;
  int nodes = 0;
  int idle = 0;         // idle
  int busy = 0;         // allocated, mixed or completing
  int unavailable = 0;  // down, drained, draining, not responding, ...
  int gpus = 0;         // of the GRES named in the profile, on all nodes
  int gpus_used = 0;    // of them, allocated to jobs
};
inline constexpr char kSinfoNodesFormat[] =
    "NodeList:256|,StateLong:64|,Gres:256|,GresUsed:256|";
std::vector<std::string> SinfoNodesArgv(const std::string& partition);
absl::StatusOr<PartitionView> ParseSinfoNodes(absl::string_view out,
                                              const std::string& partition,
                                              const std::string& gres_name);

// Each node of a partition as the preemption of dlbatch's own jobs weighs
// it (sinfo -N -O): its GPUs (of the profile's GRES) and CPUs, and how
// many of each no job holds now.
struct NodeRow {
  std::string name;
  bool usable = false;  // up: idle, mixed, allocated or completing
  int gpus = 0;
  int gpus_used = 0;
  int cpus = 0;
  int cpus_idle = 0;
};
inline constexpr char kSinfoNodeRowsFormat[] =
    "NodeList:256|,StateLong:64|,Gres:256|,GresUsed:256|,CPUsState:64|";
std::vector<std::string> SinfoNodeRowsArgv(const std::string& partition);
absl::StatusOr<std::vector<NodeRow>> ParseSinfoNodeRows(
    absl::string_view out, const std::string& gres_name);

// Slurm's host list form, as squeue's %N prints a job's nodes: "n1",
// "n[1-3,5]", "gpu[01-02],cpu7", "r[1-2]n[1-2]" -> each node's name, in
// order. InvalidArgument for a form that is not one.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list);

// scancel --batch --signal=<signal>: the signal to the batch step alone —
// on one node the dlbatch-worker itself (the script execs it), on more the
// srun that passes it on to each node's worker — never to the jobs'
// processes around the worker. `signal` as Slurm names it ("TERM").
std::vector<std::string> ScancelSignalArgv(int64_t slurm_id,
                                           absl::string_view signal);

// OK, or why the request can never run in the partition.
absl::Status CheckFits(const PartitionLimits& limits,
                       const BatchRequest& request);

// Slurm's time forms: "infinite"/"UNLIMITED" (0), "MM", "MM:SS",
// "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" -> seconds.
absl::StatusOr<int64_t> ParseSlurmTime(absl::string_view text);

// What scancel's end means: done (the job is gone, is going, or was never
// there: "already completing", "Invalid job id"), or an error to retry.
absl::Status ScancelOutcome(int exit_code, absl::string_view stderr_text);

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_COMMANDS_H_
