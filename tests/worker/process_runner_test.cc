// The real runner: its loop thread is joined once however many threads
// shut it down at once.
#include "worker/process_runner.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

class CountingEvents : public ProcessEvents {
 public:
  void ProcessStarted(int64_t, absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ++started_;
    ok_ = ok_ && status.ok();
  }
  void ProcessLine(int64_t, const OutputLine&) override {}
  void ProcessExited(int64_t, const ExitInfo&) override {}
  bool WaitStarted(int n) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return started_ >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
    return started_ >= n && ok_;
  }

 private:
  absl::Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
};

// Two threads shut the runner down at the same moment while a job runs,
// then the runner is destroyed, as a signalled worker does. Each round
// must end: a hang here is a second join of the loop thread.
TEST(SubprocessRunnerTest, ShutdownsFromTwoThreadsAtOnceBothReturn) {
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) {
      ADD_FAILURE() << "shutting the runner down from two threads hung";
      _exit(1);
    }
  });
  for (int round = 0; round < 30; ++round) {
    CountingEvents events;
    auto runner = std::make_unique<SubprocessRunner>(SystemClock::Get());
    runner->Attach(&events);
    SubprocessOptions job;
    job.argv = {"sleep", "30"};
    runner->Start(1, job);
    ASSERT_TRUE(events.WaitStarted(1));
    std::atomic<int> go{0};
    auto stop = [&] {
      go.fetch_add(1);
      while (go.load() < 2) {
      }
      runner->Shutdown();
    };
    std::thread a(stop);
    std::thread b(stop);
    a.join();
    b.join();
    runner.reset();  // shuts down once more, as the destructor does
  }
  done = true;
  watchdog.join();
}

}  // namespace
}  // namespace dlbatch::worker
