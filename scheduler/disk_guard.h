// The state folder's free space, so that a full disk makes the scheduler
// refuse new writes instead of dying.
//
// A reserve file of `reserve_bytes` sits in the folder while there is room.
// When a write fails for lack of space (or free space falls under the
// reserve), the guard enters full mode and gives the reserve up, so the
// scheduler's own small state changes (a job ending, a cancel) still fit
// while it refuses what grows without bound (submits, diary lines). It
// leaves full mode by itself once the folder has room for the reserve
// twice over again and, after a failed write, a reserve's worth more than
// it had when that write failed (else a large write that failed with room
// left would fail again at once, in a loop). Thread-safe.
#ifndef DLBATCH_SCHEDULER_DISK_GUARD_H_
#define DLBATCH_SCHEDULER_DISK_GUARD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::scheduler {

class DiskGuard {
 public:
  // Bytes free on the folder's filesystem for an unprivileged writer.
  using FreeBytesFn = std::function<absl::StatusOr<int64_t>()>;

  // dir empty: no folder is watched (tests); full mode then comes only from
  // NoteFull and ends at the next Check. free_bytes empty: statvfs(dir).
  DiskGuard(std::string dir, int64_t reserve_bytes,
            FreeBytesFn free_bytes = {});

  // Makes the reserve if there is room, else starts in full mode.
  void Start();
  bool full() const;
  // Why writes are refused and what to do, for replies and logs.
  std::string Reason() const;
  // A write failed for lack of space: full mode, the reserve given up.
  void NoteFull(const absl::Status& why);
  // Enters or leaves full mode by the free space now (see the header
  // comment). Returns true if the mode changed.
  bool Check();

 private:
  bool MakeReserveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropReserveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> FreeBytes() const;

  const std::string dir_;
  const std::string reserve_path_;
  const int64_t reserve_bytes_;
  const FreeBytesFn free_bytes_;
  mutable absl::Mutex mu_;
  bool full_ ABSL_GUARDED_BY(mu_) = false;
  bool reserve_held_ ABSL_GUARDED_BY(mu_) = false;
  std::string why_ ABSL_GUARDED_BY(mu_);
  int64_t free_seen_ ABSL_GUARDED_BY(mu_) = -1;
  // Free bytes needed to leave full mode besides twice the reserve (0: none).
  int64_t leave_at_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_DISK_GUARD_H_
