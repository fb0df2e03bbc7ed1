#include "client/outputs_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/blob_transfer.h"
#include "common/status.h"

namespace dlbatch::client {
namespace {

std::vector<std::string> Split(const std::string& path) {
  return absl::StrSplit(path, '/');
}

// Kind and size of `name` in `dir_fd`, not following a symlink.
FoundOutput::Kind KindOf(int dir_fd, const std::string& name, int64_t* size) {
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return FoundOutput::Kind::kAbsent;
  }
  *size = static_cast<int64_t>(st.st_size);
  return S_ISREG(st.st_mode) ? FoundOutput::Kind::kFile
                             : FoundOutput::Kind::kOther;
}

}  // namespace

FetchStep PlanFetch(const FoundOutput& found, int64_t size) {
  using Kind = FoundOutput::Kind;
  FetchStep step;
  if (found.file == Kind::kFile && found.file_size == size &&
      found.file_matches) {
    step.action = FetchStep::Action::kSkip;
    step.remove_part = found.part != Kind::kAbsent;
    return step;
  }
  step.replaces = found.file != Kind::kAbsent;
  if (found.part == Kind::kFile && found.part_size > 0 &&
      found.part_size <= size) {
    step.action = FetchStep::Action::kResume;
    step.offset = found.part_size;
  }
  return step;
}

std::string FetchSummary(const FetchTally& t) {
  std::string out = absl::StrCat(
      t.files, t.files == 1 ? " file" : " files", ": ", t.fetched, " fetched (",
      HumanBytes(t.fetched_bytes), "), ", t.resumed, " resumed");
  if (t.resumed == 1) {
    absl::StrAppend(&out, " at ", HumanBytes(t.resumed_at), " (",
                    HumanBytes(t.resumed_bytes), " received)");
  } else if (t.resumed > 1) {
    absl::StrAppend(&out, " (", HumanBytes(t.resumed_at), " kept, ",
                    HumanBytes(t.resumed_bytes), " received)");
  }
  absl::StrAppend(&out, ", ", t.skipped, " skipped");
  if (t.links > 0) {
    absl::StrAppend(&out, "; ", t.links, t.links == 1 ? " link" : " links");
  }
  if (t.not_fetched > 0) {
    absl::StrAppend(&out, "; ", t.not_fetched, " not fetched (see below)");
  }
  absl::StrAppend(&out, "; sha256 verified");
  return out;
}

absl::StatusOr<FoundOutput> InspectOutput(int dir_fd, const std::string& name,
                                          int64_t size,
                                          const std::string& sha256) {
  FoundOutput found;
  found.file = KindOf(dir_fd, name, &found.file_size);
  if (found.file == FoundOutput::Kind::kFile && found.file_size == size) {
    // O_NONBLOCK: a FIFO swapped in since the stat must not block the open.
    UniqueFd fd(::openat(dir_fd, name.c_str(),
                         O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(errno, "open", name);
    struct stat st;
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_size == size) {
      ASSIGN_OR_RETURN(std::string got, Sha256Fd(fd.get(), size, name));
      found.file_matches = got == sha256;
    }
  }
  InspectPart(dir_fd, name, &found);
  return found;
}

void InspectPart(int dir_fd, const std::string& name, FoundOutput* found) {
  found->part_size = 0;
  found->part = KindOf(dir_fd, name + ".part", &found->part_size);
}

absl::Status CheckOutputPath(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the path is empty");
  if (path.find('\0') != std::string::npos)
    return absl::InvalidArgumentError("the path holds a NUL byte");
  if (path[0] == '/') return absl::InvalidArgumentError("the path is absolute");
  for (const std::string& part : Split(path)) {
    if (part.empty() || part == ".") {
      return absl::InvalidArgumentError(
          "the path has an empty or '.' component");
    }
    if (part == "..") {
      return absl::InvalidArgumentError("the path climbs out with '..'");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSymlinkTarget(const std::string& path,
                                const std::string& target) {
  if (target.empty() || target.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("its target is empty");
  }
  if (target[0] == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "it points outside the outputs, to the absolute path ", target));
  }
  // Folders above the link, inside the outputs.
  const int depth = static_cast<int>(Split(path).size()) - 1;
  int up = 0;
  bool down = false;
  for (const std::string& part : Split(target)) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      // A ".." after a name is resolved from wherever that name leads (a
      // symlink's target), not from the name's folder: refused rather than
      // guessed at.
      if (down) {
        return absl::InvalidArgumentError(
            absl::StrCat("its target ", target,
                         " has '..' after a name; only leading "
                         "'..' can be checked to stay inside"));
      }
      if (++up > depth) {
        return absl::InvalidArgumentError(
            absl::StrCat("it points outside the outputs (", target, ")"));
      }
    } else {
      down = true;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OutputsDir> OutputsDir::Open(const std::string& target) {
  RETURN_IF_ERROR(MakeDirs(target, 0755));
  UniqueFd fd(::open(target.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open", target);
  return OutputsDir(std::move(fd));
}

absl::StatusOr<std::pair<UniqueFd, std::string>> OutputsDir::ParentOf(
    const std::string& path) const {
  std::vector<std::string> parts = Split(path);
  UniqueFd dir(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!dir.valid()) return ErrnoStatus(errno, "dup", path);
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = walked.empty() ? parts[i] : absl::StrCat(walked, "/", parts[i]);
    if (::mkdirat(dir.get(), parts[i].c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "mkdir", walked);
    }
    UniqueFd next(::openat(dir.get(), parts[i].c_str(),
                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) {
      if (errno == ELOOP || errno == ENOTDIR) {
        return absl::FailedPreconditionError(
            absl::StrCat(walked,
                         " is a symlink or a file, not a folder; nothing is "
                         "written through it"));
      }
      return ErrnoStatus(errno, "open", walked);
    }
    dir = std::move(next);
  }
  return std::make_pair(std::move(dir), parts.back());
}

absl::Status OutputsDir::MakeSymlink(const std::string& path,
                                     const std::string& target) const {
  ASSIGN_OR_RETURN(auto parent, ParentOf(path));
  const std::string part = parent.second + ".part";
  ::unlinkat(parent.first.get(), part.c_str(), 0);
  if (::symlinkat(target.c_str(), parent.first.get(), part.c_str()) != 0) {
    return ErrnoStatus(errno, "symlink", path);
  }
  if (::renameat(parent.first.get(), part.c_str(), parent.first.get(),
                 parent.second.c_str()) != 0) {
    absl::Status s = ErrnoStatus(errno, "rename", path);
    ::unlinkat(parent.first.get(), part.c_str(), 0);
    return s;
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::client
