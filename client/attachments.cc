#include "client/attachments.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch::client {
namespace fs = std::filesystem;
namespace {

// stat(2), following symlinks, with the error said for `entry`.
absl::Status StatFollowing(const std::string& entry, const fs::path& path,
                           struct stat* st) {
  if (::stat(path.c_str(), st) == 0) return absl::OkStatus();
  int err = errno;
  struct stat lst;
  if (err == ENOENT && ::lstat(path.c_str(), &lst) == 0 &&
      S_ISLNK(lst.st_mode)) {
    std::error_code ec;
    return absl::NotFoundError(absl::StrCat(
        "attach: '", entry, "': ", path.string(), " is a symlink to ",
        fs::read_symlink(path, ec).string(), ", which does not exist"));
  }
  if (err == ELOOP) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach: '", entry, "': ", path.string(), " is a symlink loop"));
  }
  return Annotate(ErrnoStatus(err, "stat", path.string()),
                  absl::StrCat("attach: '", entry, "'"));
}

absl::Status Refuse(const std::string& entry, const fs::path& path,
                    const struct stat& st) {
  return absl::InvalidArgumentError(absl::StrCat(
      "attach: '", entry, "': ", path.string(), " is ",
      DescribeFileType(st.st_mode),
      "; only regular files and folders (or symlinks to them) can be "
      "attached: remove it from attach: or from the folder"));
}

class Expander {
 public:
  Expander(const std::string& entry, std::vector<LocalFile>* files)
      : entry_(entry), files_(files) {}

  // `source` is a folder (stat says so); `layout` its place in the job.
  absl::Status Folder(const fs::path& source, const fs::path& layout,
                      const struct stat& st) {
    auto key = std::make_pair(st.st_dev, st.st_ino);
    if (!on_path_.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attach: '", entry_, "': ", source.string(),
          " leads back to a folder that holds it (a symlink loop)"));
    }
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(source, ec), end; !ec && it != end;
         it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("attach: '", entry_, "': cannot read ", source.string(),
                       ": ", ec.message()));
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      struct stat child;
      RETURN_IF_ERROR(StatFollowing(entry_, source / name, &child));
      if (S_ISDIR(child.st_mode)) {
        RETURN_IF_ERROR(Folder(source / name, layout / name, child));
      } else if (S_ISREG(child.st_mode)) {
        files_->push_back({(source / name).string(), (layout / name).string()});
      } else {
        return Refuse(entry_, source / name, child);
      }
    }
    on_path_.erase(key);
    return absl::OkStatus();
  }

 private:
  const std::string& entry_;
  std::vector<LocalFile>* files_;
  std::set<std::pair<dev_t, ino_t>> on_path_;  // folders being walked
};

}  // namespace

absl::StatusOr<std::vector<LocalFile>> ResolveAttachments(
    const std::vector<std::string>& attach, const std::string& job_file) {
  fs::path base = fs::absolute(job_file).parent_path();
  std::vector<LocalFile> files;
  for (const std::string& entry : attach) {
    fs::path written(entry);
    fs::path source = written.is_absolute() ? written : base / written;
    source = source.lexically_normal();
    if (source.filename().empty()) source = source.parent_path();  // "data/"
    struct stat st;
    if (::lstat(source.c_str(), &st) != 0 && errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("attach: '", entry,
                                              "' not found (looked for ",
                                              source.string(), ")"));
    }
    RETURN_IF_ERROR(StatFollowing(entry, source, &st));
    fs::path layout = written.lexically_normal();
    std::string first =
        layout.begin() != layout.end() ? layout.begin()->string() : "";
    if (written.is_absolute() || first == "..") layout = source.filename();
    if (layout.filename().empty()) layout = layout.parent_path();  // "data/"
    if (S_ISDIR(st.st_mode)) {
      RETURN_IF_ERROR(Expander(entry, &files).Folder(source, layout, st));
    } else if (S_ISREG(st.st_mode)) {
      files.push_back({source.string(), layout.string()});
    } else {
      return Refuse(entry, source, st);
    }
  }
  return files;
}

}  // namespace dlbatch::client
