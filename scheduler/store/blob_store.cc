#include "scheduler/store/blob_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dlbatch::scheduler {
namespace {

absl::Status MakePrivateDir(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(path, 0700));
  // mkdir's mode is cut by the umask, and an older folder keeps its own.
  if (::chmod(path.c_str(), 0700) != 0)
    return ErrnoStatus(errno, "chmod", path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> FreeBytesIn(const std::string& dir) {
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0)
    return ErrnoStatus(errno, "statvfs", dir);
  return static_cast<int64_t>(vfs.f_bavail) *
         static_cast<int64_t>(vfs.f_frsize);
}

namespace {

// Bytes of the blob files in one shard folder.
int64_t ShardBytes(const std::string& shard) {
  int64_t total = 0;
  DIR* d = ::opendir(shard.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* e = ::readdir(d)) {
    struct stat st;
    if (e->d_name[0] != '.' &&
        ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(st.st_mode)) {
      total += static_cast<int64_t>(st.st_size);
    }
  }
  ::closedir(d);
  return total;
}

}  // namespace

bool IsSha256Hex(absl::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(
    const std::string& dir, int64_t min_free_bytes) {
  return Open(dir, min_free_bytes, [dir] { return FreeBytesIn(dir); });
}

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(
    const std::string& dir, int64_t min_free_bytes, FreeSpaceFn free_space) {
  RETURN_IF_ERROR(MakePrivateDir(dir));
  // Uploads interrupted by a crash leave temp files; none is in use now.
  RETURN_IF_ERROR(RemoveTree(dir + "/tmp"));
  RETURN_IF_ERROR(MakePrivateDir(dir + "/tmp"));
  // Shards made by an older scheduler under a loose umask; the bytes they
  // hold are counted.
  int64_t stored = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() == 2 && IsSha256Hex(name + std::string(62, '0'))) {
        ::fchmodat(::dirfd(d), e->d_name, 0700, AT_SYMLINK_NOFOLLOW);
        stored += ShardBytes(dir + "/" + name);
      }
    }
    ::closedir(d);
  }
  std::unique_ptr<BlobStore> store(
      new BlobStore(dir, min_free_bytes, std::move(free_space)));
  store->stored_bytes_ = stored;
  return store;
}

std::string BlobStore::PathFor(const std::string& sha256) const {
  return absl::StrCat(dir_, "/", sha256.substr(0, 2), "/", sha256);
}

absl::StatusOr<int64_t> BlobStore::Size(const std::string& sha256) const {
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", sha256, "' is not a sha256"));
  }
  struct stat st;
  if (::stat(PathFor(sha256).c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("blob ", sha256, " is not stored"));
  }
  return static_cast<int64_t>(st.st_size);
}

int64_t BlobStore::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

void BlobStore::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= bytes;
}

absl::StatusOr<std::unique_ptr<BlobStore::Writer>> BlobStore::NewWriter(
    const std::string& sha256, int64_t size) {
  if (!sha256.empty() && !IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", sha256, "' is not a sha256"));
  }
  if (size < 0) return absl::InvalidArgumentError("negative blob size");
  // Read outside the lock: statvfs may be slow on a busy disk.
  ASSIGN_OR_RETURN(int64_t free_bytes, free_space_());
  {
    absl::MutexLock lock(&mu_);
    if (free_bytes - reserved_ - size < min_free_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the scheduler's store is too full for a file of ", HumanBytes(size),
          ": ", HumanBytes(free_bytes), " free in ", dir_, ", ",
          HumanBytes(reserved_), " of it promised to uploads in flight and ",
          HumanBytes(min_free_bytes_),
          " kept in reserve; free space there or move --state-dir"));
    }
    reserved_ += size;
  }
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(dir_, "/tmp/", sha256.empty() ? "new" : sha256,
                                 ".", ::getpid(), ".", counter.fetch_add(1));
  int fd = OpenForSequentialWrite(
      AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600,
      size);
  const int open_errno = errno;
  // The writer gives the reservation back, even when it never was.
  auto writer =
      std::unique_ptr<Writer>(new Writer(this, sha256, size, fd, tmp));
  if (fd < 0) {
    writer->done_ = true;  // nothing to remove
    return ErrnoStatus(open_errno, "create", tmp);
  }
  if (::fchmod(fd, 0600) != 0) return ErrnoStatus(errno, "chmod", tmp);
  return writer;
}

BlobStore::Writer::Writer(BlobStore* store, std::string sha256, int64_t size,
                          int fd, std::string tmp_path)
    : store_(store),
      announced_(std::move(sha256)),
      size_(size),
      fd_(fd),
      tmp_path_(std::move(tmp_path)),
      file_(fd_.get(), [this](int err) { return FullOrError(err, "write"); }) {}

BlobStore::Writer::~Writer() {
  store_->Release(size_ - written());
  if (!done_) ::unlink(tmp_path_.c_str());
}

absl::Status BlobStore::Writer::FullOrError(int err,
                                            absl::string_view what) const {
  if (err == ENOSPC || err == EDQUOT) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the scheduler's store is full (", std::strerror(err), " writing ",
        store_->dir_, "); free space there or move --state-dir"));
  }
  return ErrnoStatus(err, what, tmp_path_);
}

absl::Status BlobStore::Writer::Append(absl::string_view data) {
  if (written() + static_cast<int64_t>(data.size()) > size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the upload is longer than the announced ", size_, " bytes"));
  }
  store_->Release(static_cast<int64_t>(data.size()));
  return file_.Append(data);
}

absl::Status BlobStore::Writer::Commit() {
  if (written() != size_) {
    return absl::DataLossError(absl::StrCat("the upload ended early: received ",
                                            written(), " of ", size_,
                                            " bytes"));
  }
  RETURN_IF_ERROR(file_.Finish());
  std::string digest = file_.HexDigest();
  if (!announced_.empty() && digest != announced_) {
    return absl::DataLossError(
        absl::StrCat("blob checksum mismatch: announced ", announced_,
                     ", received bytes hash to ", digest));
  }
  if (::fsync(fd_.get()) != 0) return FullOrError(errno, "fsync");
  fd_.Reset();
  std::string final_path = store_->PathFor(digest);
  std::string shard = final_path.substr(0, final_path.rfind('/'));
  RETURN_IF_ERROR(MakePrivateDir(shard));
  // rename replaces a blob stored meanwhile by the same bytes: harmless.
  struct stat before;
  const bool had = ::stat(final_path.c_str(), &before) == 0;
  if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
    return ErrnoStatus(errno, "rename", tmp_path_);
  }
  done_ = true;
  if (!had) store_->stored_bytes_ += size_;
  digest_ = std::move(digest);
  return FsyncDir(shard);
}

absl::StatusOr<int64_t> BlobStore::Remove(const std::string& sha256) const {
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", sha256, "' is not a sha256"));
  }
  const std::string path = PathFor(sha256);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return 0;
    return ErrnoStatus(errno, "delete", path);
  }
  stored_bytes_ -= static_cast<int64_t>(st.st_size);
  return static_cast<int64_t>(st.st_size);
}

}  // namespace dlbatch::scheduler
