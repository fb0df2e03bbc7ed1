// Moving files to and from the scheduler's blob store, chunked and
// checksummed. Used by the CLI (attachments up, outputs down) and by the
// worker (attachments down, outputs up).
//
// An upload reads its file once: the first chunk announces the size (the
// scheduler refuses it there, before any byte is stored, where it lacks
// room), both ends hash the bytes as they pass, and the scheduler's sha256
// (in BlobRef) must equal the sender's. Where the sender knows the sha256
// already it names it in the first chunk, and a blob the store holds is not
// sent again.
#ifndef DLBATCH_COMMON_BLOB_TRANSFER_H_
#define DLBATCH_COMMON_BLOB_TRANSFER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch {

// Bytes of file data per BlobChunk: well under the 64 MiB message limit of
// MakeChannel and of the scheduler, large enough that per-message costs
// vanish beside copying and hashing.
inline constexpr size_t kBlobChunkBytes = 4 << 20;

// Called with bytes done so far and the total.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct LocalBlob {
  std::string sha256;
  int64_t size = 0;
};

// Uploads the first `size` bytes of the regular file open at `fd`, read once
// with pread from offset 0 (the fd's offset is untouched, so a retry may
// call again). A file shorter than `size` fails the upload; bytes past
// `size` are not sent. `what` names the file in messages. Errors:
// RESOURCE_EXHAUSTED where the store has no room (said before any byte is
// stored), DATA_LOSS where the two ends' sha256 differ, else the RPC's.
absl::StatusOr<LocalBlob> UploadFd(v1::Scheduler::StubInterface* stub,
                                   const std::string& token, int fd,
                                   int64_t size, const std::string& what,
                                   const ProgressFn& progress = nullptr);

// As UploadFd for a file whose sha256 is known: nothing is sent where the
// store holds that blob already, and the bytes sent must hash to `sha256`.
absl::StatusOr<LocalBlob> UploadFdKnown(v1::Scheduler::StubInterface* stub,
                                        const std::string& token, int fd,
                                        int64_t size, const std::string& sha256,
                                        const std::string& what,
                                        const ProgressFn& progress = nullptr);

enum class UploadMode {
  // Hash the file first and send it only where the store lacks it: two
  // reads, but bytes many jobs share (a data set) cross the wire once.
  kHashFirst,
  // Send it as it is read: one read (outputs, checkpoints).
  kReadOnce,
};

// Opens `path` (symlinks followed) without blocking and uploads it. Anything
// but a regular file (a FIFO, a socket, a device) is refused with
// FAILED_PRECONDITION naming the path, before any byte is read.
absl::StatusOr<LocalBlob> UploadFile(v1::Scheduler::StubInterface* stub,
                                     const std::string& token,
                                     const std::string& path,
                                     const ProgressFn& progress = nullptr,
                                     UploadMode mode = UploadMode::kHashFirst);

// Downloads blob `sha256` to `path` (via PATH.part, fsynced and renamed once
// the bytes hash to `sha256`). A mismatch is DATA_LOSS and leaves nothing at
// `path`. `mode` 0 means 0644.
absl::Status DownloadFile(v1::Scheduler::StubInterface* stub,
                          const std::string& token, const std::string& sha256,
                          int64_t size, const std::string& path, uint32_t mode,
                          const ProgressFn& progress = nullptr);

// As DownloadFile into the folder open at `dir_fd` under `name` (one path
// component): NAME.part and NAME are made with openat/renameat and never
// followed if they are symlinks. `what` names the file in messages.
absl::Status DownloadFileAt(v1::Scheduler::StubInterface* stub,
                            const std::string& token, const std::string& sha256,
                            int64_t size, int dir_fd, const std::string& name,
                            uint32_t mode, const std::string& what,
                            const ProgressFn& progress = nullptr);

// What ResumeDownloadAt did; filled in when it fails too.
struct DownloadReport {
  int64_t kept = 0;       // bytes of an earlier NAME.part the file kept
  int64_t received = 0;   // bytes that came from the scheduler
  int64_t discarded = 0;  // bytes of an earlier NAME.part that failed the
                          // sha256: the file was fetched again from 0
};

// As DownloadFileAt, going on from an earlier download of the same blob
// into NAME.part that was interrupted: where NAME.part is a regular file
// of at least `offset` bytes (`offset` <= `size`), its first `offset` are
// kept (any more cut off), hashed first, and the scheduler sends the rest
// from there (DownloadBlobRequest.offset); else the file comes from 0. The
// whole file's sha256 is checked: where it does not match with bytes kept,
// the file is fetched again from 0 (`discarded` says so), never kept wrong.
// Unlike DownloadFileAt, a download cut off by the link or the scheduler
// (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED) leaves NAME.part for the
// next call to go on from; other failures remove it. `progress` gets the
// bytes this call received and the bytes it expects to receive.
absl::Status ResumeDownloadAt(v1::Scheduler::StubInterface* stub,
                              const std::string& token,
                              const std::string& sha256, int64_t size,
                              int dir_fd, const std::string& name,
                              uint32_t mode, int64_t offset,
                              const std::string& what, DownloadReport* report,
                              const ProgressFn& progress = nullptr);

// Lowercase hex sha256 of the first `size` bytes of `fd`, read with pread
// from 0. FAILED_PRECONDITION where the file is shorter.
absl::StatusOr<std::string> Sha256Fd(int fd, int64_t size,
                                     const std::string& what);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_BLOB_TRANSFER_H_
