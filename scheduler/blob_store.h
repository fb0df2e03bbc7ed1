// Content-addressed files under STATE_DIR/blobs: job attachments and job
// outputs, stored once per sha256 however many jobs name them.
//
// A blob becomes visible only complete and verified: bytes go to a temp
// file, are checked against the announced size and sha256, fsynced, and
// renamed into place. A full disk fails the upload with RESOURCE_EXHAUSTED
// and leaves nothing behind. Thread-safe.
#ifndef DLBATCH_SCHEDULER_BLOB_STORE_H_
#define DLBATCH_SCHEDULER_BLOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/files.h"

namespace dlbatch::scheduler {

// True for 64 lowercase hex characters.
bool IsSha256Hex(absl::string_view text);

class BlobStore {
 public:
  // min_free_bytes: an upload that would leave less free space on the
  // store's filesystem is refused before it starts, so the database beside
  // it always has room to record the outcome.
  static absl::StatusOr<std::unique_ptr<BlobStore>> Open(
      const std::string& dir, int64_t min_free_bytes);

  // Size of a stored blob, or NotFound.
  absl::StatusOr<int64_t> Size(const std::string& sha256) const;
  std::string PathFor(const std::string& sha256) const;

  // One upload in progress; destroying it before Commit discards it.
  class Writer {
   public:
    ~Writer();
    absl::Status Append(absl::string_view data);
    // Verifies size and digest, then makes the blob visible.
    absl::Status Commit();
    int64_t written() const { return written_; }

   private:
    friend class BlobStore;
    Writer(const BlobStore* store, std::string sha256, int64_t size, int fd,
           std::string tmp_path);
    const BlobStore* store_;
    std::string sha256_;
    int64_t size_;
    int fd_;
    std::string tmp_path_;
    int64_t written_ = 0;
    Sha256 hash_;
    bool done_ = false;
  };

  absl::StatusOr<std::unique_ptr<Writer>> NewWriter(const std::string& sha256,
                                                    int64_t size) const;

 private:
  BlobStore(std::string dir, int64_t min_free_bytes)
      : dir_(std::move(dir)), min_free_bytes_(min_free_bytes) {}
  std::string dir_;
  int64_t min_free_bytes_;

 public:
  // Deletes a stored blob (a purge found no job holding it); returns the
  // bytes freed, 0 if it was not stored.
  absl::StatusOr<int64_t> Remove(const std::string& sha256) const;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_BLOB_STORE_H_
