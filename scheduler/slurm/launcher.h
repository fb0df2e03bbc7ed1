// Starting a dlbatch job on a profile of Slurm: the job's pool as a Slurm
// batch job (PlanBatch, pure), and the launcher that submits it with sbatch
// and commits the Slurm job id before anything else happens.
//
// Nothing may be left running in Slurm that dlbatch does not know about, so
// a launch is written down twice: before sbatch, that the job is being
// submitted (Intend); after it, the Slurm job id (Commit). A scheduler that
// dies between the two finds the intent on restart, and the
// `dlbatch-<instance>-<id>` Slurm job in squeue: it adopts that job rather than
// submit another. Where the id cannot be committed, the Slurm job is cancelled
// at once.
#ifndef DLBATCH_SCHEDULER_SLURM_LAUNCHER_H_
#define DLBATCH_SCHEDULER_SLURM_LAUNCHER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/tool.h"

namespace dlbatch::scheduler::slurm {

// What a job asks of its profile.
struct JobShape {
  int pool = 1;              // GPUs, or on CPU-only nodes CPU slots
  int max_nodes = 0;         // 0 or 1: one node
  int64_t time_limit_s = 0;  // 0: none
};

// The Slurm batch job for attempt `attempt` of job `job_id`: as few nodes
// as hold the pool, each with the same share of it (--gres and
// --cpus-per-task are per node). A node holds the profile's gpus_per_node
// GPUs, or on CPU-only nodes (gpus_per_node 0) `node_cpus` CPU slots: the
// partition's CPUs per node, as sinfo says (PartitionLimits; 0 where not
// known: the pool on one node). Each node's task asks for a CPU for each
// of its ranks. InvalidArgument, saying what to change, where the pool
// needs more nodes than max_nodes allows, or splits unevenly over the
// nodes it needs.
absl::StatusOr<BatchRequest> PlanBatch(const SlurmProfile& profile,
                                       int64_t job_id, int attempt,
                                       const JobShape& shape,
                                       int node_cpus = 0);

// What a Slurm job's workers must offer, node by node, before its dlbatch
// job starts on them: `per_node` GPUs (or CPU slots) on each of `nodes`.
struct GangShape {
  int nodes = 1;
  int per_node = 1;
  bool gpus = false;  // GPUs, else CPU slots
};

// The gang of a job's Slurm job, where Slurm says it has `slurm_nodes`
// nodes (SLURM_JOB_NUM_NODES of a registering worker). On GPU nodes it is
// PlanBatch's, whatever Slurm says (the gang refuses a disagreeing
// count). On CPU-only nodes PlanBatch's count followed the partition's
// CPUs when the job was launched, which may have changed since (or be
// unknown after a restart): the pool is shared over the nodes Slurm gave,
// the count dlbatch asked for (--nodes is fixed). FailedPrecondition,
// saying why, where the pool cannot be shared evenly over them or they
// are more than max_nodes allows.
absl::StatusOr<GangShape> ShapeOfGang(const SlurmProfile& profile,
                                      const JobShape& shape, int slurm_nodes);

// A dlbatch job's Slurm job, as the store keeps it (one per job: its
// current attempt's).
struct SlurmJobRecord {
  int64_t job_id = 0;
  int attempt = 0;
  int64_t slurm_id = 0;  // 0: being submitted (sbatch has not answered)
  std::string profile;
  int64_t submitted_ms = 0;
  // The sha256 of the one-job credential in the batch script (the token
  // of WorkerLaunch): its workers register under it, also after a restart.
  std::string token_sha256;
};

// Where launches are written down durably: the scheduler's store, behind
// an interface so the launcher's tests see what was committed, and when.
// Each call returns only once the record is durable.
class SlurmJobLedger {
 public:
  virtual ~SlurmJobLedger() = default;
  // Writes `record` (slurm_id 0 before sbatch, the id after), replacing the
  // job's earlier record.
  virtual absl::Status Put(const SlurmJobRecord& record) = 0;
  // The job no longer has a Slurm job.
  virtual absl::Status Forget(int64_t job_id) = 0;
};

class SlurmLauncher {
 public:
  // Borrowed pointers must outlive the launcher. Thread-safe as far as
  // `tool` and `ledger` are (Launch holds no lock of its own).
  SlurmLauncher(SlurmTool* tool, SlurmJobLedger* ledger, const Clock* clock);

  // Submits `request` on `profile` with sbatch. The intent is committed
  // before sbatch runs and the Slurm id after it, before Launch returns.
  // Errors: the intent could not be committed (sbatch never ran); Slurm
  // refused (FailedPrecondition, in Slurm's words; the intent is
  // forgotten); sbatch failed otherwise (the intent stays: the Slurm job
  // may exist); the id could not be committed (the Slurm job is then
  // cancelled; the intent stays).
  absl::StatusOr<SlurmJobRecord> Launch(const SlurmProfile& profile,
                                        const BatchRequest& request,
                                        const WorkerLaunch& launch);

 private:
  SlurmTool* const tool_;
  SlurmJobLedger* const ledger_;
  const Clock* const clock_;
};

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_LAUNCHER_H_
