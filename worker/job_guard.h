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

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace dlbatch::worker {

struct GuardConfig {
  std::string cgroup_root;  // "": the worker makes no cgroups
  std::string mark_prefix;  // kJobMarkVar's value up to the job key
};

// The worker's hold on its guard.
struct JobGuard {
  int fd = -1;    // the worker's end of the pipe (close-on-exec)
  pid_t pid = 0;  // the guard, a child of the worker
};

// Forks the guard. REQUIRES: this process has no other thread yet. Keep
// the returned pipe end open until the worker exits (or EndJobGuard).
absl::StatusOr<JobGuard> StartJobGuard(const GuardConfig& config);

// A worker leaving on its own, its jobs stopped: closes the pipe and waits
// up to `timeout_ms` for the guard's last sweep to finish, so that the
// worker exits after its guard and no service manager finds the guard
// still running once the worker's main process has gone. Returns whether
// the guard has gone.
bool EndJobGuard(JobGuard* guard, int timeout_ms);

// Kills every process of the worker's jobs: the cgroups under
// `config.cgroup_root` (removed too) and the processes carrying the mark,
// until none is left or `timeout_ms` passed. Returns how many it killed.
int KillWorkerJobs(const GuardConfig& config, int timeout_ms);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_GUARD_H_
