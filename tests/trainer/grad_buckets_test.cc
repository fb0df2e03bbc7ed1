// Gradient buckets: where buckets begin and end, that every gradient is
// summed exactly once, errors; the network's ready ranges; and two Gloo
// ranks (threads) whose bucketed step equals the blocking one.
#include "trainer/comm/grad_buckets.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_util.h"
#include "tests/trainer/thread_ranks.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/network.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using testing::CpuBackendTest;
using testing::DeviceArray;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testing::RandomVector;
using testing::RunThreadRanks;

// Records what is started and waited for; fails where told to.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(const float* base) : base_(base) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status AllreduceSum(float*, int64_t) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(float*, int64_t, int) override {
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::Status StartAllreduceSum(float* data, int64_t count) override {
    starts.emplace_back(data - base_, count);
    ++in_flight;
    if (static_cast<int>(starts.size()) == fail_start) {
      return absl::UnavailableError("start: a peer is gone");
    }
    return absl::OkStatus();
  }
  absl::Status WaitAll() override {
    ++waits;
    in_flight = 0;
    return fail_wait ? absl::DeadlineExceededError("wait: a peer is silent")
                     : absl::OkStatus();
  }

  std::vector<std::pair<int64_t, int64_t>> starts;  // (offset, count)
  int in_flight = 0;
  int waits = 0;
  int fail_start = 0;  // 1-based; 0: never
  bool fail_wait = false;

 private:
  const float* base_;
};

// How often each element was started; checks no start overlaps the buffer's
// end.
std::vector<int> Coverage(
    const std::vector<std::pair<int64_t, int64_t>>& starts, int64_t count) {
  std::vector<int> times(count, 0);
  for (const auto& [first, n] : starts) {
    EXPECT_GE(first, 0);
    EXPECT_LE(first + n, count);
    for (int64_t i = std::max<int64_t>(first, 0);
         i < std::min(first + n, count); ++i) {
      ++times[i];
    }
  }
  return times;
}

void ExpectEachElementOnce(
    const std::vector<std::pair<int64_t, int64_t>>& starts, int64_t count) {
  const std::vector<int> times = Coverage(starts, count);
  EXPECT_EQ(std::count(times.begin(), times.end(), 1), count)
      << "elements started other than once";
}

TEST(GradientBuckets, RangesFromTheEndFillBucketsAndTheRestGoesAtFinish) {
  std::vector<float> grads(100);
  RecordingCommunicator comm(grads.data());
  GradientBuckets buckets(&comm, grads.data(), 100, 30);
  buckets.Ready(90, 10);
  buckets.Ready(70, 20);  // [70, 100): 30, a bucket
  EXPECT_THAT(comm.starts, ElementsAre(Pair(70, 30)));
  buckets.Ready(60, 10);
  buckets.Ready(50, 10);
  buckets.Ready(45, 5);  // [45, 70): 25, not yet
  EXPECT_EQ(comm.starts.size(), 1u);
  buckets.Ready(20, 25);  // [20, 70): 50, one bucket however large
  buckets.Ready(0, 20);   // the rest
  EXPECT_THAT(comm.starts, ElementsAre(Pair(70, 30), Pair(20, 50)));
  EXPECT_EQ(comm.waits, 0);
  ASSERT_TRUE(buckets.Finish().ok());
  EXPECT_THAT(comm.starts,
              ElementsAre(Pair(70, 30), Pair(20, 50), Pair(0, 20)));
  EXPECT_EQ(comm.waits, 1);
  EXPECT_EQ(buckets.started(), comm.starts);
  ExpectEachElementOnce(comm.starts, 100);
}

// The network's layout: weights [0, 80), then biases [80, 100). Backward
// finishes layer 3, 2, 1, each a weight range and a bias range.
TEST(GradientBuckets, WeightsAndBiasesGrowAsTwoRuns) {
  std::vector<float> grads(100);
  RecordingCommunicator comm(grads.data());
  GradientBuckets buckets(&comm, grads.data(), 100, 40);
  buckets.Ready(50, 30);  // layer 3's weights
  buckets.Ready(95, 5);   // and bias: not adjacent, two runs
  EXPECT_TRUE(comm.starts.empty());
  buckets.Ready(20, 30);  // layer 2's weights: [20, 80) is a bucket
  EXPECT_THAT(comm.starts, ElementsAre(Pair(20, 60)));
  buckets.Ready(88, 7);
  buckets.Ready(0, 20);
  buckets.Ready(80, 8);  // [80, 100); [0, 20) stays apart from the sent run
  EXPECT_EQ(comm.starts.size(), 1u);
  ASSERT_TRUE(buckets.Finish().ok());
  // What is left, highest first, as backward finished it.
  EXPECT_THAT(comm.starts,
              ElementsAre(Pair(20, 60), Pair(80, 20), Pair(0, 20)));
  ExpectEachElementOnce(comm.starts, 100);
}

TEST(GradientBuckets, EverySplitAndOrderSumsEachElementOnce) {
  Rng rng(Key(11, 3));
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t count = 1 + static_cast<int64_t>(rng.Below(400));
    const int64_t bucket = 1 + static_cast<int64_t>(rng.Below(150));
    // Random pieces, reported in a random order, a few left out.
    std::vector<std::pair<int64_t, int64_t>> pieces;
    for (int64_t at = 0; at < count;) {
      const int64_t n = std::min<int64_t>(
          count - at, 1 + static_cast<int64_t>(rng.Below(40)));
      pieces.emplace_back(at, n);
      at += n;
    }
    for (size_t i = pieces.size(); i > 1; --i) {
      std::swap(pieces[i - 1], pieces[rng.Below(i)]);
    }
    std::vector<float> grads(count);
    RecordingCommunicator comm(grads.data());
    GradientBuckets buckets(&comm, grads.data(), count, bucket);
    for (int step = 0; step < 2; ++step) {
      comm.starts.clear();
      for (const auto& [first, n] : pieces) {
        if (rng.Below(10) == 0) continue;  // never reported
        const size_t before = comm.starts.size();
        buckets.Ready(first, n);
        // A start during backward is a full bucket holding this piece.
        if (comm.starts.size() > before) {
          const auto [s, sn] = comm.starts.back();
          EXPECT_GE(sn, bucket);
          EXPECT_LE(s, first);
          EXPECT_GE(s + sn, first + n);
        }
      }
      ASSERT_TRUE(buckets.Finish().ok());
      ExpectEachElementOnce(comm.starts, count);
    }
  }
}

TEST(GradientBuckets, TheSameRangesStartTheSameBucketsEveryStep) {
  std::vector<float> grads(64);
  RecordingCommunicator comm(grads.data());
  GradientBuckets buckets(&comm, grads.data(), 64, 16);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> steps;
  for (int step = 0; step < 3; ++step) {
    for (int64_t first = 56; first >= 0; first -= 8) buckets.Ready(first, 8);
    ASSERT_TRUE(buckets.Finish().ok());
    steps.push_back(buckets.started());
  }
  EXPECT_THAT(steps[0], ElementsAre(Pair(48, 16), Pair(32, 16), Pair(16, 16),
                                    Pair(0, 16)));
  EXPECT_EQ(steps[1], steps[0]);
  EXPECT_EQ(steps[2], steps[0]);
  EXPECT_EQ(comm.waits, 3);
}

TEST(GradientBuckets, BadRangesAreInternalErrorsYetEveryElementIsSummed) {
  std::vector<float> grads(50);
  RecordingCommunicator comm(grads.data());
  GradientBuckets buckets(&comm, grads.data(), 50, 1000);
  buckets.Ready(40, 10);
  buckets.Ready(45, 10);  // past the end
  buckets.Ready(35, 10);  // overlaps [40, 50)
  buckets.Ready(-1, 2);
  absl::Status s = buckets.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("[45, 55)"));
  EXPECT_THAT(s.message(), HasSubstr("the network's ranges are wrong"));
  ExpectEachElementOnce(comm.starts, 50);
  // The next step starts clean.
  buckets.Ready(0, 50);
  EXPECT_TRUE(buckets.Finish().ok());
}

TEST(GradientBuckets, AFailedStartEndsTheStepWithItsError) {
  std::vector<float> grads(40);
  RecordingCommunicator comm(grads.data());
  comm.fail_start = 2;
  GradientBuckets buckets(&comm, grads.data(), 40, 10);
  for (int64_t first = 30; first >= 0; first -= 10) buckets.Ready(first, 10);
  absl::Status s = buckets.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("a peer is gone"));
  // Nothing after the failed one, but what was started is waited for.
  EXPECT_EQ(comm.starts.size(), 2u);
  EXPECT_EQ(comm.waits, 1);
}

TEST(GradientBuckets, AFailedWaitIsTheStepsError) {
  std::vector<float> grads(10);
  RecordingCommunicator comm(grads.data());
  comm.fail_wait = true;
  GradientBuckets buckets(&comm, grads.data(), 10, 4);
  buckets.Ready(0, 10);
  absl::Status s = buckets.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("a peer is silent"));
}

TEST(GradientBuckets, LeavingAStepEarlyStillWaitsForItsAllreduces) {
  std::vector<float> grads(10);
  RecordingCommunicator comm(grads.data());
  {
    GradientBuckets buckets(&comm, grads.data(), 10, 4);
    buckets.Ready(0, 10);
    EXPECT_EQ(comm.in_flight, 1);
  }
  EXPECT_EQ(comm.in_flight, 0);
  EXPECT_EQ(comm.waits, 1);
  {
    // Nothing to sum (a network without parameters): nothing to wait for.
    GradientBuckets empty(&comm, grads.data(), 0, 4);
    EXPECT_TRUE(empty.Finish().ok());
  }
  EXPECT_EQ(comm.waits, 1);
  EXPECT_EQ(comm.starts.size(), 1u);
}

TEST(GradientBuckets, DefaultSizes) {
  EXPECT_EQ(DefaultBucketFloats(true), (4 << 20) / 4);
  EXPECT_EQ(DefaultBucketFloats(false), (1 << 20) / 4);
}

// --- the network's ready ranges ---

// conv -> batchnorm -> relu -> maxpool -> conv -> relu -> fc -> softmax.
v1::NetworkSpec MixedNet(bool sync) {
  v1::NetworkSpec spec;
  for (int d : {8, 8, 2}) spec.add_input(d);
  auto* conv = spec.add_layers();
  conv->set_type("conv");
  conv->set_filters(4);
  conv->set_size(3);
  auto* bn = spec.add_layers();
  bn->set_type("batchnorm");
  bn->set_sync(sync);
  spec.add_layers()->set_type("relu");
  auto* pool = spec.add_layers();
  pool->set_type("maxpool");
  pool->set_size(2);
  auto* conv2 = spec.add_layers();
  conv2->set_type("conv");
  conv2->set_filters(6);
  conv2->set_size(3);
  auto* bn2 = spec.add_layers();
  bn2->set_type("batchnorm");
  bn2->set_sync(sync);
  spec.add_layers()->set_type("relu");
  auto* fc = spec.add_layers();
  fc->set_type("fc");
  fc->set_units(5);
  spec.add_layers()->set_type("softmax");
  return spec;
}

using NetworkGradsReady = CpuBackendTest;

TEST_F(NetworkGradsReady, EachGradientOnceFinalWhenReportedLastLayerFirst) {
  auto net = Network::Build(MixedNet(false), backend_.get(), 4);
  ASSERT_TRUE(net.ok()) << net.status();
  Network& n = **net;
  n.Initialize(3);
  DeviceArray x(backend_.get(), RandomVector(4 * 8 * 8 * 2, 5));
  Buffer labels = *backend_->Allocate(4 * sizeof(int32_t));
  const int32_t host_labels[4] = {0, 3, 1, 4};
  backend_->CopyToDevice(labels.as<int32_t>(), host_labels,
                         sizeof(host_labels));

  n.Forward(4, x.data(), /*training=*/true);
  n.Backward(4, labels.as<int32_t>(), 0.25f);
  std::vector<float> plain(n.num_params());
  backend_->CopyToHost(plain.data(), n.grads(), plain.size() * sizeof(float));
  backend_->Fill(n.grads(), n.num_params(), 7.0f);  // stale values must go

  // What each range held when reported: on the CPU, final means written.
  struct Reported {
    int64_t first, count;
    std::vector<float> values;
  };
  std::vector<Reported> reported;
  n.Forward(4, x.data(), /*training=*/true);
  n.Backward(4, labels.as<int32_t>(), 0.25f, [&](int64_t first, int64_t count) {
    Reported r{first, count, std::vector<float>(count)};
    backend_->CopyToHost(r.values.data(), n.grads() + first,
                         count * sizeof(float));
    reported.push_back(std::move(r));
  });
  std::vector<float> hooked(n.num_params());
  backend_->CopyToHost(hooked.data(), n.grads(), hooked.size() * sizeof(float));
  EXPECT_EQ(hooked, plain);

  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const Reported& r : reported) {
    ranges.emplace_back(r.first, r.count);
    EXPECT_EQ(r.values, std::vector<float>(plain.begin() + r.first,
                                           plain.begin() + r.first + r.count))
        << "range [" << r.first << ", " << r.first + r.count
        << ") changed after it was reported";
  }
  ExpectEachElementOnce(ranges, n.num_params());
  // Layer by layer, last first: the layer owning each range never rises.
  auto layer_of = [&](int64_t offset) {
    for (const ParamInfo& p : n.params_info()) {
      if (offset >= p.offset && offset < p.offset + p.count) return p.layer;
    }
    return -1;
  };
  int last = 1 << 30;
  for (const auto& [first, count] : ranges) {
    const int layer = layer_of(first);
    EXPECT_EQ(layer, layer_of(first + count - 1)) << "a range spans layers";
    EXPECT_LE(layer, last);
    last = layer;
  }
  // conv, batchnorm, conv, batchnorm, fc: weight and bias apart for conv
  // and fc, batchnorm's scale and offset together.
  EXPECT_EQ(ranges.size(), 8u);
}

// --- two Gloo ranks ---

struct RankStep {
  std::vector<float> bucketed, blocking;
  std::vector<std::pair<int64_t, int64_t>> buckets;
};

// One rank's step of `spec` on its half of the batch, twice: with its
// gradients summed in buckets of `bucket_floats` while backward runs, and
// with one blocking allreduce after it.
absl::Status RankSteps(const v1::NetworkSpec& spec, Communicator* comm,
                       int64_t bucket_floats, RankStep* out) {
  auto backend = MakeCpuBackend(1);
  if (!backend.ok()) return backend.status();
  Backend& b = **backend;
  constexpr int kHalf = 4;
  auto net = Network::Build(spec, &b, kHalf, comm);
  if (!net.ok()) return net.status();
  Network& n = **net;
  n.Initialize(9);
  std::vector<float> images = RandomVector(2 * kHalf * 8 * 8 * 2, 21, 0, 1);
  images.erase(images.begin(), images.begin() + comm->rank() * kHalf * 128);
  images.resize(kHalf * 128);
  DeviceArray x(&b, images);
  Buffer labels = *b.Allocate(kHalf * sizeof(int32_t));
  const int32_t host_labels[2][kHalf] = {{0, 1, 2, 3}, {4, 0, 2, 2}};
  b.CopyToDevice(labels.as<int32_t>(), host_labels[comm->rank()],
                 sizeof(host_labels[0]));

  // Synchronised batchnorm shifts its sums by the running mean, which the
  // first step moves: the second starts from the same state.
  std::vector<float> state(n.state_size());
  b.CopyToHost(state.data(), n.state(), state.size() * sizeof(float));

  GradientBuckets buckets(comm, n.grads(), n.num_params(), bucket_floats);
  n.Forward(kHalf, x.data(), /*training=*/true);
  n.Backward(kHalf, labels.as<int32_t>(), 0.125f, buckets.ReadyFn());
  if (absl::Status s = n.collective_status(); !s.ok()) return s;
  if (absl::Status s = buckets.Finish(); !s.ok()) return s;
  out->buckets = buckets.started();
  out->bucketed.resize(n.num_params());
  b.CopyToHost(out->bucketed.data(), n.grads(), n.num_params() * 4);

  b.CopyToDevice(n.state(), state.data(), state.size() * sizeof(float));
  n.Forward(kHalf, x.data(), /*training=*/true);
  n.Backward(kHalf, labels.as<int32_t>(), 0.125f);
  if (absl::Status s = n.collective_status(); !s.ok()) return s;
  if (absl::Status s = comm->AllreduceSum(n.grads(), n.num_params()); !s.ok()) {
    return s;
  }
  out->blocking.resize(n.num_params());
  b.CopyToHost(out->blocking.data(), n.grads(), n.num_params() * 4);
  return comm->Barrier();
}

class TwoGlooRanks : public ::testing::TestWithParam<bool> {};

// Buckets of 8 floats: many allreduces in flight on the communicator's
// thread while backward goes on, synchronised batchnorm's own allreduces
// (GetParam) queued between them.
TEST_P(TwoGlooRanks, BucketedStepSumsAsTheBlockingOne) {
  const v1::NetworkSpec spec = MixedNet(/*sync=*/GetParam());
  RankStep steps[2];
  const std::vector<absl::Status> statuses =
      RunThreadRanks(2, [&](int rank, Communicator* comm) {
        return RankSteps(spec, comm, 8, &steps[rank]);
      });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;

  EXPECT_GE(steps[0].buckets.size(), 6u);
  EXPECT_EQ(steps[0].buckets, steps[1].buckets);
  ExpectEachElementOnce(steps[0].buckets,
                        static_cast<int64_t>(steps[0].blocking.size()));
  // Two ranks add one pair of floats per element, however they are
  // grouped: the very same bits, on both ranks.
  EXPECT_EQ(steps[0].bucketed, steps[0].blocking);
  EXPECT_EQ(steps[1].bucketed, steps[1].blocking);
  EXPECT_EQ(steps[0].bucketed, steps[1].bucketed);
}

INSTANTIATE_TEST_SUITE_P(Batchnorm, TwoGlooRanks, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Synced" : "PerRank";
                         });

}  // namespace
}  // namespace dlbatch::trainer
