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
  std::string trainer;     // dlbatch-train, for `train:` jobs
  std::string host;        // address this worker's ranks listen on
  std::string rendezvous;  // the scheduler's address as a job can use it
  bool gpus = false;       // the worker's slots are GPUs
  // The worker's own CUDA_VISIBLE_DEVICES (null: unset).
  const char* visible_devices = nullptr;
};

// Lays out `dir` (emptied first) for `start` and returns how to run it.
// `notes` receives lines for the job's diary. Blocks on transfers.
absl::StatusOr<SubprocessOptions> PrepareJob(const v1::StartJob& start,
                                             const std::string& dir,
                                             const LaunchContext& context,
                                             BlobTransfers* transfers,
                                             std::vector<std::string>* notes);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_LAUNCH_H_
