// Moving files to and from the scheduler's blob store, chunked and
// checksummed. Used by the CLI (attachments up, outputs down) and by the
// worker (attachments down, outputs up).
#ifndef DLBATCH_COMMON_BLOB_TRANSFER_H_
#define DLBATCH_COMMON_BLOB_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch {

// Called with bytes done so far and the total.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct LocalBlob {
  std::string sha256;
  int64_t size = 0;
};

// Hashes `path`, and uploads it unless the store has it already.
absl::StatusOr<LocalBlob> UploadFile(v1::Scheduler::StubInterface* stub,
                                     const std::string& token,
                                     const std::string& path,
                                     const ProgressFn& progress = nullptr);

// Downloads blob `sha256` to `path` (via PATH.part, renamed once the bytes
// hash to `sha256`). A mismatch is DATA_LOSS and leaves nothing at `path`.
absl::Status DownloadFile(v1::Scheduler::StubInterface* stub,
                          const std::string& token, const std::string& sha256,
                          int64_t size, const std::string& path, uint32_t mode,
                          const ProgressFn& progress = nullptr);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_BLOB_TRANSFER_H_
