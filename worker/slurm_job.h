// A worker started by srun inside a dlbatch batch job (a Slurm profile's
// job): it serves exactly that job, with the GPUs Slurm gave its node, and
// leaves when the job has ended. What Slurm tells it comes from the
// environment srun sets; reading it is a pure function of that environment.
#ifndef DLBATCH_WORKER_SLURM_JOB_H_
#define DLBATCH_WORKER_SLURM_JOB_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "worker/worker.h"

namespace dlbatch::worker {

// Looks a variable up; null when unset (std::getenv, or a map in tests).
using EnvLookup = std::function<const char*(const char*)>;

struct SlurmJobContext {
  v1::SlurmJob job;    // what the worker says at registration
  std::string node;    // SLURMD_NODENAME
  int gpus = 0;        // GPUs Slurm gave this node's task
  int cpus = 0;        // CPUs Slurm gave this node (0: it does not say)
  std::string ca_pem;  // DLBATCH_CA_PEM; empty for a unix: scheduler
};

// Reads the ephemeral worker's context for dlbatch job `job_id`, attempt
// `attempt`: SLURM_JOB_ID, SLURM_NODEID (this node's index in the job),
// SLURM_JOB_NUM_NODES, SLURMD_NODENAME, the GPUs from CUDA_VISIBLE_DEVICES
// (else SLURM_STEP_GPUS, else SLURM_JOB_GPUS), the CPUs from
// SLURM_CPUS_ON_NODE (else this node's entry of SLURM_JOB_CPUS_PER_NODE,
// e.g. "4(x2),2"), DLBATCH_CA_PEM. An error that says what is missing when
// it was not started by srun.
absl::StatusOr<SlurmJobContext> ReadSlurmJob(int64_t job_id, int attempt,
                                             const EnvLookup& env);

// Makes `options` those of the job's ephemeral worker on this node: its
// name (slurm-<slurm id>-<node index>, unique in the scheduler; its host
// stays the machine's, as Slurm's node names need not resolve), its
// devices (the GPUs Slurm gave: `discovered` where the machine's own
// discovery found as many, else as many plain GPU slots; or `cpu_slots`
// CPU slots where Slurm gave none), the one job it serves, and the
// scheduler's CA.
void ApplySlurmJob(const SlurmJobContext& context,
                   const std::vector<v1::Device>& discovered, int cpu_slots,
                   WorkerOptions* options);

// The CPU slots the worker offers where Slurm gave no GPUs: the CPUs Slurm
// gave this node, no more than the `usable` processors the worker may run
// on (its affinity mask, which a task plugin may narrow); `usable` where
// Slurm does not say.
int SlurmCpuSlots(const SlurmJobContext& context, int usable);

// The ephemeral worker's own folder under the profile's node folder
// `base`: one per job, Slurm job and node, so that two tasks on one
// machine never share one.
std::string SlurmWorkDir(const SlurmJobContext& context,
                         const std::string& base);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_SLURM_JOB_H_
