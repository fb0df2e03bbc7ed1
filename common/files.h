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

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_FILES_H_
