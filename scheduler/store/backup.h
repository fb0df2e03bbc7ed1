// A consistent copy of the scheduler's state, taken while it runs (`dlbatch
// admin backup`): the database through SQLite's online backup API, the
// stored files that the copy's jobs hold, and the state folder's keys
// (token, TLS CA and server certificate). They are staged in a folder of
// their own (hard links for stored files: a blob is never rewritten in
// place, so a link is a snapshot of it that a later purge cannot take
// away) and sent as one tar archive. Restoring is extracting the archive
// into an empty state folder and starting a scheduler on it.
//
// Consistency: the database copy is one read transaction; its blobs are
// linked before anything may delete them (the caller holds off purges
// while Stage runs, the only path that removes stored files).
#ifndef DLBATCH_SCHEDULER_STORE_BACKUP_H_
#define DLBATCH_SCHEDULER_STORE_BACKUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/store/blob_store.h"

namespace dlbatch::scheduler {

// One member of the archive.
struct BackupEntry {
  std::string name;  // its path in the archive ("blobs/ab/ab12…"); a
                     // folder's ends in '/'
  std::string path;  // the staged file; empty for a folder
  int64_t size = 0;
  uint32_t mode = 0600;
  int64_t mtime = 0;  // seconds
};

class StagedBackup {
 public:
  // Copies the database at `db_path` into `staging_dir` (made here; it must
  // not exist yet), links each blob the copy's jobs hold from `blobs`, and
  // copies the key files of `state_dir`. Refused with RESOURCE_EXHAUSTED
  // naming both sizes where the filesystem lacks room for the database's
  // copy beside `reserve_bytes`. A blob the copy names but the store lacks
  // is left out and counted (missing_blobs).
  static absl::StatusOr<std::unique_ptr<StagedBackup>> Stage(
      const std::string& state_dir, const std::string& db_path,
      const BlobStore& blobs, const std::string& staging_dir,
      int64_t reserve_bytes);
  // Removes the staging folder.
  ~StagedBackup();
  StagedBackup(const StagedBackup&) = delete;
  StagedBackup& operator=(const StagedBackup&) = delete;

  int64_t jobs() const { return jobs_; }
  int64_t blobs() const { return blobs_; }
  int64_t missing_blobs() const { return missing_blobs_; }
  const std::vector<BackupEntry>& entries() const { return entries_; }
  // The archive's length in bytes: what Send hands over in all.
  int64_t archive_bytes() const;

  // Hands the archive to `send` in pieces of at most `piece_bytes` (a
  // multiple of 512); `send` returning false stops it (CANCELLED).
  absl::Status Send(const std::function<bool(absl::string_view)>& send,
                    size_t piece_bytes) const;

 private:
  explicit StagedBackup(std::string staging_dir)
      : staging_dir_(std::move(staging_dir)) {}
  absl::Status CopyDatabase(const std::string& db_path);
  absl::Status LinkBlobs(const BlobStore& blobs);
  absl::Status CopyKeys(const std::string& state_dir);

  const std::string staging_dir_;
  std::vector<BackupEntry> entries_;
  std::vector<std::string> held_;  // sha256s the copy's jobs hold, sorted
  int64_t jobs_ = 0;
  int64_t blobs_ = 0;
  int64_t missing_blobs_ = 0;
};

// The 512-byte POSIX ustar header of one member (a regular file, or a
// folder when the name ends in '/'). Sizes past ustar's 8 GiB are written
// in the base-256 form GNU tar and bsdtar read. InvalidArgument for a name
// that does not fit ustar's 100 + 155 bytes.
absl::StatusOr<std::string> TarHeader(const BackupEntry& entry, uint32_t uid,
                                      uint32_t gid, absl::string_view owner,
                                      absl::string_view group);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_BACKUP_H_
