// The trainer's stop request: the signal held until it can be taken, then
// a flag set by the thread that alone takes it (never one that computes),
// and the ranks' agreement on it (one allreduce).
#include "trainer/stop_request.h"

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "common/stop_signals.h"
#include "gtest/gtest.h"
#include "trainer/backend.h"
#include "trainer/comm/thread_group.h"
#include "trainer/network.h"

namespace dlbatch::trainer {
namespace {

// One test: the flag is the process's, and is never cleared.
TEST(StopRequest, ARequestHeldUntilItIsTakenSetsTheFlag) {
  HoldStopRequests();
  ASSERT_EQ(kill(getpid(), kTrainerStopSignal), 0);
  // Pending, not delivered: the process did not end, the flag is unset.
  EXPECT_FALSE(StopRequestFlag()->load());
  TakeStopRequests();
  // The request already pending is taken before this returns.
  EXPECT_TRUE(StopRequestFlag()->load());
  // Another request only sets it again.
  ASSERT_EQ(kill(getpid(), kTrainerStopSignal), 0);
  EXPECT_TRUE(StopRequestFlag()->load());
}

v1::LayerSpec Layer(const std::string& type, int size = 0) {
  v1::LayerSpec l;
  l.set_type(type);
  l.set_size(size);
  return l;
}

// A rank's work while it is asked to stop, over and over (a worker's
// request comes at any moment of a step): LeNet's steps on the CPU, whose
// oneDNN kernels point the stack register into heap buffers while they
// run, with the heap in use around them. The requests come from a thread
// that holds them, as every thread of a rank but the one that takes them
// does. Exits 0 if the flag was set and the heap survived; a request
// taken on the computing thread writes its signal frame into the heap, and
// glibc aborts ("corrupted size vs. prev_size", "corrupted double-linked
// list") or a step faults.
[[noreturn]] void StepWhileAskedToStop() {
  HoldStopRequests();
  std::atomic<bool> done{false};
  std::thread asker([&] {
    while (!done.load()) {
      kill(getpid(), kTrainerStopSignal);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  TakeStopRequests();
  v1::NetworkSpec spec;
  for (int d : {28, 28, 1}) spec.add_input(d);
  v1::LayerSpec conv1 = Layer("conv", 5), conv2 = Layer("conv", 5);
  conv1.set_filters(20);
  conv2.set_filters(50);
  v1::LayerSpec fc1 = Layer("fc"), fc2 = Layer("fc");
  fc1.set_units(500);
  fc2.set_units(10);
  for (const v1::LayerSpec& l :
       {conv1, Layer("maxpool", 2), conv2, Layer("maxpool", 2), fc1,
        Layer("relu"), fc2, Layer("softmax")}) {
    *spec.add_layers() = l;
  }
  constexpr int kBatch = 64;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCpuBackend(1);
  if (!backend.ok()) std::_Exit(10);
  absl::StatusOr<std::unique_ptr<Network>> net =
      Network::Build(spec, backend->get(), kBatch);
  if (!net.ok()) std::_Exit(11);
  (*net)->Initialize(1);
  std::vector<float> host_images(kBatch * 28 * 28);
  std::vector<int32_t> host_labels(kBatch);
  for (size_t i = 0; i < host_images.size(); ++i) {
    host_images[i] = static_cast<float>(i % 255) / 255.0f;
  }
  for (int i = 0; i < kBatch; ++i) host_labels[i] = i % 10;
  absl::StatusOr<Buffer> images =
      (*backend)->Allocate(host_images.size() * sizeof(float));
  absl::StatusOr<Buffer> labels = (*backend)->Allocate(kBatch * 4);
  absl::StatusOr<Buffer> stats = (*backend)->Allocate(2 * sizeof(float));
  if (!images.ok() || !labels.ok() || !stats.ok()) std::_Exit(12);
  (*backend)->CopyToDevice(images->f32(), host_images.data(),
                           host_images.size() * sizeof(float));
  (*backend)->CopyToDevice(labels->as<int32_t>(), host_labels.data(),
                           kBatch * 4);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int step = 0; std::chrono::steady_clock::now() < until; ++step) {
    (*net)->Forward(kBatch, images->f32(), /*training=*/true);
    (*backend)->Fill(stats->f32(), 2, 0);
    (*net)->Loss(kBatch, labels->as<int32_t>(), stats->f32());
    (*net)->Backward(kBatch, labels->as<int32_t>(), 1.0f / kBatch);
    // The heap in use around the steps, as a run's batches, history and
    // checkpoint use it: small and large blocks freed and made again.
    std::vector<std::vector<char>> blocks;
    for (int i = 0; i < 16; ++i) blocks.emplace_back((i + 1) * 997 + step);
    blocks.emplace_back(200000);
  }
  done.store(true);
  asker.join();
  malloc_trim(0);  // consolidates the heap: finds what a frame overwrote
  std::_Exit(StopRequestFlag()->load() ? 0 : 13);
}

TEST(StopRequest, RequestsDuringStepsLeaveTheComputingThreadAlone) {
  // A process of its own, started afresh: taking the requests is the
  // process's set-up, and its threads are those it starts.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(StepWhileAskedToStop(), ::testing::ExitedWithCode(0), "");
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
