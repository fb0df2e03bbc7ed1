// The folder fetch-outputs writes a job's outputs into, and nowhere else.
// Output paths and symlink targets come from the job, which is untrusted:
// every path is checked, folders are made and entered one component at a
// time with O_NOFOLLOW (so no write goes through a symlink, whoever made
// it), and a symlink is recreated only where it points inside the folder.
#ifndef DLBATCH_CLIENT_OUTPUTS_DIR_H_
#define DLBATCH_CLIENT_OUTPUTS_DIR_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/files.h"

namespace dlbatch::client {

// OK for a relative '/'-separated path without empty, "." or ".."
// components; else INVALID_ARGUMENT saying why.
absl::Status CheckOutputPath(const std::string& path);

// OK where a symlink at `path` (checked already) with text `target` resolves
// inside the outputs folder, whatever the other links there point at: the
// target is relative, its ".." components all lead, and they climb no
// higher than the folder. Else INVALID_ARGUMENT saying why.
absl::Status CheckSymlinkTarget(const std::string& path,
                                const std::string& target);

class OutputsDir {
 public:
  // Makes `target` (mkdir -p) and opens it.
  static absl::StatusOr<OutputsDir> Open(const std::string& target);

  // The folder that holds `path` (made as needed, never through a
  // symlink), open, and the last component of `path`.
  absl::StatusOr<std::pair<UniqueFd, std::string>> ParentOf(
      const std::string& path) const;

  // Makes the symlink `path` -> `target` (both checked already), replacing
  // what was at `path`.
  absl::Status MakeSymlink(const std::string& path,
                           const std::string& target) const;

 private:
  explicit OutputsDir(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_OUTPUTS_DIR_H_
