// DiskGuard's full mode: entered on a failed write or a nearly full disk,
// left only once there is room, never in a loop with the write that failed.
#include "scheduler/disk_guard.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace dlbatch::scheduler {
namespace {

constexpr int64_t kReserve = 1 << 20;

class DiskGuardTest : public ::testing::Test {
 protected:
  DiskGuard guard_{"", kReserve,
                   [this]() -> absl::StatusOr<int64_t> { return free_; }};
  int64_t free_ = 100 * kReserve;
};

TEST_F(DiskGuardTest, NearlyFullEntersAndRoomLeaves) {
  guard_.Start();
  EXPECT_FALSE(guard_.full());
  free_ = kReserve / 4;
  EXPECT_TRUE(guard_.Check());
  EXPECT_TRUE(guard_.full());
  free_ = kReserve;  // not yet twice the reserve
  EXPECT_FALSE(guard_.Check());
  EXPECT_TRUE(guard_.full());
  free_ = 2 * kReserve;
  EXPECT_TRUE(guard_.Check());
  EXPECT_FALSE(guard_.full());
}

// A large write fails with several reserves still free: the guard must not
// leave full mode at once (the same write would come back and fail again),
// only when space has grown by a reserve's worth since.
TEST_F(DiskGuardTest, AWriteThatFailedWithRoomLeftIsNotRetriedInALoop) {
  guard_.Start();
  free_ = 3 * kReserve;
  guard_.NoteFull(absl::ResourceExhaustedError("database or disk is full"));
  EXPECT_TRUE(guard_.full());
  EXPECT_FALSE(guard_.Check());
  EXPECT_TRUE(guard_.full());
  free_ = 3 * kReserve + kReserve / 2;
  EXPECT_FALSE(guard_.Check());
  EXPECT_TRUE(guard_.full());
  free_ = 4 * kReserve;
  EXPECT_TRUE(guard_.Check());
  EXPECT_FALSE(guard_.full());
  EXPECT_NE(guard_.Reason().find("resumes by itself"), std::string::npos);
}

}  // namespace
}  // namespace dlbatch::scheduler
