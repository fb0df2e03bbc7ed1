// Dynamic loss scaling in the training loop, through the real dlbatch-train
// on the CPU: DLBATCH_LOSS_SCALING=1 scales an fp32 run's loss (the path an
// fp16 run on a GPU takes), and DLBATCH_TEST_INF_AT_ITERATION makes one
// step's gradient infinite, as an fp16 overflow would. Scaling by a power
// of two changes no bit of float32 arithmetic, so a scaled run must match
// an unscaled one exactly; an overflowed step must leave the weights and
// the solver's state as they were, halve the scale, be counted in the
// history and the checkpoint, and training must go on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::Result;

constexpr double kInitialScale = 65536;

class LossScalingRun : public testing::TrainRunFixture {
 protected:
  void SetUp() override {
    TrainRunFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // LeNet with Caffe's solver at batch 64 on the CPU, fp32.
    job_ = WriteJob("lenet", testing::FashionMnistJobText(
                                 "lenet", dlbatch::testing::kLenetNetworkYaml,
                                 "    solver: sgdm\n"
                                 "    initial_learn_rate: 0.01\n"
                                 "    momentum: 0.9\n"
                                 "    l2_regularization: 0.0005\n"
                                 "    mini_batch_size: 64\n"
                                 "    max_epochs: 1\n"
                                 "    shuffle: every-epoch\n"
                                 "    execution_environment: cpu\n"
                                 "    seed: 3\n",
                                 /*validation=*/false));
  }

  // `iterations` steps into dir_/`name`, with the environment `env` (the
  // tuning cache is shared, so that every run computes with the same
  // oneDNN implementations).
  Result Train(const std::string& name, int iterations,
               std::map<std::string, std::string> env = {},
               std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--threads", "2", "--max-iterations",
                                 absl::StrCat(iterations)});
    return RunTrain(job_, Out(name), extra, std::move(env), 300000);
  }
  std::string Out(const std::string& name) const { return dir_ + "/" + name; }

  std::string job_;
};

const std::pair<std::string, std::string> kScaling = {"DLBATCH_LOSS_SCALING",
                                                      "1"};

std::pair<std::string, std::string> InfAt(int iteration) {
  return {"DLBATCH_TEST_INF_AT_ITERATION", absl::StrCat(iteration)};
}

// The loop's unscaling is exact: a scaled fp32 run ends on the unscaled
// run's weights and momentum, bit for bit, and its history says the scale.
TEST_F(LossScalingRun, ScaledFloat32RunMatchesTheUnscaledOneBitForBit) {
  Result r = Train("plain", 30);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = Train("scaled", 30, {kScaling});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Checkpoint plain = LastCheckpoint(Out("plain")),
                   scaled = LastCheckpoint(Out("scaled"));
  ASSERT_EQ(plain.params.size(), scaled.params.size());
  EXPECT_TRUE(plain.params == scaled.params);
  EXPECT_TRUE(plain.solver_state == scaled.solver_state);
  EXPECT_EQ(plain.loss_scale, 0);
  EXPECT_EQ(scaled.loss_scale, kInitialScale);
  EXPECT_EQ(scaled.skipped_steps, 0);

  const TrainingHistory h = History(Out("scaled"));
  EXPECT_TRUE(h.loss_scaling);
  ASSERT_EQ(h.iterations.size(), 30u);
  for (const IterationRecord& row : h.iterations) {
    EXPECT_EQ(row.loss_scale, kInitialScale) << "iteration " << row.iteration;
    EXPECT_EQ(row.skipped_steps, 0) << "iteration " << row.iteration;
  }
  EXPECT_FALSE(History(Out("plain")).loss_scaling);
  nlohmann::json m = Metrics(Out("scaled"));
  EXPECT_EQ(m["skipped_steps"], 0);
  EXPECT_EQ(m["loss_scale"], kInitialScale);
}

// An overflowed step is skipped: after step 11 with an infinite gradient
// the weights and the momentum are step 10's, exactly; the scale halves;
// the history's row 11 counts the skip and row 12 computes with half the
// scale; a resumed run continues the halved scale; and training goes on to
// a finite, lower loss.
TEST_F(LossScalingRun, AnInfiniteGradientSkipsTheStepAndHalvesTheScale) {
  Result r = Train("ten", 10, {kScaling});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = Train("skipped", 11, {kScaling, InfAt(11)});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Checkpoint ten = LastCheckpoint(Out("ten")),
                   skipped = LastCheckpoint(Out("skipped"));
  EXPECT_EQ(skipped.iteration, 11);
  ASSERT_EQ(ten.params.size(), skipped.params.size());
  EXPECT_TRUE(ten.params == skipped.params) << "the skipped step moved weights";
  EXPECT_TRUE(ten.solver_state == skipped.solver_state)
      << "the skipped step moved the momentum";
  EXPECT_EQ(ten.loss_scale, kInitialScale);
  EXPECT_EQ(skipped.loss_scale, kInitialScale / 2);
  EXPECT_EQ(skipped.skipped_steps, 1);

  // Without loss scaling the same overflow reaches the weights, and the
  // next step's loss is not finite: the run stops, saying so.
  r = Train("unscaled", 15, {InfAt(11)});
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("the training loss became"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at iteration 12 "), std::string::npos) << r.err;

  // The same overflow in a longer run, which goes on.
  r = Train("long", 200, {kScaling, InfAt(11)});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const TrainingHistory h = History(Out("long"));
  ASSERT_EQ(h.iterations.size(), 200u);
  for (const IterationRecord& row : h.iterations) {
    SCOPED_TRACE(row.iteration);
    EXPECT_TRUE(std::isfinite(row.loss));
    EXPECT_EQ(row.loss_scale,
              row.iteration <= 11 ? kInitialScale : kInitialScale / 2);
    EXPECT_EQ(row.skipped_steps, row.iteration < 11 ? 0 : 1);
  }
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    first += h.iterations[i].loss / 20;
    last += h.iterations[180 + i].loss / 20;
  }
  EXPECT_LT(last, 0.6 * first)
      << "first 20 steps " << first << ", last 20 " << last;
  nlohmann::json m = Metrics(Out("long"));
  EXPECT_EQ(m["skipped_steps"], 1);
  EXPECT_EQ(m["loss_scale"], kInitialScale / 2);

  // Resumed from the skipped run's checkpoint: the halved scale and the
  // count go on.
  r = Train("skipped", 15, {kScaling}, {"--resume"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const TrainingHistory resumed = History(Out("skipped"));
  ASSERT_EQ(resumed.iterations.size(), 15u);
  EXPECT_EQ(resumed.iterations[10].skipped_steps, 1);
  for (int i = 11; i < 15; ++i) {
    EXPECT_EQ(resumed.iterations[i].loss_scale, kInitialScale / 2) << i;
    EXPECT_EQ(resumed.iterations[i].skipped_steps, 1) << i;
  }
  EXPECT_EQ(LastCheckpoint(Out("skipped")).skipped_steps, 1);

  // Resumed again without scaling (as an fp16 run resumed in fp32): the
  // history keeps its columns, the new rows with no scale.
  r = Train("skipped", 18, {}, {"--resume"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const TrainingHistory unscaled = History(Out("skipped"));
  EXPECT_TRUE(unscaled.loss_scaling);
  ASSERT_EQ(unscaled.iterations.size(), 18u);
  EXPECT_EQ(unscaled.iterations[14].loss_scale, kInitialScale / 2);
  for (int i = 15; i < 18; ++i) {
    EXPECT_EQ(unscaled.iterations[i].loss_scale, 0) << i;
    EXPECT_EQ(unscaled.iterations[i].skipped_steps, 1) << i;
  }
  EXPECT_EQ(LastCheckpoint(Out("skipped")).loss_scale, 0);
}

TEST_F(LossScalingRun, BadSwitchesAreRefusedSayingWhatToSet) {
  Result r = Train("bad", 5, {{"DLBATCH_TEST_INF_AT_ITERATION", "soon"}});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("DLBATCH_TEST_INF_AT_ITERATION is \"soon\""),
            std::string::npos)
      << r.err;
  r = Train("bad", 5, {{"DLBATCH_LOSS_SCALING", "yes"}});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("DLBATCH_LOSS_SCALING is \"yes\"; set it to 1"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace dlbatch::trainer
