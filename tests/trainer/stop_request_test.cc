// The trainer's stop request: the signal's handler (held until it is in
// place, then a flag) and the ranks' agreement on it (one allreduce).
#include "trainer/stop_request.h"

#include <signal.h>

#include <memory>
#include <thread>
#include <vector>

#include "common/stop_signals.h"
#include "gtest/gtest.h"
#include "trainer/backend.h"
#include "trainer/comm/thread_group.h"

namespace dlbatch::trainer {
namespace {

// One test: the flag is the process's, and is never cleared.
TEST(StopRequest, ARequestHeldUntilTheHandlerIsInPlaceSetsTheFlag) {
  HoldStopRequests();
  ASSERT_EQ(raise(kTrainerStopSignal), 0);
  // Pending, not delivered: the process did not end, the flag is unset.
  EXPECT_FALSE(StopRequestFlag()->load());
  InstallStopRequestHandler();
  EXPECT_TRUE(StopRequestFlag()->load());
  // Another request only sets it again.
  ASSERT_EQ(raise(kTrainerStopSignal), 0);
  EXPECT_TRUE(StopRequestFlag()->load());
}

// Each rank on a thread of its own with a CPU backend, as thread ranks
// train; what AgreeToStop returned on each, given what each was asked.
std::vector<bool> Agree(const std::vector<bool>& asked) {
  const int n = static_cast<int>(asked.size());
  ThreadGroup group(n, absl::Seconds(60));
  std::vector<int> agreed(n, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCpuBackend(1);
      ASSERT_TRUE(backend.ok()) << backend.status();
      absl::StatusOr<Buffer> flag = (*backend)->Allocate(sizeof(float));
      ASSERT_TRUE(flag.ok()) << flag.status();
      absl::StatusOr<bool> stop =
          AgreeToStop(asked[r], *group.communicator(r), **backend, flag->f32());
      ASSERT_TRUE(stop.ok()) << stop.status();
      agreed[r] = *stop;
    });
  }
  for (std::thread& t : ranks) t.join();
  return std::vector<bool>(agreed.begin(), agreed.end());
}

TEST(StopRequest, RanksStopWhenAnyOfThemWasAsked) {
  EXPECT_EQ(Agree({false, true, false}), std::vector<bool>(3, true));
  EXPECT_EQ(Agree({true, true}), std::vector<bool>(2, true));
  EXPECT_EQ(Agree({false, false, false}), std::vector<bool>(3, false));
  // One rank alone takes its own flag.
  EXPECT_EQ(Agree({true}), std::vector<bool>{true});
  EXPECT_EQ(Agree({false}), std::vector<bool>{false});
}

}  // namespace
}  // namespace dlbatch::trainer
