// The decoded cache of an image folder: its key, and its file.
//
// File layout (host byte order; the cache never leaves the machine):
//   "DLBIMGS\n"  magic
//   u32 version (1), u32 zero
//   char[64]     the key (FolderCacheKey, hex)
//   i64 count, i32 h, i32 w, i32 c, i32 classes, i64 bad, i64 names_bytes
//   names_bytes  classes names, then bad x (path, problem); each a u32
//                length and its bytes
//   i32[count]   labels
//   u8[count * h * w * c] pixels, NHWC
//   "DLBIMEND"   trailer
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "trainer/data/image_folders.h"

namespace dlbatch::trainer {
namespace {

constexpr char kMagic[] = "DLBIMGS\n";
constexpr char kTrailer[] = "DLBIMEND";
constexpr uint32_t kVersion = 1;
constexpr int kKeyChars = 64;
constexpr char kSuffix[] = ".dlbimg";
// An abandoned temporary file (its writer killed) is one nobody has
// written to for this long.
constexpr int64_t kAbandonedS = 600;
// A cache file nobody has read or written for this long is removed (a
// worker's jobs come and go with their folders, and so would their caches).
constexpr int64_t kUnusedS = 14 * 24 * 3600;
// Counts past this are a damaged header, not a data set.
constexpr int64_t kMaxBytes = int64_t{1} << 50;

#pragma pack(push, 1)
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t zero;
  char key[kKeyChars];
  int64_t count;
  int32_t h, w, c, classes;
  int64_t bad;
  int64_t names_bytes;
};
#pragma pack(pop)

void AppendString(std::string* out, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
  out->append(s);
}

// Reads strings AppendString wrote, from `*at` in `block`.
bool TakeString(const std::string& block, size_t* at, std::string* s) {
  uint32_t n = 0;
  if (block.size() - *at < sizeof(n)) return false;
  std::memcpy(&n, block.data() + *at, sizeof(n));
  *at += sizeof(n);
  if (block.size() - *at < n) return false;
  s->assign(block, *at, n);
  *at += n;
  return true;
}

absl::string_view Bytes(const void* p, size_t n) {
  return absl::string_view(static_cast<const char*>(p), n);
}

// "images-<folder and shape>-": what every cache file of the folder decoded
// to this shape is named from.
std::string NamePrefix(const FolderListing& listing, const Shape& shape) {
  return absl::StrCat(
      "images-",
      Sha256Hex(absl::StrCat(listing.canonical, "\n", shape.ToString()))
          .substr(0, 16),
      "-");
}

// Removes the other cache files of `prefix` in `dir` (earlier states of
// the folder), temporary files that nobody writes any more, and cache
// files of any folder unused for kUnusedS (reads mark them used).
void RemoveStale(const std::string& dir, const std::string& prefix,
                 const std::string& keep) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const int64_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == keep || !absl::StartsWith(name, "images-")) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    const bool cache = absl::EndsWith(name, kSuffix);
    if (cache && absl::StartsWith(name, prefix)) {
      ::unlink(path.c_str());
      continue;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;
    const int64_t idle = now - st.st_mtime;
    if ((cache && idle > kUnusedS) ||
        (absl::StrContains(name, ".tmp-") && idle > kAbandonedS)) {
      ::unlink(path.c_str());
    }
  }
  ::closedir(d);
}

absl::Status Damaged(const std::string& path, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("decoded cache ", path, " is damaged (", what, ")"));
}

}  // namespace

std::string FolderCacheKey(const FolderListing& listing, const Shape& shape) {
  Sha256 h;
  std::string part;
  AppendString(&part, "dlbatch image folder, decoded v1");
  AppendString(&part, listing.canonical);
  AppendString(&part, shape.ToString());
  for (const std::string& c : listing.class_names) AppendString(&part, c);
  h.Update(part);
  for (const FolderFile& f : listing.files) {
    part.clear();
    AppendString(&part, f.path);
    const int64_t numbers[] = {f.label, f.size, f.mtime_ns};
    part.append(reinterpret_cast<const char*>(numbers), sizeof(numbers));
    h.Update(part);
  }
  return h.HexDigest();
}

std::string FolderCacheName(const FolderListing& listing, const Shape& shape,
                            const std::string& key) {
  return absl::StrCat(NamePrefix(listing, shape), key.substr(0, 16), kSuffix);
}

absl::Status WriteFolderCache(const std::string& path, const std::string& key,
                              const DecodedFolder& decoded) {
  const Dataset& data = decoded.data;
  if (key.size() != kKeyChars) {
    return absl::InvalidArgumentError("a cache key is 64 hex digits");
  }
  std::string names;
  for (const std::string& c : data.class_names) AppendString(&names, c);
  for (const BadImage& b : decoded.bad) {
    AppendString(&names, b.path);
    AppendString(&names, b.problem);
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(header.magic));
  header.version = kVersion;
  std::memcpy(header.key, key.data(), kKeyChars);
  header.count = data.count;
  header.h = data.shape.h;
  header.w = data.shape.w;
  header.c = data.shape.c;
  header.classes = static_cast<int32_t>(data.class_names.size());
  header.bad = static_cast<int64_t>(decoded.bad.size());
  header.names_bytes = static_cast<int64_t>(names.size());

  std::string tmp = absl::StrCat(path, ".tmp-XXXXXX");
  UniqueFd fd(::mkstemp(tmp.data()));
  if (!fd.valid()) return ErrnoStatus(errno, "create", tmp);
  absl::Status s = WriteFull(fd.get(), Bytes(&header, sizeof(header)), tmp);
  if (s.ok()) s = WriteFull(fd.get(), names, tmp);
  if (s.ok()) {
    s = WriteFull(
        fd.get(),
        Bytes(data.labels.data(), data.labels.size() * sizeof(int32_t)), tmp);
  }
  if (s.ok()) {
    s = WriteFull(fd.get(), Bytes(data.pixels.data(), data.pixels.size()), tmp);
  }
  if (s.ok()) s = WriteFull(fd.get(), Bytes(kTrailer, 8), tmp);
  if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoStatus(errno, "fsync", tmp);
  if (s.ok() && ::close(fd.Release()) != 0) {
    s = ErrnoStatus(errno, "close", tmp);
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, "rename", tmp);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const std::filesystem::path p(path);
  const std::string dir = p.parent_path().string();
  const std::string name = p.filename().string();
  // The prefix: up to and including the second '-' of "images-X-KEY".
  const size_t cut = name.find('-', name.find('-') + 1);
  if (cut != std::string::npos) {
    RemoveStale(dir, name.substr(0, cut + 1), name);
  }
  return FsyncDir(dir);
}

absl::StatusOr<DecodedFolder> ReadFolderCache(const std::string& path,
                                              const std::string& key) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(path);
    return ErrnoStatus(err, "open", path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  Header header;
  absl::StatusOr<size_t> got = PreadFull(
      fd.get(), reinterpret_cast<char*>(&header), sizeof(header), 0, path);
  if (!got.ok()) return got.status();
  if (*got != sizeof(header) ||
      std::memcmp(header.magic, kMagic, sizeof(header.magic)) != 0) {
    return Damaged(path, "not a decoded-images file");
  }
  if (header.version != kVersion) return Damaged(path, "another version");
  if (std::string(header.key, kKeyChars) != key) {
    return Damaged(path, "written for another state of the folder");
  }
  const Shape shape{header.h, header.w, header.c};
  if (header.count < 0 || shape.h <= 0 || shape.w <= 0 ||
      (shape.c != 1 && shape.c != 3) || header.classes <= 0 || header.bad < 0 ||
      header.names_bytes < 0 || header.names_bytes > kMaxBytes ||
      header.count > kMaxBytes / (shape.size() + 4) ||
      (header.classes + 2 * header.bad) * int64_t{4} > header.names_bytes) {
    return Damaged(path, "impossible counts");
  }
  const int64_t pixel_bytes = header.count * shape.size();
  const int64_t label_bytes = header.count * int64_t{sizeof(int32_t)};
  const int64_t expected = static_cast<int64_t>(sizeof(header)) +
                           header.names_bytes + label_bytes + pixel_bytes + 8;
  if (st.st_size != expected) {
    return Damaged(
        path, absl::StrCat(st.st_size, " bytes, its header needs ", expected));
  }
  DecodedFolder out;
  Dataset& data = out.data;
  data.shape = shape;
  data.count = header.count;
  data.num_classes = header.classes;
  int64_t offset = sizeof(header);
  std::string names(header.names_bytes, '\0');
  data.labels.resize(header.count);
  data.pixels.resize(pixel_bytes);
  char trailer[8];
  struct Part {
    void* to;
    int64_t bytes;
  };
  for (const Part& part :
       {Part{names.data(), header.names_bytes},
        Part{data.labels.data(), label_bytes},
        Part{data.pixels.data(), pixel_bytes}, Part{trailer, 8}}) {
    got = PreadFull(fd.get(), static_cast<char*>(part.to), part.bytes, offset,
                    path);
    if (!got.ok()) return got.status();
    if (static_cast<int64_t>(*got) != part.bytes) {
      return Damaged(path, "shorter than its header says");
    }
    offset += part.bytes;
  }
  if (std::memcmp(trailer, kTrailer, 8) != 0) return Damaged(path, "trailer");
  size_t at = 0;
  data.class_names.resize(header.classes);
  for (std::string& c : data.class_names) {
    if (!TakeString(names, &at, &c)) return Damaged(path, "class names");
  }
  out.bad.resize(header.bad);
  for (BadImage& b : out.bad) {
    if (!TakeString(names, &at, &b.path) ||
        !TakeString(names, &at, &b.problem)) {
      return Damaged(path, "bad images");
    }
  }
  for (int32_t label : data.labels) {
    if (label < 0 || label >= header.classes) return Damaged(path, "labels");
  }
  // Used now: RemoveStale keeps it. (Best effort: a cache another user
  // wrote may refuse.)
  ::futimens(fd.get(), nullptr);
  return out;
}

}  // namespace dlbatch::trainer
