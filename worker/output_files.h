// A job's output folder, read the way untrusted files must be: from a
// directory fd down, every name opened with O_NOFOLLOW (and O_NONBLOCK, so
// a FIFO swapped in never blocks), never through a path the job could
// replace by a symlink meanwhile.
//
//   - a regular file is stored by content; hard links of one inode are
//     uploaded once and listed under every path;
//   - a symlink is stored as its target, kept as text and never followed
//     (OutputFile.symlink, size 0, no sha256);
//   - FIFOs, sockets and devices are skipped, with a line for the diary;
//   - the total size (each inode once; a sparse file counts its length) is
//     checked against the job's quota before any byte is read.
#ifndef DLBATCH_WORKER_OUTPUT_FILES_H_
#define DLBATCH_WORKER_OUTPUT_FILES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/blob_transfer.h"
#include "common/files.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch::worker {

struct OutputEntry {
  enum class Kind { kFile, kSymlink };
  Kind kind = Kind::kFile;
  // Relative to the output folder, '/'-separated, sorted. kFile: one path
  // per hard link of the inode (the first names it in messages).
  std::vector<std::string> paths;
  int64_t size = 0;    // kFile: bytes when scanned
  uint32_t mode = 0;   // kFile: permission bits
  std::string target;  // kSymlink: the link's text
  // kFile: which inode the scan saw; OpenFile insists on the same one.
  uint64_t dev = 0;
  uint64_t ino = 0;
};

class OutputScan {
 public:
  std::vector<OutputEntry> entries;  // in path order
  // One line per entry left out (a FIFO, a socket, a device, a name that is
  // not UTF-8, a folder nested too deep), for the job's diary.
  std::vector<std::string> skipped;
  int64_t total_bytes = 0;  // regular files, each inode once
  int files = 0;            // regular files, each inode once

  // Opens a kFile entry read-only, walking its path from the output folder
  // one component at a time with O_NOFOLLOW. FAILED_PRECONDITION where the
  // path now leads elsewhere than the inode scanned (a job process swapped
  // it), or to something not a regular file.
  absl::StatusOr<UniqueFd> OpenFile(const OutputEntry& entry) const;

 private:
  friend absl::StatusOr<OutputScan> ScanOutputs(const std::string&, int64_t);
  UniqueFd root_;
};

// Walks the output folder `dir` (a missing folder holds nothing).
// max_output_bytes > 0: a larger total is RESOURCE_EXHAUSTED, naming the
// size and the limit, returned as soon as the walk passes the limit.
absl::StatusOr<OutputScan> ScanOutputs(const std::string& dir,
                                       int64_t max_output_bytes);

// Uploads one open regular file of `size` bytes (a retry may call again:
// read it with pread); `what` names it in messages.
using UploadOutputFn = std::function<absl::StatusOr<LocalBlob>(
    int fd, int64_t size, const std::string& what)>;

// Stores every entry of `scan`: each inode uploaded once through `upload`,
// every path listed; symlinks listed with their target. The first failure
// ends it, annotated with the output's path.
absl::StatusOr<std::vector<v1::OutputFile>> StoreOutputs(
    const OutputScan& scan, const UploadOutputFn& upload);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_OUTPUT_FILES_H_
