// What dlbatch-worker does to and asks of the host before it serves: the
// scheduler's TLS checked, the work folder held, jobs of an earlier run
// killed, the job guard forked, cgroups made; then the Worker's options
// from the settings and what the host has (host name, the trainer beside
// this program, GPUs or cores). Each step logs what it found as the worker
// always has; each error is what dlbatch-worker prints before it exits 1.
#ifndef DLBATCH_WORKER_STARTUP_H_
#define DLBATCH_WORKER_STARTUP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/job_guard.h"
#include "worker/options.h"
#include "worker/worker.h"

namespace dlbatch::worker {

// Connects to a TCP scheduler and does a TLS handshake: a scheduler that is
// reached but not trusted is an error now, one not reachable yet is waited
// for later as always. Skipped for a Slurm job's worker that has the
// scheduler's own CA from the batch script (its start is part of the
// job's start).
absl::Status CheckSchedulerTls(const DaemonOptions& options);

// The host held for this run of the worker.
struct HostSetup {
  std::string work_dir;  // absolute, its jobs/ folder made and empty
  // Marks (this work folder's, then this run's) and, where the worker can
  // make cgroups, the cgroup of this run's jobs.
  GuardConfig guard;
  // The guard forked; EndJobGuard when the worker leaves.
  JobGuard job_guard;
};

// Makes and locks the work folder (another worker on it is an error),
// makes the cgroup root (or logs why jobs run without cgroups), kills
// what jobs of an earlier run on the folder left behind (not for a Slurm
// job's worker: its folder is its own), forks the job guard and empties
// the jobs folder. The lock is held until the process exits.
// REQUIRES: no thread has been started (the guard is a plain fork).
absl::StatusOr<HostSetup> PrepareHost(const DaemonOptions& options);

// The Worker's options: name (host name and a hash of the work folder
// unless --name), host, trainer (warning when it is not executable),
// devices (GPUs found unless --no-gpus or --cpu-slots, else CPU slots) and,
// for a Slurm job's worker, what ApplySlurmJob makes of them.
WorkerOptions MakeWorkerOptions(const DaemonOptions& options,
                                const HostSetup& host);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_STARTUP_H_
