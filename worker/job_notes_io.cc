#include "worker/job_notes_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "worker/command_progress.h"

namespace dlbatch::worker {
namespace {

// Creates `name` under the directory `dir_fd` with `content`. EEXIST (the
// name is taken, by a file or a link) is returned as is.
absl::Status CreateAt(int dir_fd, const std::string& name,
                      const std::string& content, const std::string& shown) {
  UniqueFd fd(::openat(dir_fd, name.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       0644));
  if (fd.get() < 0) return ErrnoStatus(errno, "create", shown);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd.get(), content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "write", shown);
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> OpenDir(const std::string& path) {
  UniqueFd fd(
      ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  return fd;
}

}  // namespace

absl::Status WriteStopFile(const std::string& path, const std::string& why) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return absl::InvalidArgumentError("stop file path without a folder");
  absl::StatusOr<UniqueFd> dir = OpenDir(path.substr(0, slash));
  if (!dir.ok()) return dir.status();
  absl::Status s =
      CreateAt(dir->get(), path.substr(slash + 1), why + "\n", path);
  if (!s.ok() && absl::IsAlreadyExists(s)) return absl::OkStatus();
  return s;
}

absl::Status WriteHistoryFiles(const std::string& output_dir,
                               const trainer::TrainingHistory& history,
                               const std::string& title) {
  std::vector<HistoryFile> files = HistoryFiles(history, title);
  if (files.empty()) return absl::OkStatus();
  absl::StatusOr<UniqueFd> dir = OpenDir(output_dir);
  if (!dir.ok()) return dir.status();
  for (const HistoryFile& f : files) {
    absl::Status s = CreateAt(dir->get(), f.name, f.content,
                              absl::StrCat(output_dir, "/", f.name));
    // The job's own file of that name wins.
    if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::worker
