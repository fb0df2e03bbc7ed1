// The folder fetch-outputs writes a job's outputs into, and nowhere else.
// Output paths and symlink targets come from the job, which is untrusted:
// every path is checked, folders are made and entered one component at a
// time with O_NOFOLLOW (so no write goes through a symlink, whoever made
// it), and a symlink is recreated only where it points inside the folder.
#ifndef DLBATCH_CLIENT_OUTPUTS_DIR_H_
#define DLBATCH_CLIENT_OUTPUTS_DIR_H_

#include <cstdint>
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

// What an output's place in the target folder holds before it is fetched:
// InspectOutput looks; tests build it by hand.
struct FoundOutput {
  enum class Kind {
    kAbsent,
    kFile,   // a regular file
    kOther,  // a folder, a symlink, a FIFO, ...
  };
  Kind file = Kind::kAbsent;  // NAME
  int64_t file_size = 0;
  // Whether NAME's bytes hash to the output's sha256. Only a regular file
  // of the output's size is hashed; false for any other.
  bool file_matches = false;
  Kind part = Kind::kAbsent;  // NAME.part, left by an interrupted fetch
  int64_t part_size = 0;
};

struct FetchStep {
  enum class Action {
    kSkip,    // NAME is the output already: not fetched
    kResume,  // NAME.part's first `offset` bytes are kept, the rest fetched
    kFetch,   // fetched from byte 0
  };
  Action action = Action::kFetch;
  int64_t offset = 0;  // kResume: bytes of NAME.part to keep (<= size)
  // kResume or kFetch: NAME is there with other bytes, which are replaced.
  bool replaces = false;
  // kSkip: a NAME.part is there too, stale; it is removed.
  bool remove_part = false;
};

// What fetch-outputs does with an output of `size` bytes given what is at
// its place: a regular NAME of that size and sha256 is kept; else a
// regular NAME.part of 1..size bytes is gone on from (its bytes are checked
// with the whole file's sha256 at the end); else the output comes from 0
// (a part longer than the output, or not a regular file, is replaced).
FetchStep PlanFetch(const FoundOutput& found, int64_t size);

// Looks at NAME and NAME.part in the folder open at `dir_fd`, never
// following a symlink; hashes NAME where it is a regular file of `size`
// bytes, to compare with `sha256`. Errors: a NAME that cannot be read.
absl::StatusOr<FoundOutput> InspectOutput(int dir_fd, const std::string& name,
                                          int64_t size,
                                          const std::string& sha256);

// The kind and size of NAME.part alone, for a fetch that goes on after a
// lost connection.
void InspectPart(int dir_fd, const std::string& name, FoundOutput* found);

// What one fetch-outputs did, for its summary line.
struct FetchTally {
  int files = 0;  // regular files among the outputs
  int fetched = 0;
  int64_t fetched_bytes = 0;  // received for them
  int resumed = 0;
  int64_t resumed_at = 0;     // bytes of their parts kept, all together
  int64_t resumed_bytes = 0;  // received for them
  int skipped = 0;            // already here
  int links = 0;              // symlinks made
  int not_fetched = 0;        // refused or failed, each said on stderr
};

// "2 files: 1 fetched (64.0 MB), 1 resumed at 21.0 MB (43.0 MB received),
// 0 skipped; sha256 verified".
std::string FetchSummary(const FetchTally& tally);

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
