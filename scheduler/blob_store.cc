#include "scheduler/blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dlbatch::scheduler {

bool IsSha256Hex(absl::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(
    const std::string& dir, int64_t min_free_bytes) {
  RETURN_IF_ERROR(MakeDirs(dir + "/tmp", 0700));
  // Uploads interrupted by a crash leave temp files; none is in use now.
  RETURN_IF_ERROR(RemoveTree(dir + "/tmp"));
  RETURN_IF_ERROR(MakeDirs(dir + "/tmp", 0700));
  return std::unique_ptr<BlobStore>(new BlobStore(dir, min_free_bytes));
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

absl::StatusOr<std::unique_ptr<BlobStore::Writer>> BlobStore::NewWriter(
    const std::string& sha256, int64_t size) const {
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", sha256, "' is not a sha256"));
  }
  if (size < 0) return absl::InvalidArgumentError("negative blob size");
  struct statvfs vfs;
  if (::statvfs(dir_.c_str(), &vfs) == 0) {
    int64_t free_bytes =
        static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    if (free_bytes - size < min_free_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the scheduler's store is full: ", HumanBytes(free_bytes),
          " free in ", dir_, ", the file needs ", HumanBytes(size), " and ",
          HumanBytes(min_free_bytes_),
          " are kept in reserve; free space there or move --state-dir"));
    }
  }
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(dir_, "/tmp/", sha256, ".", ::getpid(), ".",
                                 counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "create", tmp);
  return std::unique_ptr<Writer>(
      new Writer(this, sha256, size, fd, std::move(tmp)));
}

BlobStore::Writer::Writer(const BlobStore* store, std::string sha256,
                          int64_t size, int fd, std::string tmp_path)
    : store_(store),
      sha256_(std::move(sha256)),
      size_(size),
      fd_(fd),
      tmp_path_(std::move(tmp_path)) {}

BlobStore::Writer::~Writer() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(tmp_path_.c_str());
}

absl::Status BlobStore::Writer::Append(absl::string_view data) {
  if (written_ + static_cast<int64_t>(data.size()) > size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "blob ", sha256_, " is longer than the announced ", size_, " bytes"));
  }
  hash_.Update(data);
  while (!data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      if (err == ENOSPC || err == EDQUOT) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the scheduler's store is full (", std::strerror(err), " writing ",
            store_->dir_, "); free space there or move --state-dir"));
      }
      return ErrnoStatus(err, "write", tmp_path_);
    }
    written_ += n;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status BlobStore::Writer::Commit() {
  if (written_ != size_) {
    return absl::DataLossError(absl::StrCat("blob ", sha256_, ": received ",
                                            written_, " of ", size_, " bytes"));
  }
  std::string digest = hash_.HexDigest();
  if (digest != sha256_) {
    return absl::DataLossError(
        absl::StrCat("blob checksum mismatch: announced ", sha256_,
                     ", received bytes hash to ", digest));
  }
  if (::fsync(fd_) != 0) {
    int err = errno;
    if (err == ENOSPC || err == EDQUOT) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the scheduler's store is full (", std::strerror(err),
                       "); free space in ", store_->dir_));
    }
    return ErrnoStatus(err, "fsync", tmp_path_);
  }
  ::close(fd_);
  fd_ = -1;
  std::string final_path = store_->PathFor(sha256_);
  std::string shard = final_path.substr(0, final_path.rfind('/'));
  RETURN_IF_ERROR(MakeDirs(shard, 0700));
  if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
    return ErrnoStatus(errno, "rename", tmp_path_);
  }
  done_ = true;
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
  return static_cast<int64_t>(st.st_size);
}

}  // namespace dlbatch::scheduler
