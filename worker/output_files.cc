#include "worker/output_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace dlbatch::worker {
namespace {

// Deeper folders are skipped: the walk holds one fd per level.
constexpr int kMaxDepth = 64;

// Output paths travel as proto3 strings, which must be UTF-8.
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t more;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      more = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      more = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= more) return false;
    for (size_t k = 1; k <= more; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (more == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    i += more + 1;
  }
  return true;
}

// Shown in diary lines: the name as far as it is printable.
std::string Shown(absl::string_view path) {
  std::string out;
  for (char ch : path) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += ch;
    }
  }
  return out;
}

class Walker {
 public:
  Walker(int64_t limit, OutputScan* scan) : limit_(limit), scan_(scan) {}

  absl::Status Walk(int dir_fd, const std::string& prefix, int depth) {
    std::vector<std::string> names;
    {
      int copy = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
      if (copy < 0) return ErrnoStatus(errno, "dup", prefix);
      DIR* d = ::fdopendir(copy);
      if (d == nullptr) {
        ::close(copy);
        return ErrnoStatus(errno, "opendir", Where(prefix));
      }
      ::rewinddir(d);
      while (struct dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") names.push_back(std::move(name));
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const std::string rel = prefix + name;
      if (!IsUtf8(rel)) {
        Skip(rel, "its name is not UTF-8");
        continue;
      }
      struct stat st;
      if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // gone meanwhile
        return ErrnoStatus(errno, "stat", Where(rel));
      }
      if (S_ISDIR(st.st_mode)) {
        if (depth >= kMaxDepth) {
          Skip(rel, absl::StrCat("it is a folder nested more than ", kMaxDepth,
                                 " deep"));
          continue;
        }
        UniqueFd child(::openat(
            dir_fd, name.c_str(),
            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
        if (!child.valid()) {
          if (errno == ENOENT) continue;
          if (errno == ELOOP || errno == ENOTDIR) {
            Skip(rel, "it changed while being read");
            continue;
          }
          return ErrnoStatus(errno, "open", Where(rel));
        }
        RETURN_IF_ERROR(Walk(child.get(), rel + "/", depth + 1));
      } else if (S_ISREG(st.st_mode)) {
        RETURN_IF_ERROR(AddFile(rel, st));
      } else if (S_ISLNK(st.st_mode)) {
        AddSymlink(dir_fd, name, rel, st);
      } else {
        Skip(rel, absl::StrCat("it is ", DescribeFileType(st.st_mode),
                               ", not a file, folder or symlink"));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string Where(const std::string& rel) const {
    return absl::StrCat("output '", Shown(rel), "'");
  }

  void Skip(const std::string& rel, const std::string& why) {
    scan_->skipped.push_back(
        absl::StrCat("output '", Shown(rel), "' skipped: ", why));
  }

  absl::Status AddFile(const std::string& rel, const struct stat& st) {
    auto key = std::make_pair(static_cast<uint64_t>(st.st_dev),
                              static_cast<uint64_t>(st.st_ino));
    if (st.st_nlink > 1) {
      auto it = inodes_.find(key);
      if (it != inodes_.end()) {
        scan_->entries[it->second].paths.push_back(rel);
        return absl::OkStatus();
      }
      inodes_[key] = scan_->entries.size();
    }
    OutputEntry e;
    e.kind = OutputEntry::Kind::kFile;
    e.paths.push_back(rel);
    e.size = static_cast<int64_t>(st.st_size);
    e.mode = st.st_mode & 07777;
    e.dev = key.first;
    e.ino = key.second;
    scan_->entries.push_back(std::move(e));
    scan_->total_bytes += static_cast<int64_t>(st.st_size);
    ++scan_->files;
    if (limit_ > 0 && scan_->total_bytes > limit_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the job's outputs hold ", HumanBytes(scan_->total_bytes),
          " or more (", scan_->total_bytes, " bytes by '", Shown(rel),
          "'), more than its limit of ", HumanBytes(limit_), " (", limit_,
          " bytes, the scheduler's --max-output-bytes); none was stored: "
          "write less into $DLBATCH_OUTPUT_DIR"));
    }
    return absl::OkStatus();
  }

  void AddSymlink(int dir_fd, const std::string& name, const std::string& rel,
                  const struct stat& st) {
    std::string target(static_cast<size_t>(std::max<off_t>(st.st_size, 0)) + 1,
                       '\0');
    ssize_t n =
        ::readlinkat(dir_fd, name.c_str(), target.data(), target.size());
    if (n < 0 || static_cast<size_t>(n) >= target.size()) {
      Skip(rel, "it is a symlink that changed while being read");
      return;
    }
    target.resize(static_cast<size_t>(n));
    if (!IsUtf8(target)) {
      Skip(rel, "it is a symlink whose target is not UTF-8");
      return;
    }
    OutputEntry e;
    e.kind = OutputEntry::Kind::kSymlink;
    e.paths.push_back(rel);
    e.target = std::move(target);
    scan_->entries.push_back(std::move(e));
  }

  const int64_t limit_;
  OutputScan* scan_;
  std::map<std::pair<uint64_t, uint64_t>, size_t> inodes_;  // -> entries
};

}  // namespace

absl::StatusOr<OutputScan> ScanOutputs(const std::string& dir,
                                       int64_t max_output_bytes) {
  OutputScan scan;
  scan.root_.Reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                           O_NONBLOCK | O_CLOEXEC));
  if (!scan.root_.valid()) {
    if (errno == ENOENT) return scan;
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job replaced its output folder ", dir,
                       " by a symlink or a file; nothing of it was stored"));
    }
    return ErrnoStatus(errno, "open the output folder", dir);
  }
  Walker walker(max_output_bytes, &scan);
  RETURN_IF_ERROR(walker.Walk(scan.root_.get(), "", 0));
  return scan;
}

absl::StatusOr<UniqueFd> OutputScan::OpenFile(const OutputEntry& entry) const {
  const std::string& rel = entry.paths.front();
  const std::string where = absl::StrCat("output '", Shown(rel), "'");
  std::vector<std::string> parts = absl::StrSplit(rel, '/');
  UniqueFd dir;
  int at = root_.get();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    UniqueFd next(
        ::openat(at, parts[i].c_str(),
                 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!next.valid()) return ErrnoStatus(errno, "open", where);
    dir = std::move(next);
    at = dir.get();
  }
  UniqueFd fd(::openat(at, parts.back().c_str(),
                       O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open", where);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", where);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_dev) != entry.dev ||
      static_cast<uint64_t>(st.st_ino) != entry.ino) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " was replaced while the outputs were read"));
  }
  return fd;
}

absl::StatusOr<std::vector<v1::OutputFile>> StoreOutputs(
    const OutputScan& scan, const UploadOutputFn& upload) {
  std::vector<v1::OutputFile> out;
  for (const OutputEntry& e : scan.entries) {
    if (e.kind == OutputEntry::Kind::kSymlink) {
      v1::OutputFile f;
      f.set_path(e.paths.front());
      f.set_symlink(e.target);
      out.push_back(std::move(f));
      continue;
    }
    const std::string what = absl::StrCat("output '", e.paths.front(), "'");
    ASSIGN_OR_RETURN(UniqueFd fd, scan.OpenFile(e));
    absl::StatusOr<LocalBlob> blob = upload(fd.get(), e.size, what);
    if (!blob.ok()) {
      return Annotate(blob.status(), absl::StrCat("uploading ", what));
    }
    for (const std::string& path : e.paths) {
      v1::OutputFile f;
      f.set_path(path);
      f.set_size(blob->size);
      f.set_sha256(blob->sha256);
      f.set_mode(e.mode);
      out.push_back(std::move(f));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const v1::OutputFile& a, const v1::OutputFile& b) {
              return a.path() < b.path();
            });
  return out;
}

}  // namespace dlbatch::worker
