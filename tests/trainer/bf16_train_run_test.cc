// precision: bf16 and fp16 through the real dlbatch-train on the CPU: the
// refusals a user meets (bf16 on a CPU without AVX-512 BF16 or AMX, fp16 on
// any CPU, a precision that does not exist), and where the CPU has bf16,
// LeNet, the convolutional-block network and the small ResNet on
// Fashion-MNIST reaching float32's accuracy, and checkpoints that resume in
// the other precision.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"
#include "tests/trainer/precision_nets.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/backend.h"
#include "trainer/output/checkpoint.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::Blocks;
using dlbatch::testing::Lenet;
using dlbatch::testing::Net;
using dlbatch::testing::ResNet;
using dlbatch::testing::Result;

// Job(): LeNet (Caffe's solver) at batch 64; NetJob(): any of
// precision_nets.h's. A run of a number of steps writes a checkpoint at
// every step (one of an epoch, none).
class Bf16Run : public dlbatch::testing::PrecisionRunFixture {
 protected:
  Bf16Run()
      : PrecisionRunFixture("cpu",
                            "    checkpoint_frequency: 1\n"
                            "    checkpoint_frequency_unit: iteration\n") {}

  Result Train(const std::string& job, const std::string& out,
               std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--threads", "2"});
    return RunTrain(job, out, extra);
  }

  std::array<double, 2> MeanAccuracies(const Net& net, const std::string& tag,
                                       const std::vector<int>& seeds,
                                       int iterations = 0);

  double Accuracy(const std::string& out) {
    return Metrics(out)["validation_accuracy"].get<double>();
  }
};

TEST_F(Bf16Run, Fp16AndUnknownPrecisionsAreRefusedSayingWhatToUse) {
  Result r = Train(Job("fp16", "fp16", 1, 10), dir_ + "/fp16");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("precision: fp16 runs on GPUs only"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/fp16/checkpoint.dlbc"));

  r = Train(Job("fp8", "fp8", 1, 10), dir_ + "/fp8");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("train.options.precision"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bf16"), std::string::npos) << r.err;
}

TEST_F(Bf16Run, Bf16IsRefusedWithTheReasonWhereTheCpuCannot) {
  if (CpuBf16Support().ok()) {
    GTEST_SKIP() << "this CPU runs bf16: the refusal cannot be seen here";
  }
  Result r = Train(Job("bf16", "bf16", 1, 10), dir_ + "/bf16");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("precision: bf16 on the CPU needs AVX-512 BF16 or AMX"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("use precision: fp32"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/bf16/checkpoint.dlbc"));
}

// Mean test accuracy over `seeds` of `net` trained for `iterations` steps
// (0: one epoch) in fp32 ([0]) and bf16 ([1]); each run's metrics must name
// the precision it computed in.
std::array<double, 2> Bf16Run::MeanAccuracies(const Net& net,
                                              const std::string& tag,
                                              const std::vector<int>& seeds,
                                              int iterations) {
  std::array<double, 2> sum = {0, 0};
  for (int seed : seeds) {
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      const std::string name =
          absl::StrCat(tag, bf16 ? "-bf16-" : "-fp32-", seed);
      const std::string out = dir_ + "/" + name;
      Result r = Train(
          NetJob(net, name, bf16 ? "bf16" : "fp32", seed, iterations), out);
      EXPECT_EQ(r.code, 0) << r.out << r.err;
      if (r.code != 0) return {0, 0};
      nlohmann::json m = Metrics(out);
      EXPECT_EQ(
          m["backend"].get<std::string>().find("bf16") != std::string::npos,
          bf16 == 1)
          << m.dump(2);
      sum[bf16] += Accuracy(out);
    }
  }
  const std::array<double, 2> mean = {sum[0] / seeds.size(),
                                      sum[1] / seeds.size()};
  std::cout << tag << ": fp32 " << mean[0] << "%, bf16 " << mean[1]
            << "% (mean over " << seeds.size() << " seeds)\n";
  return mean;
}

// What bf16 is held to for each network: its mean test accuracy over seeds
// within 0.3 points of float32's, with the same seeds (initial weights and
// shuffle order) on both sides.
// LeNet for one epoch, seeds 1 and 2: about 40 s on two quiet cores.
TEST_F(Bf16Run, LenetReachesFloat32AccuracyInBf16) {
  if (absl::Status s = CpuBf16Support(); !s.ok()) {
    GTEST_SKIP() << "this CPU cannot run bf16: " << s.message();
  }
  const auto [fp32, bf16] = MeanAccuracies(Lenet(), "lenet", {1, 2});
  EXPECT_GT(fp32, 80.0);
  EXPECT_GE(bf16, fp32 - 0.3) << "fp32 " << fp32 << "%, bf16 " << bf16 << "%";
}

// The block net and the ResNet train 200 steps only (CI's time), where
// float32 alone moves by half a point between two invocations of this test
// (the ResNet: 80.55% and 81.04%; autotuning times the implementations
// afresh each time and may keep others, which round differently), so the
// 0.3 points cannot be told from noise there: they are held to 1
// point, which a bf16 path that lost precision misses by far. The 0.3 points
// are judged on LeNet's whole epoch above and on trainer_bench's epochs.
constexpr double kShortRunTolerance = 1.0;

// The block network (batch normalisation in float32 between bf16
// convolutions) for 200 steps at batch 128, seeds 1 and 2.
TEST_F(Bf16Run, BlockNetReachesFloat32AccuracyInBf16) {
  if (absl::Status s = CpuBf16Support(); !s.ok()) {
    GTEST_SKIP() << "this CPU cannot run bf16: " << s.message();
  }
  const auto [fp32, bf16] = MeanAccuracies(Blocks(), "blocks", {1, 2}, 200);
  EXPECT_GT(fp32, 70.0);  // 74.7% here, after under half an epoch
  EXPECT_GE(bf16, fp32 - kShortRunTolerance)
      << "fp32 " << fp32 << "%, bf16 " << bf16 << "%";
}

// The small ResNet (residual sums of bf16 convolutions' float32 outputs)
// for 200 steps at batch 128, seeds 1 and 2.
TEST_F(Bf16Run, ResNetReachesFloat32AccuracyInBf16) {
  if (absl::Status s = CpuBf16Support(); !s.ok()) {
    GTEST_SKIP() << "this CPU cannot run bf16: " << s.message();
  }
  const auto [fp32, bf16] = MeanAccuracies(ResNet(), "resnet", {1, 2}, 200);
  EXPECT_GT(fp32, 75.0);  // 80.5% here, after under half an epoch
  EXPECT_GE(bf16, fp32 - kShortRunTolerance)
      << "fp32 " << fp32 << "%, bf16 " << bf16 << "%";
}

// The small ResNet's mini-batch split over two threads: its batch norms'
// statistics span them (the folded relus and bf16 tensors kept, SpanSums),
// and it trains what one replica over both threads trains, within the
// rounding of each precision, early (4 steps) as the rank tests compare.
TEST_F(Bf16Run, ASplitResNetTrainsAsOneReplicaInEitherPrecision) {
  if (absl::Status s = CpuBf16Support(); !s.ok()) {
    GTEST_SKIP() << "this CPU cannot run bf16: " << s.message();
  }
  for (const auto& [precision, tolerance] :
       {std::pair<std::string, double>{"fp32", 1e-4},
        std::pair<std::string, double>{"bf16", 1e-3}}) {
    const std::string job =
        NetJob(ResNet(), "split-" + precision, precision, 3, /*iterations=*/4);
    const std::string one = dir_ + "/one-" + precision;
    Result r =
        RunTrain(job, one, {"--threads", "2"}, {{"DLBATCH_SPLIT_BATCH", "0"}});
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(r.out.find("split over"), std::string::npos) << r.out;
    const std::string split = dir_ + "/split-" + precision;
    r = Train(job, split);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("split over 2 threads"), std::string::npos) << r.out;
    const Checkpoint a = LastCheckpoint(one), b = LastCheckpoint(split);
    ASSERT_EQ(a.params.size(), b.params.size());
    ASSERT_EQ(a.state.size(), b.state.size());
    ASSERT_GT(a.state.size(), 0u);
    const double params = testing::RelativeDifference(a.params, b.params);
    const double state = testing::RelativeDifference(a.state, b.state);
    std::printf(
        "%s: split against one replica: weights %.3g, statistics %.3g\n",
        precision.c_str(), params, state);
    EXPECT_LT(params, tolerance) << precision;
    EXPECT_LT(state, tolerance) << precision;
    EXPECT_EQ(a.iteration, 4);
    EXPECT_EQ(b.iteration, 4);
  }
}

// Checkpoints hold float32 masters whatever the run computed in: a bf16
// run resumes in fp32 and an fp32 one in bf16.
TEST_F(Bf16Run, CheckpointsResumeInTheOtherPrecision) {
  if (absl::Status s = CpuBf16Support(); !s.ok()) {
    GTEST_SKIP() << "this CPU cannot run bf16: " << s.message();
  }
  for (const auto& [first, then] :
       {std::pair<std::string, std::string>{"bf16", "fp32"},
        std::pair<std::string, std::string>{"fp32", "bf16"}}) {
    const std::string out = dir_ + "/" + first + "-then-" + then;
    Result r = Train(Job(first + "-a", first, 1, 200), out);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    absl::StatusOr<Checkpoint> c = ReadCheckpoint(out + "/checkpoint.dlbc");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->iteration, 200);
    EXPECT_EQ(c->params.size(), 431080u);

    r = Train(Job(first + "-b", then, 1, 400), out, {"--resume"});
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    nlohmann::json m = Metrics(out);
    EXPECT_TRUE(m["resumed"].get<bool>());
    EXPECT_EQ(m["iterations"], 400);
    EXPECT_EQ(m["backend"].get<std::string>().find("bf16") != std::string::npos,
              then == "bf16");
    EXPECT_GT(Accuracy(out), 70.0) << first << " then " << then;
  }
}

}  // namespace
}  // namespace dlbatch::trainer
