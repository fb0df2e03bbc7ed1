// Writes a file front to back while hashing it, as blob uploads (in the
// scheduler) and downloads (in the CLI and the worker) do.
//
// A file opened by OpenForSequentialWrite with O_DIRECT (large files, on a
// filesystem that takes it) is written past the page cache: the bytes are
// copied into one of two aligned staging buffers, and a full buffer is
// written and hashed on a helper thread while the caller fills the other;
// the unaligned tail goes through the cache at Finish. The page-cache copy
// of a buffered write was about half the scheduler's CPU in an upload.
// Other files are written as they come, hashed beside the write, with
// writeback started every 16 MiB so that a final fsync waits for the last
// stretch only.
#ifndef DLBATCH_COMMON_HASHING_FILE_WRITER_H_
#define DLBATCH_COMMON_HASHING_FILE_WRITER_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/background_sha256.h"
#include "common/helper_thread.h"

namespace dlbatch {

// Files from this size up are opened with O_DIRECT where allowed.
inline constexpr int64_t kDirectWriteMinBytes = 8 << 20;

// openat(dir_fd, path, flags, mode), adding O_DIRECT when `size` is at
// least kDirectWriteMinBytes and the filesystem takes it. -1 and errno as
// openat's.
int OpenForSequentialWrite(int dir_fd, const std::string& path, int flags,
                           unsigned mode, int64_t size);

// Not thread-safe itself: one owner calls it.
class HashingFileWriter {
 public:
  // What a failed write becomes (errno in, the status to return).
  using ErrorFn = std::function<absl::Status(int err)>;
  // `fd` is borrowed, open for writing, and must outlive the writer. The
  // bytes appended go from offset `start` on; the file's first `start`
  // bytes (kept from an interrupted download) are hashed first, handed to
  // HashKept. A `start` that is not block-aligned writes through the page
  // cache.
  HashingFileWriter(int fd, ErrorFn error, int64_t start = 0);
  ~HashingFileWriter();  // waits for a write in flight
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  // Hashes `data`, the next of the `start` bytes the file holds already,
  // without writing it. REQUIRES: called before the first Append, with
  // the file's bytes [0, start) in order. `data` may be reused once this
  // returns.
  void HashKept(absl::string_view data);
  // `data` may be reused once this returns. An error is final.
  absl::Status Append(absl::string_view data);
  // Writes what is staged; every byte is then in the file (not yet
  // fsynced).
  absl::Status Finish();
  // The sha256 of everything appended; after Finish, once.
  std::string HexDigest() { return hash_.HexDigest(); }
  // Bytes appended so far (not counting `start`).
  int64_t appended() const { return appended_; }
  // Whether the writes bypass the page cache (tests).
  bool direct() const { return direct_; }

 private:
  struct FreeBuffer {
    void operator()(char* p) const { std::free(p); }
  };
  absl::Status AppendBuffered(absl::string_view data);
  absl::Status AppendStaged(absl::string_view data);
  absl::Status FlushStage();
  absl::Status WaitFlush();
  // Writes and hashes data[0, len) at `offset`.
  absl::Status WriteAt(const char* data, size_t len, int64_t offset);
  void StopDirect();

  const int fd_;
  const ErrorFn error_;
  int64_t appended_ = 0;
  int64_t flushed_ = 0;  // buffered: bytes handed to writeback so far
  bool direct_ = false;
  std::unique_ptr<char, FreeBuffer> stage_[2];
  int current_ = 0;          // the staging buffer being filled
  size_t fill_ = 0;          // bytes in it
  int64_t file_offset_ = 0;  // where the next write goes (start included)
  BackgroundSha256 hash_;
  absl::Status flush_status_;  // the other buffer's write; set by flusher_
  HelperThread flusher_;       // last: its task uses the members above
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_HASHING_FILE_WRITER_H_
