// The worker's file transfers with the scheduler's blob store, behind an
// interface so the worker's core is tested without a scheduler: attachments
// and stored checkpoints fetched into a job's folder, a job's outputs and
// checkpoints uploaded. Every call retries while the scheduler is
// unreachable and gives up with kCancelled once Stop() was called.
#ifndef DLBATCH_WORKER_BLOB_TRANSFERS_H_
#define DLBATCH_WORKER_BLOB_TRANSFERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch::worker {

// Thread-safe: the transfer pool calls it from several threads at once.
class BlobTransfers {
 public:
  virtual ~BlobTransfers() = default;
  // Downloads blob `sha256` of `size` bytes to `dest` (its folder made).
  virtual absl::Status Fetch(const std::string& sha256, int64_t size,
                             const std::string& dest, uint32_t mode) = 0;
  // Uploads one file, named `rel` in the result.
  virtual absl::StatusOr<v1::OutputFile> UploadFile(const std::string& path,
                                                    const std::string& rel) = 0;
  // Uploads a job's output folder as output_files.h reads it (symlinks kept
  // as their target, never followed; hard links stored once), named
  // relative to it, in path order. `max_bytes` > 0: a folder holding more
  // is refused before any byte is read, saying how much it holds. `notes`
  // receives lines for the job's diary (entries skipped and why).
  virtual absl::StatusOr<std::vector<v1::OutputFile>> UploadOutputs(
      const std::string& output_dir, int64_t max_bytes,
      std::vector<std::string>* notes) = 0;
  // Transfers in progress and later ones give up with kCancelled.
  virtual void Stop() = 0;
};

// The real transfers over the Scheduler service's blob calls.
std::unique_ptr<BlobTransfers> MakeGrpcBlobTransfers(
    std::shared_ptr<grpc::Channel> channel, std::string token);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_BLOB_TRANSFERS_H_
