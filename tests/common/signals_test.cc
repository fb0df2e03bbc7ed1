// The daemons' stop signals: blocked everywhere, taken by one thread.
#include "common/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace dlbatch {
namespace {

TEST(SignalsTest, BlockStopSignalsBlocksThemForLaterThreadsAndIgnoresSigpipe) {
  BlockStopSignals();
  sigset_t mask;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, nullptr, &mask), 0);
  EXPECT_EQ(sigismember(&mask, SIGTERM), 1);
  EXPECT_EQ(sigismember(&mask, SIGINT), 1);
  // A thread started afterwards inherits the mask.
  sigset_t child;
  std::thread([&] { pthread_sigmask(SIG_BLOCK, nullptr, &child); }).join();
  EXPECT_EQ(sigismember(&child, SIGTERM), 1);
  struct sigaction pipe {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &pipe), 0);
  EXPECT_EQ(pipe.sa_handler, SIG_IGN);
}

// A SIGTERM sent to the process reaches the waiting thread's callback, once,
// with its number; the process goes on.
TEST(SignalsTest, OnStopSignalCallsBackWithTheSignal) {
  BlockStopSignals();
  std::promise<int> got;
  OnStopSignal([&got](int sig) { got.set_value(sig); });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  std::future<int> f = got.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(f.get(), SIGTERM);
}

}  // namespace
}  // namespace dlbatch
