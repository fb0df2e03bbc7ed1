// Making a job ready to run: its working folder, its attachments (and a
// train job's stored checkpoint) fetched into it, and the command line and
// environment its processes get.
#ifndef DLBATCH_WORKER_JOB_LAUNCH_H_
#define DLBATCH_WORKER_JOB_LAUNCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "worker/blob_transfers.h"
#include "worker/subprocess.h"

namespace dlbatch::worker {

struct LaunchContext {
  std::string trainer;  // dlbatch-train, for `train:` jobs
  // The `dlbatch` Python module's folder, put on a command job's
  // PYTHONPATH ("": none).
  std::string python_dir;
  std::string host;        // address this worker's ranks listen on
  std::string rendezvous;  // the scheduler's address as a job can use it
  bool gpus = false;       // the worker's slots are GPUs
  // The worker's own CUDA_VISIBLE_DEVICES (null: unset).
  const char* visible_devices = nullptr;
  // A job starts from a clean environment: of the worker's own variables
  // only these (kJobBaseEnv and the operator's --job-env), then the ones the
  // worker sets for the job, then the job's env:. The worker's token and
  // secrets never reach a job.
  std::vector<std::string> keep_env;
  // The worker runs as root: each job runs as its owner (the StartJob's
  // user, looked up on this machine), in a folder that user owns; a job of
  // root's may not set the loader's or a shell's start-up variables
  // (LD_*, BASH_ENV, ENV) in env:. Otherwise every job runs as the
  // worker's user, and only that user's jobs are run.
  bool as_owner = false;
  std::string worker_user;  // the worker's own user name
  std::string worker_name;  // for messages
  // TCP: the CA (PEM) the scheduler's certificate chains to, for train
  // jobs' rendezvous.
  std::string rendezvous_ca;
  // A Slurm job's worker: Slurm sends SIGTERM to the job's processes too
  // (its preemption, scancel, its time limit), which the trainer takes as a
  // checkpoint-and-stop (TrainLaunch::stop_on_term), not a stop at once.
  bool trainer_stop_on_term = false;
};

// What every job inherits from the worker's environment.
inline const char* const kJobBaseEnv[] = {"PATH", "HOME", "USER", "LOGNAME",
                                          "LANG"};

// Lays out `dir` (emptied first) for `start` and returns how to run it.
// `notes` receives lines for the job's diary. Blocks on transfers.
absl::StatusOr<SubprocessOptions> PrepareJob(const v1::StartJob& start,
                                             const std::string& dir,
                                             const LaunchContext& context,
                                             BlobTransfers* transfers,
                                             std::vector<std::string>* notes);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_LAUNCH_H_
