#include "scheduler/blob_store.h"

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

// Written bytes are handed to the disk every this many, so the fsync at
// the end waits for the last stretch only, not the whole blob.
constexpr int64_t kWritebackBytes = 16 << 20;

// The direct path's staging buffers: their size (a multiple of any block
// size), and the alignment of addresses, offsets and lengths O_DIRECT asks.
constexpr size_t kStageBytes = 4 << 20;
constexpr size_t kDirectAlign = 4096;

absl::Status MakePrivateDir(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(path, 0700));
  // mkdir's mode is cut by the umask, and an older folder keeps its own.
  if (::chmod(path.c_str(), 0700) != 0)
    return ErrnoStatus(errno, "chmod", path);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StatvfsFree(const std::string& dir) {
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0)
    return ErrnoStatus(errno, "statvfs", dir);
  return static_cast<int64_t>(vfs.f_bavail) *
         static_cast<int64_t>(vfs.f_frsize);
}

}  // namespace

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
  return Open(dir, min_free_bytes, [dir] { return StatvfsFree(dir); });
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
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  bool direct = size >= kDirectMinBytes;
  int fd = direct ? ::open(tmp.c_str(), flags | O_DIRECT, 0600) : -1;
  if (fd < 0) {
    // A filesystem without O_DIRECT (EINVAL) takes the buffered path.
    direct = false;
    fd = ::open(tmp.c_str(), flags, 0600);
  }
  // The writer gives the reservation back, even when it never was.
  auto writer =
      std::unique_ptr<Writer>(new Writer(this, sha256, size, fd, tmp, direct));
  if (fd < 0) {
    writer->done_ = true;  // nothing to remove
    return ErrnoStatus(errno, "create", tmp);
  }
  if (::fchmod(fd, 0600) != 0) return ErrnoStatus(errno, "chmod", tmp);
  return writer;
}

BlobStore::Writer::Writer(BlobStore* store, std::string sha256, int64_t size,
                          int fd, std::string tmp_path, bool direct)
    : store_(store),
      announced_(std::move(sha256)),
      size_(size),
      fd_(fd),
      tmp_path_(std::move(tmp_path)),
      direct_(direct) {
  for (auto& stage : stage_) {
    void* p = nullptr;
    if (!direct_) break;
    if (::posix_memalign(&p, kDirectAlign, kStageBytes) != 0) {
      direct_ = false;  // no memory for staging: write as it comes
      ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_DIRECT);
      break;
    }
    stage.reset(static_cast<char*>(p));
  }
}

BlobStore::Writer::~Writer() {
  (void)WaitFlush();  // the helper thread reads the buffers and the fd
  store_->Release(size_ - written_);
  fd_.Reset();
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
  if (written_ + static_cast<int64_t>(data.size()) > size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the upload is longer than the announced ", size_, " bytes"));
  }
  return direct_ ? AppendStaged(data) : AppendBuffered(data);
}

absl::Status BlobStore::Writer::AppendStaged(absl::string_view data) {
  written_ += static_cast<int64_t>(data.size());
  store_->Release(static_cast<int64_t>(data.size()));
  while (!data.empty()) {
    const size_t n = std::min(kStageBytes - fill_, data.size());
    std::memcpy(stage_[current_].get() + fill_, data.data(), n);
    fill_ += n;
    data.remove_prefix(n);
    if (fill_ == kStageBytes) RETURN_IF_ERROR(FlushStage());
  }
  return absl::OkStatus();
}

absl::Status BlobStore::Writer::FlushStage() {
  RETURN_IF_ERROR(WaitFlush());
  const char* buffer = stage_[current_].get();
  const size_t len = fill_;
  const int64_t offset = file_offset_;
  flushing_ = std::async(std::launch::async, [this, buffer, len, offset] {
    return WriteAt(buffer, len, offset);
  });
  file_offset_ += static_cast<int64_t>(len);
  current_ ^= 1;
  fill_ = 0;
  return absl::OkStatus();
}

absl::Status BlobStore::Writer::WaitFlush() {
  if (!flushing_.valid()) return absl::OkStatus();
  return flushing_.get();
}

absl::Status BlobStore::Writer::WriteAt(const char* data, size_t len,
                                        int64_t offset) {
  hash_.Update(absl::string_view(data, len));  // beside the write
  absl::Status status;
  while (len > 0) {
    ssize_t n = ::pwrite(fd_.get(), data, len, offset);
    if (n < 0 && errno == EINVAL &&
        (::fcntl(fd_.get(), F_GETFL) & O_DIRECT) != 0) {
      // The filesystem took O_DIRECT at open but not for writes.
      ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_DIRECT);
      continue;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      status = FullOrError(errno, "write");
      break;
    }
    data += n;
    len -= static_cast<size_t>(n);
    offset += n;
  }
  hash_.Wait();
  return status;
}

absl::Status BlobStore::Writer::FinishStaged() {
  RETURN_IF_ERROR(WaitFlush());
  const char* buffer = stage_[current_].get();
  const size_t aligned = fill_ / kDirectAlign * kDirectAlign;
  RETURN_IF_ERROR(WriteAt(buffer, aligned, file_offset_));
  file_offset_ += static_cast<int64_t>(aligned);
  if (fill_ > aligned) {
    // O_DIRECT takes whole blocks only; the tail goes through the cache.
    ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_DIRECT);
    RETURN_IF_ERROR(WriteAt(buffer + aligned, fill_ - aligned, file_offset_));
    file_offset_ += static_cast<int64_t>(fill_ - aligned);
  }
  fill_ = 0;
  return absl::OkStatus();
}

absl::Status BlobStore::Writer::AppendBuffered(absl::string_view data) {
  // Hashed on a helper thread while written; done before `data` goes.
  hash_.Update(data);
  while (!data.empty()) {
    ssize_t n = ::write(fd_.get(), data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      hash_.Wait();
      return FullOrError(errno, "write");
    }
    written_ += n;
    store_->Release(n);  // on disk now, seen by statvfs
    data.remove_prefix(static_cast<size_t>(n));
  }
  hash_.Wait();
  if (written_ - flushed_ >= kWritebackBytes) {
    // Start writeback of the stretch; returns without waiting for it.
    ::sync_file_range(fd_.get(), flushed_, written_ - flushed_,
                      SYNC_FILE_RANGE_WRITE);
    flushed_ = written_;
  }
  return absl::OkStatus();
}

absl::Status BlobStore::Writer::Commit() {
  if (written_ != size_) {
    return absl::DataLossError(absl::StrCat("the upload ended early: received ",
                                            written_, " of ", size_, " bytes"));
  }
  if (direct_) RETURN_IF_ERROR(FinishStaged());
  std::string digest = hash_.HexDigest();
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
