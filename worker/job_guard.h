// The worker's guard (slurmstepd's role for a whole worker): a small process
// forked when the worker starts that outlives it only to kill its jobs. It
// holds one end of a pipe whose other end only the worker holds; when the
// worker dies, however it dies (kill -9 included), the pipe closes and the
// guard kills every process of the worker's jobs - each job cgroup under
// the worker's cgroup root, and every process carrying the worker's job
// mark - then removes the cgroups and exits. Nothing of a dead worker's jobs
// outlives it by more than a moment.
#ifndef DLBATCH_WORKER_JOB_GUARD_H_
#define DLBATCH_WORKER_JOB_GUARD_H_

#include <string>

#include "absl/status/statusor.h"

namespace dlbatch::worker {

struct GuardConfig {
  std::string cgroup_root;  // "": the worker makes no cgroups
  std::string mark_prefix;  // kJobMarkVar's value up to the job key
};

// Forks the guard. REQUIRES: this process has no other thread yet. Returns
// the worker's end of the pipe (close-on-exec), to keep open until the
// worker exits.
absl::StatusOr<int> StartJobGuard(const GuardConfig& config);

// Kills every process of the worker's jobs: the cgroups under
// `config.cgroup_root` (removed too) and the processes carrying the mark,
// until none is left or `timeout_ms` passed. Returns how many it killed.
int KillWorkerJobs(const GuardConfig& config, int timeout_ms);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_GUARD_H_
