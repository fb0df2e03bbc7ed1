// Content-addressed files under STATE_DIR/blobs: job attachments and job
// outputs, stored once per sha256 however many jobs name them.
//
// A blob becomes visible only complete and verified: bytes go to a temp
// file, are checked against the announced size (and sha256, where the
// sender named one), fsynced, and renamed into place. An upload's size is
// checked against free space before its first byte, counting the space
// promised to uploads still in flight; a full disk fails the upload with
// RESOURCE_EXHAUSTED and leaves nothing behind. The folder is 0700 and the
// blobs 0600 whatever the umask or an older folder's mode. Thread-safe.
#ifndef DLBATCH_SCHEDULER_STORE_BLOB_STORE_H_
#define DLBATCH_SCHEDULER_STORE_BLOB_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/hashing_file_writer.h"

namespace dlbatch::scheduler {

// True for 64 lowercase hex characters.
bool IsSha256Hex(absl::string_view text);

// Free bytes for unprivileged writers on the filesystem holding `dir`
// (statvfs's f_bavail).
absl::StatusOr<int64_t> FreeBytesIn(const std::string& dir);

// Free bytes on the filesystem holding the store (statvfs's f_bavail).
using FreeSpaceFn = std::function<absl::StatusOr<int64_t>()>;

class BlobStore {
 public:
  // min_free_bytes: an upload that would leave less free space on the
  // store's filesystem is refused before it starts, so the database beside
  // it always has room to record the outcome.
  static absl::StatusOr<std::unique_ptr<BlobStore>> Open(
      const std::string& dir, int64_t min_free_bytes);
  // As above, free space read from `free_space` (tests).
  static absl::StatusOr<std::unique_ptr<BlobStore>> Open(
      const std::string& dir, int64_t min_free_bytes, FreeSpaceFn free_space);

  // Size of a stored blob, or NotFound.
  absl::StatusOr<int64_t> Size(const std::string& sha256) const;
  std::string PathFor(const std::string& sha256) const;
  // A folder on the store's filesystem for files in the making; emptied
  // when the store opens.
  std::string temp_dir() const { return dir_ + "/tmp"; }
  // The free space kept beside uploads (Open's min_free_bytes).
  int64_t min_free_bytes() const { return min_free_bytes_; }
  // Bytes promised to uploads in flight and not yet written.
  int64_t reserved_bytes() const;
  // Bytes of the blobs stored (counted at Open, kept since); lock-free.
  int64_t stored_bytes() const { return stored_bytes_.load(); }

  // One upload in progress; destroying it before Commit discards it and
  // gives back its reservation. Not thread-safe itself. A large blob is
  // written past the page cache (HashingFileWriter); bytes staged for it
  // count as written for the free-space reservation (at most 8 MiB early).
  class Writer {
   public:
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;
    absl::Status Append(absl::string_view data);
    // Verifies size (and the announced digest), then makes the blob
    // visible; a blob stored already under that digest is kept as it is.
    absl::Status Commit();
    int64_t written() const { return file_.appended(); }
    // The bytes' sha256; set by a successful Commit.
    const std::string& sha256() const { return digest_; }
    // Whether the bytes bypass the page cache (tests).
    bool direct() const { return file_.direct(); }

   private:
    friend class BlobStore;
    Writer(BlobStore* store, std::string sha256, int64_t size, int fd,
           std::string tmp_path);
    absl::Status FullOrError(int err, absl::string_view what) const;

    BlobStore* store_;
    std::string announced_;  // may be empty: the digest is learnt
    int64_t size_;
    UniqueFd fd_;
    std::string tmp_path_;
    HashingFileWriter file_;  // declared after fd_: gone before it closes
    std::string digest_;
    bool done_ = false;
  };

  // Starts an upload of `size` bytes. `sha256` empty: the digest is
  // computed from the bytes. Refused with RESOURCE_EXHAUSTED, naming the
  // size and what is free, where the bytes would not fit beside those
  // promised to other uploads and the reserve; else the size is reserved
  // until the writer is done.
  absl::StatusOr<std::unique_ptr<Writer>> NewWriter(const std::string& sha256,
                                                    int64_t size);

 private:
  BlobStore(std::string dir, int64_t min_free_bytes, FreeSpaceFn free_space)
      : dir_(std::move(dir)),
        min_free_bytes_(min_free_bytes),
        free_space_(std::move(free_space)) {}
  void Release(int64_t bytes);

  const std::string dir_;
  const int64_t min_free_bytes_;
  const FreeSpaceFn free_space_;
  mutable absl::Mutex mu_;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<int64_t> stored_bytes_{0};

 public:
  // Deletes a stored blob (a purge found no job holding it); returns the
  // bytes freed, 0 if it was not stored.
  absl::StatusOr<int64_t> Remove(const std::string& sha256) const;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_BLOB_STORE_H_
