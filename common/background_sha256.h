// Sha256 fed on a helper thread, so hashing one buffer overlaps reading,
// sending or writing the next (blob transfers hash every byte they move).
#ifndef DLBATCH_COMMON_BACKGROUND_SHA256_H_
#define DLBATCH_COMMON_BACKGROUND_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/files.h"
#include "common/helper_thread.h"

namespace dlbatch {

// Not thread-safe itself: one owner calls it.
class BackgroundSha256 {
 public:
  BackgroundSha256() = default;
  ~BackgroundSha256() = default;  // the helper waits for its task
  BackgroundSha256(const BackgroundSha256&) = delete;
  BackgroundSha256& operator=(const BackgroundSha256&) = delete;

  // Waits for the previous update, then hashes `data` in the background.
  // REQUIRES: `data` stays alive and unchanged until the next Update, Wait
  // or HexDigest returns.
  void Update(absl::string_view data) {
    helper_.Run([this, data] { hash_.Update(data); });
  }
  // Waits for the update in flight.
  void Wait() { helper_.Wait(); }
  // Lowercase hex of everything updated; the object is spent afterwards.
  std::string HexDigest() {
    Wait();
    return hash_.HexDigest();
  }

 private:
  Sha256 hash_;
  HelperThread helper_;  // last: its task uses hash_
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_BACKGROUND_SHA256_H_
