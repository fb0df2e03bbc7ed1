// Durable files: temp file, fsync, rename (leveldb's habit), and sha256.
#ifndef DLBATCH_COMMON_FILES_H_
#define DLBATCH_COMMON_FILES_H_

#include <openssl/evp.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlbatch {

// Maps errno to a Status whose message names the file and the OS reason;
// ENOSPC and EDQUOT become RESOURCE_EXHAUSTED.
absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path);

// Writes `contents` to `path` so that a crash leaves either the old file or
// the new one: write to PATH.tmp, fsync, rename, fsync the directory.
absl::Status WriteFileAtomic(const std::string& path,
                             absl::string_view contents, uint32_t mode = 0644);
absl::StatusOr<std::string> ReadFile(const std::string& path);

// mkdir -p with `mode` for the folders it creates.
absl::Status MakeDirs(const std::string& path, uint32_t mode = 0755);
absl::Status FsyncDir(const std::string& dir);
// rm -rf; a missing path is not an error.
absl::Status RemoveTree(const std::string& path);

// Incremental sha256. Not thread-safe.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  void Update(absl::string_view data) { Update(data.data(), data.size()); }
  // Lowercase hex; the object is spent afterwards.
  std::string HexDigest();

 private:
  EVP_MD_CTX* ctx_;
};

std::string Sha256Hex(absl::string_view data);
absl::StatusOr<std::string> Sha256File(const std::string& path,
                                       int64_t* size = nullptr);

// "12.3 MB", "512 B".
std::string HumanBytes(int64_t bytes);

// Owns a file descriptor: closes it on destruction. Movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// write(2) until all of `data` is written (EINTR retried).
absl::Status WriteFull(int fd, absl::string_view data, absl::string_view path);
// pread(2) until `size` bytes are read into `buf` or the file ends; returns
// how many were read.
absl::StatusOr<size_t> PreadFull(int fd, char* buf, size_t size, int64_t offset,
                                 absl::string_view path);

// What a file type is called in messages: "a FIFO", "a socket", ...
std::string DescribeFileType(uint32_t st_mode);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_FILES_H_
