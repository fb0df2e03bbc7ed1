// Format folders: listing a folder of class folders, decoding its images on
// several threads, and loading it through the decoded cache.
#include "trainer/data/image_folders.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "trainer/data/image_decode.h"

namespace dlbatch::trainer {
namespace {

namespace fs = std::filesystem;

// Files each decoding thread claims at a time.
constexpr int64_t kClaim = 32;
// The largest image file read (a damaged or mistaken file must not take
// the memory).
constexpr int64_t kMaxFileBytes = int64_t{1} << 30;
// Bad images a message lists by name.
constexpr size_t kNamedBadImages = 3;

// Calls each(first, end) over [0, n) on up to `threads` threads, the
// caller's among them, each claiming `claim` consecutive items at a time.
template <typename Each>
void ForClaims(int64_t n, int threads, int64_t claim, const Each& each) {
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t first; (first = next.fetch_add(claim)) < n;) {
      each(first, std::min(n, first + claim));
    }
  };
  const int64_t useful = (n + claim - 1) / claim;
  const int count = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(threads, useful)));
  std::vector<std::thread> pool;
  for (int t = 1; t < count; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

bool IsImageName(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  return absl::EndsWith(lower, ".png") || absl::EndsWith(lower, ".jpg") ||
         absl::EndsWith(lower, ".jpeg");
}

bool Hidden(const std::string& name) { return !name.empty() && name[0] == '.'; }

absl::Status ListError(const std::string& dir, const std::error_code& ec) {
  return absl::PermissionDeniedError(
      absl::StrCat("image folder '", dir, "': cannot list it (", ec.message(),
                   "); make it readable by the job"));
}

// The classes under `root`, sorted; files beside them counted in `ignored`.
absl::StatusOr<std::vector<std::string>> ListClasses(const std::string& root,
                                                     int64_t* ignored) {
  std::vector<std::string> classes;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (Hidden(name)) continue;
    std::error_code type_ec;
    if (it->is_directory(type_ec)) {
      classes.push_back(name);
    } else if (IsImageName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image folder '", root, "': the image '", name,
          "' lies directly in it; put each image in the subfolder of its "
          "class (",
          root, "/<class>/", name, ")"));
    } else {
      ++*ignored;
    }
  }
  if (ec) return ListError(root, ec);
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image folder '", root,
        "' holds no class folders; put each class's images in a subfolder "
        "named after the class"));
  }
  return classes;
}

// A file found, with where its path within the class begins.
struct Found {
  FolderFile file;
  size_t within = 0;
};

// Lists the folder open as `fd` (taken over and closed), `rel` from the
// image folder `root`, into `found`: every image file below it, at any
// depth, with its size and modification time. Hidden names are left out,
// links to folders are not followed, other files are counted in
// `ignored`. Names are looked at relative to their folder's descriptor,
// so that a file costs one fstatat and no walk of the whole path (60,000
// files: a tenth of a second less on a 2-core VM).
absl::Status ListTree(int fd, const std::string& root, const std::string& rel,
                      size_t within, int label, std::vector<Found>* found,
                      int64_t* ignored) {
  const std::string where = absl::StrCat(root, "/", rel);
  DIR* opened = ::fdopendir(fd);
  if (opened == nullptr) {
    const int err = errno;
    ::close(fd);
    return ListError(where, std::error_code(err, std::generic_category()));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opened, ::closedir);
  const int dfd = ::dirfd(opened);
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(opened);
    if (entry == nullptr) break;
    const std::string name = entry->d_name;
    if (Hidden(name)) continue;  // "." and ".." too
    unsigned char type = entry->d_type;
    struct stat st;
    if (type == DT_UNKNOWN) {  // file systems that do not say
      if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        type = DT_REG;  // gone, or unreadable: decoding says why
      } else {
        type = S_ISDIR(st.st_mode)   ? DT_DIR
               : S_ISLNK(st.st_mode) ? DT_LNK
                                     : DT_REG;
      }
    }
    if (type == DT_DIR) {
      const int sub = ::openat(dfd, name.c_str(),
                               O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
      const std::string sub_rel = absl::StrCat(rel, "/", name);
      if (sub < 0) {
        return ListError(absl::StrCat(root, "/", sub_rel),
                         std::error_code(errno, std::generic_category()));
      }
      absl::Status s =
          ListTree(sub, root, sub_rel, within, label, found, ignored);
      if (!s.ok()) return s;
      continue;
    }
    const bool image = IsImageName(name);
    if (!image && type != DT_LNK) {
      ++*ignored;
      continue;
    }
    const bool stated = ::fstatat(dfd, name.c_str(), &st, 0) == 0;
    if (stated && S_ISDIR(st.st_mode)) continue;  // a link to a folder
    if (!image) {
      ++*ignored;
      continue;
    }
    Found f;
    f.file.path = absl::StrCat(rel, "/", name);
    f.within = within;
    f.file.label = label;
    if (stated) {
      f.file.size = st.st_size;
      f.file.mtime_ns =
          int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    } else {
      f.file.size = -1;  // decoding says why (a dangling link, say)
    }
    found->push_back(std::move(f));
  }
  if (errno != 0) {
    return ListError(where, std::error_code(errno, std::generic_category()));
  }
  return absl::OkStatus();
}

// Lists class folder `name` of `root` (a link to a folder is followed
// here) into `found`, its images labelled `label`.
absl::Status ListClass(const std::string& root, const std::string& name,
                       int label, std::vector<Found>* found, int64_t* ignored) {
  const std::string dir = absl::StrCat(root, "/", name);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return ListError(dir, std::error_code(errno, std::generic_category()));
  }
  const size_t before = found->size();
  absl::Status s =
      ListTree(fd, root, name, name.size() + 1, label, found, ignored);
  if (!s.ok()) return s;
  if (found->size() == before) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image folder '", root, "': the class folder '", name,
        "' holds no .png, .jpg or .jpeg images; add its images or remove "
        "it"));
  }
  return absl::OkStatus();
}

absl::Status ReadWholeFile(const std::string& path, std::string* bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (st.st_size > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the file has ", st.st_size, " bytes, more than the ",
                     kMaxFileBytes, " an image file may have"));
  }
  bytes->resize(static_cast<size_t>(st.st_size));
  absl::StatusOr<size_t> got =
      PreadFull(fd.get(), bytes->data(), bytes->size(), 0, path);
  if (!got.ok()) return got.status();
  bytes->resize(*got);
  return absl::OkStatus();
}

std::string Describe(const v1::DataSource& source, const std::string& root) {
  std::string s = absl::StrCat("image folder '", root, "'");
  if (source.path() != root) {
    absl::StrAppend(&s, " (given as '", source.path(), "')");
  }
  return s;
}

// The folders to keep the cache in, in order of preference.
std::vector<std::string> CacheDirs(const LoadOptions& options,
                                   const std::string& base_dir) {
  std::vector<std::string> dirs;
  if (!options.cache_dir.empty()) dirs.push_back(options.cache_dir);
  dirs.push_back(
      absl::StrCat(base_dir.empty() ? "." : base_dir, "/.dlbatch-cache"));
  return dirs;
}

absl::Status BadImagesError(const std::string& root,
                            const std::vector<BadImage>& bad) {
  std::string msg =
      absl::StrCat("image '", root, "/", bad[0].path, "': ", bad[0].problem);
  if (bad.size() > 1) {
    absl::StrAppend(&msg, " (and ", bad.size() - 1, " more bad image",
                    bad.size() > 2 ? "s" : "", ":");
    for (size_t i = 1; i < bad.size() && i <= kNamedBadImages; ++i) {
      absl::StrAppend(&msg, " '", bad[i].path, "'");
    }
    absl::StrAppend(&msg, bad.size() > kNamedBadImages + 1 ? " ...)" : ")");
  }
  absl::StrAppend(&msg,
                  "; replace or remove it, or add skip_bad_images: true to "
                  "the data source to leave bad images out");
  return absl::DataLossError(msg);
}

}  // namespace

absl::StatusOr<FolderListing> ListImageFolder(
    const std::string& given, const std::vector<std::string>& classes,
    int threads) {
  FolderListing listing;
  listing.root = given;
  while (listing.root.size() > 1 && listing.root.back() == '/') {
    listing.root.pop_back();
  }
  const std::string& root = listing.root;
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(
          "image folder '", root,
          "': no such folder; check path: in the job's data section and "
          "that the folder is attached to the job or present on the "
          "worker"));
    }
    return ErrnoStatus(err, "image folder: cannot open", root);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image folder '", root,
        "' is not a folder; path: names a folder with one subfolder of "
        "images per class"));
  }
  std::error_code ec;
  listing.canonical = fs::canonical(root, ec).string();
  if (ec) listing.canonical = root;
  absl::StatusOr<std::vector<std::string>> found_classes =
      ListClasses(root, &listing.ignored);
  if (!found_classes.ok()) return found_classes.status();
  listing.class_names = classes.empty() ? *found_classes : classes;

  const std::vector<std::string>& names = *found_classes;
  std::vector<int> labels;
  for (const std::string& name : names) {
    const auto at =
        std::find(listing.class_names.begin(), listing.class_names.end(), name);
    if (at == listing.class_names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image folder '", root, "': the class folder '", name,
          "' is not a class of the training set (", listing.class_names.size(),
          " classes, from '", listing.class_names.front(), "' to '",
          listing.class_names.back(), "'); rename or remove it"));
    }
    labels.push_back(static_cast<int>(at - listing.class_names.begin()));
  }
  // The classes are listed on `threads` threads; what they found, and the
  // first class's error, are taken in class order.
  const size_t n = names.size();
  std::vector<std::vector<Found>> per_class(n);
  std::vector<int64_t> ignored(n, 0);
  std::vector<absl::Status> status(n);
  ForClaims(static_cast<int64_t>(n), threads, 1, [&](int64_t i, int64_t) {
    status[i] =
        ListClass(root, names[i], labels[i], &per_class[i], &ignored[i]);
  });
  std::vector<Found> found;
  for (size_t i = 0; i < n; ++i) {
    if (!status[i].ok()) return status[i];
    listing.ignored += ignored[i];
    found.insert(found.end(), std::make_move_iterator(per_class[i].begin()),
                 std::make_move_iterator(per_class[i].end()));
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    const std::string_view wa = std::string_view(a.file.path).substr(a.within);
    const std::string_view wb = std::string_view(b.file.path).substr(b.within);
    return std::tie(wa, a.file.label) < std::tie(wb, b.file.label);
  });
  listing.files.reserve(found.size());
  for (Found& f : found) listing.files.push_back(std::move(f.file));
  return listing;
}

DecodedFolder DecodeFolder(const FolderListing& listing, const Shape& shape,
                           int threads) {
  const int64_t n = static_cast<int64_t>(listing.files.size());
  const int64_t size = shape.size();
  DecodedFolder out;
  Dataset& data = out.data;
  data.shape = shape;
  data.class_names = listing.class_names;
  data.num_classes = static_cast<int>(listing.class_names.size());
  data.images_decoded = n;
  data.pixels.resize(n * size);
  std::vector<std::string> problems(n);

  ForClaims(n, threads, kClaim, [&](int64_t first, int64_t end) {
    std::string bytes;
    for (int64_t i = first; i < end; ++i) {
      absl::Status s = ReadWholeFile(
          absl::StrCat(listing.root, "/", listing.files[i].path), &bytes);
      if (s.ok()) s = DecodeImageTo(bytes, shape, &data.pixels[i * size]);
      if (!s.ok()) problems[i] = std::string(s.message());
    }
  });

  // Left out: the bad images, their places closed up.
  int64_t kept = 0;
  data.labels.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (!problems[i].empty()) {
      out.bad.push_back({listing.files[i].path, std::move(problems[i])});
      continue;
    }
    if (kept != i) {
      std::memmove(&data.pixels[kept * size], &data.pixels[i * size], size);
    }
    data.labels.push_back(listing.files[i].label);
    ++kept;
  }
  data.count = kept;
  data.pixels.resize(kept * size);
  return out;
}

absl::StatusOr<Dataset> LoadImageFolder(const v1::DataSource& source,
                                        const std::string& root,
                                        const std::string& base_dir,
                                        const LoadOptions& options) {
  const Shape& shape = options.input;
  if (shape.h <= 0 || shape.w <= 0 || (shape.c != 1 && shape.c != 3)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(source, root),
                     ": images become the network's input, ", shape.ToString(),
                     "; give network.input a height, a width and 1 "
                     "(grey) or 3 (colour) channels"));
  }
  auto say = [&](const std::string& line) {
    if (options.say) options.say(line);
  };
  absl::StatusOr<FolderListing> listing =
      ListImageFolder(root, options.class_names, options.threads);
  if (!listing.ok()) return listing.status();
  const int64_t files = static_cast<int64_t>(listing->files.size());
  const std::string key = FolderCacheKey(*listing, shape);
  const std::string name = FolderCacheName(*listing, shape, key);
  const std::vector<std::string> dirs = CacheDirs(options, base_dir);

  std::optional<DecodedFolder> decoded;
  for (const std::string& dir : dirs) {
    const std::string path = absl::StrCat(dir, "/", name);
    absl::StatusOr<DecodedFolder> cached = ReadFolderCache(path, key);
    if (cached.ok()) {
      decoded = *std::move(cached);
      say(absl::StrCat("Read ", files, " images of ", root,
                       " from the decoded cache ", path, "."));
      break;
    }
    if (!absl::IsNotFound(cached.status())) {
      say(absl::StrCat("Not using the decoded cache: ",
                       cached.status().message(), "; decoding again."));
    }
  }
  if (!decoded) {
    const int threads = std::max(1, options.threads);
    say(absl::StrCat("Decoding ", files, " images of ", root, " to ",
                     shape.ToString(), " on ", threads,
                     threads == 1 ? " thread" : " threads",
                     " (once: later runs read them decoded)."));
    const auto start = std::chrono::steady_clock::now();
    decoded = DecodeFolder(*listing, shape, threads);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    say(absl::StrFormat("Decoded %d images in %.1f s (%.0f images/s).", files,
                        seconds, files / std::max(seconds, 1e-9)));
    absl::Status written;
    for (const std::string& dir : dirs) {
      const std::string path = absl::StrCat(dir, "/", name);
      written = MakeDirs(dir, 0700);
      if (written.ok()) written = WriteFolderCache(path, key, *decoded);
      if (written.ok()) {
        say(absl::StrCat("Cached them in ", path, "."));
        break;
      }
    }
    if (!written.ok()) {
      say(absl::StrCat("Could not cache the decoded images (",
                       written.message(), "); later runs decode them again."));
    }
  }
  Dataset data = std::move(decoded->data);
  data.source = root;
  const std::vector<BadImage>& bad = decoded->bad;
  if (!bad.empty()) {
    if (!source.skip_bad_images()) return BadImagesError(root, bad);
    std::string line = absl::StrCat("Skipped ", bad.size(), " bad image",
                                    bad.size() == 1 ? "" : "s", " of ", root,
                                    " (skip_bad_images):");
    for (size_t i = 0; i < bad.size() && i < kNamedBadImages; ++i) {
      absl::StrAppend(&line, i == 0 ? " " : "; ", bad[i].path, ": ",
                      bad[i].problem);
    }
    if (bad.size() > kNamedBadImages) absl::StrAppend(&line, "; ...");
    say(line);
    data.images_skipped = static_cast<int64_t>(bad.size());
  }
  if (listing->ignored > 0) {
    say(absl::StrCat("Ignored ", listing->ignored, " file",
                     listing->ignored == 1 ? "" : "s", " in ", root,
                     " that are not .png, .jpg or .jpeg images."));
  }
  if (data.count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(source, root), ": none of its images decoded; replace them"));
  }
  return data;
}

}  // namespace dlbatch::trainer
