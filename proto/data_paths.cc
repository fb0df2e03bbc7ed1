#include "proto/data_paths.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/edit_distance.h"

namespace dlbatch {
namespace {

// Past this many neighbours a "did you mean" is not worth its time (an
// image folder of 60,000 files).
constexpr size_t kMaxCandidates = 2000;
constexpr size_t kMaxEdits = 3;

// "data/./x//y.gz" -> "data/x/y.gz", as the worker's kernel resolves it
// (the working folder holds plain files and folders: attached symlinks
// arrive as what they name); "" for the folder itself; nullopt for a path
// that climbs out of it.
std::optional<std::string> Normalize(absl::string_view path) {
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty()) return std::nullopt;
      parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  return absl::StrJoin(parts, "/");
}

absl::string_view Parent(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? "" : path.substr(0, slash);
}

// The job's files and the folders that hold them, in the working folder.
class AttachedTree {
 public:
  explicit AttachedTree(absl::Span<const std::string> attached) {
    for (const std::string& a : attached) {
      std::optional<std::string> path = Normalize(a);
      if (!path || path->empty()) continue;
      files_.insert(*path);
      for (absl::string_view up = Parent(*path); !up.empty(); up = Parent(up)) {
        if (!folders_.insert(std::string(up)).second) break;
      }
    }
  }
  bool has_file(const std::string& p) const { return files_.contains(p); }
  bool has_folder(const std::string& p) const {
    return p.empty() ? !files_.empty() : folders_.contains(p);
  }
  size_t file_count() const { return files_.size(); }

  // The attached file (or folder) beside `path` that is nearest to it, if
  // it is within a few edits.
  std::string Nearest(const std::string& path, bool folder) const {
    const absl::flat_hash_set<std::string>& pool = folder ? folders_ : files_;
    const absl::string_view parent = Parent(path);
    std::vector<const std::string*> near;
    for (const std::string& p : pool) {
      if (Parent(p) == parent) near.push_back(&p);
      if (near.size() > kMaxCandidates) return "";
    }
    std::string best;
    size_t best_edits = kMaxEdits + 1;
    for (const std::string* p : near) {
      const size_t d = EditDistance(path, *p, /*swap_is_one_edit=*/true);
      if (d < best_edits || (d == best_edits && *p < best)) {
        best_edits = d;
        best = *p;
      }
    }
    return best;
  }

 private:
  absl::flat_hash_set<std::string> files_;
  absl::flat_hash_set<std::string> folders_;
};

absl::Status Refuse(const DataPath& p, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(p.field, ": '", p.path, "' ", problem));
}

// What to attach for `path`: its top folder, or the file itself.
std::string WhatToAttach(const std::string& path, bool folder) {
  const size_t slash = path.find('/');
  if (slash == std::string::npos) return folder ? path + "/" : path;
  return path.substr(0, slash + 1);
}

absl::Status NotAttached(const DataPath& p, const std::string& path,
                         const AttachedTree& tree,
                         absl::Span<const std::string> attach_written) {
  const std::string attach = WhatToAttach(path, p.folder);
  if (attach_written.empty()) {
    return Refuse(
        p, absl::StrCat("is not among the job's attached files, and the job "
                        "attaches nothing (a relative path is read from the "
                        "job's working folder, which holds only its "
                        "attachments); add `attach: [",
                        attach,
                        "]` (relative to the job file's folder), or give an "
                        "absolute path"));
  }
  std::string problem = absl::StrCat(
      "is not among the job's attached ", p.folder ? "folders" : "files",
      " (attach: [", absl::StrJoin(attach_written, ", "), "], ",
      tree.file_count(), tree.file_count() == 1 ? " file" : " files", ")");
  const std::string nearest = tree.Nearest(path, p.folder);
  const std::string top = attach.substr(0, attach.size() - 1);
  if (!nearest.empty()) {
    absl::StrAppend(&problem, "; did you mean '", nearest, "'?");
  } else if (attach.back() == '/' && tree.has_folder(top)) {
    absl::StrAppend(&problem, ": ", attach, " is attached, but without '",
                    path.substr(attach.size()),
                    "'; put it there before submitting, or correct the path");
  } else {
    absl::StrAppend(&problem, "; add ", attach,
                    " to attach: (relative to the job file's folder), or "
                    "correct the path");
  }
  return Refuse(p, problem);
}

absl::Status CheckOne(const DataPath& p, const AttachedTree& tree,
                      absl::Span<const std::string> attach_written) {
  if (p.path.front() == '/') return absl::OkStatus();  // on the workers
  std::optional<std::string> path = Normalize(p.path);
  if (!path) {
    return Refuse(p,
                  "climbs out of the job's working folder (..), which holds "
                  "only the job's attachments; name an attached file, or "
                  "give an absolute path");
  }
  if (p.folder) {
    if (tree.has_folder(*path)) return absl::OkStatus();
    if (tree.has_file(*path)) {
      return Refuse(p,
                    "is an attached file; a folders source names a folder "
                    "with one subfolder of images per class");
    }
  } else {
    if (tree.has_file(*path)) return absl::OkStatus();
    if (tree.has_folder(*path)) {
      return Refuse(p, "is an attached folder; name the file in it");
    }
  }
  return NotAttached(p, *path, tree, attach_written);
}

}  // namespace

std::vector<DataPath> DataPaths(const v1::TrainSpec& train) {
  std::vector<DataPath> out;
  const v1::DataSpec& data = train.data();
  const struct {
    bool has;
    const v1::DataSource& source;
    absl::string_view field;
  } sources[] = {
      {data.has_train(), data.train(), "train.data.train"},
      {data.has_validation(), data.validation(), "train.data.validation"},
      {data.has_test(), data.test(), "train.data.test"},
  };
  for (const auto& s : sources) {
    if (!s.has) continue;
    auto add = [&](absl::string_view key, const std::string& path,
                   bool folder) {
      if (!path.empty()) {
        out.push_back({absl::StrCat(s.field, ".", key), path, folder});
      }
    };
    add("images", s.source.images(), false);
    add("labels", s.source.labels(), false);
    for (int i = 0; i < s.source.files_size(); ++i) {
      add(absl::StrCat("files[", i, "]"), s.source.files(i), false);
    }
    add("path", s.source.path(), true);
  }
  return out;
}

absl::Status CheckDataAttached(const v1::TrainSpec& train,
                               absl::Span<const std::string> attached,
                               absl::Span<const std::string> attach_written) {
  const AttachedTree tree(attached);
  for (const DataPath& p : DataPaths(train)) {
    absl::Status s = CheckOne(p, tree, attach_written);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dlbatch
