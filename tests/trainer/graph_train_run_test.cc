// Whole runs of the real dlbatch-train on a network that is a graph (a
// residual add, a concat, gelu) with the fast recipes' options (Nesterov's
// momentum, label smoothing): 1 rank and 4 train to the same weights, and a
// run resumed from its checkpoint ends with the weights of one that was not
// stopped. On the real Fashion-MNIST files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::FashionMnistDir;
using dlbatch::testing::ReadAll;
using dlbatch::testing::Result;
using testing::RelativeDifference;

// No pooling (whose ties may flip between ranks) and no dropout (drawn per
// rank): 1 and 4 ranks differ only in the order of float additions.
// "stem" is taken by two layers; its gradient is their sum.
const char kGraphJob[] = R"(name: graph
train:
  network:
    input: [28, 28, 1]
    layers:
      - {name: stem, type: conv, filters: 6, size: 5, stride: 2}   # 12x12x6
      - {type: gelu}
      - {type: conv, filters: 6, size: 3, padding: same}
      - {name: branch, type: relu}
      - {name: sum, type: add, inputs: [stem, branch]}
      - {name: side, type: conv, filters: 2, size: 1, inputs: [stem]}
      - {type: concat, inputs: [sum, side]}                       # 12x12x8
      - {type: conv, filters: 8, size: 3, stride: 2}              # 5x5x8
      - {type: relu}
      - {type: fc, units: 10}
      - {type: softmax}
  data:
    train: {format: idx, images: DATA/train-images-idx3-ubyte.gz, labels: DATA/train-labels-idx1-ubyte.gz}
  options:
    solver: sgdm
    nesterov: true
    label_smoothing: 0.1
    initial_learn_rate: 0.02
    momentum: 0.9
    l2_regularization: 0.0005
    mini_batch_size: 64
    shuffle: every-epoch
    verbose_frequency: 1000
    checkpoint_frequency: 10
    checkpoint_frequency_unit: iteration
    seed: 5
)";

class GraphTrainRun : public testing::TrainRunFixture {
 protected:
  void SetUp() override {
    TrainRunFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    job_ = WriteJob(
        "graph", absl::StrReplaceAll(kGraphJob, {{"DATA", FashionMnistDir()}}));
  }

  Result Train(const std::string& out, const std::vector<std::string>& extra) {
    return RunTrain(job_, out, extra);
  }

  std::string job_;
};

TEST_F(GraphTrainRun, FourRanksTrainAGraphNetToTheWeightsOfOne) {
  Result one = Train(dir_ + "/one", {"--max-iterations", "6", "--ranks", "1",
                                     "--threads", "1"});
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  Result four = Train(dir_ + "/four", {"--max-iterations", "6", "--ranks", "4",
                                       "--threads", "1"});
  ASSERT_EQ(four.code, 0) << four.out << four.err;
  const std::vector<float> p1 = FinalParams(dir_ + "/one");
  const std::vector<float> p4 = FinalParams(dir_ + "/four");
  ASSERT_EQ(p1.size(), p4.size());
  ASSERT_FALSE(p1.empty());
  EXPECT_LT(RelativeDifference(p4, p1), 1e-5);
  absl::StatusOr<TrainingHistory> h1 =
      ParseHistoryCsv(ReadAll(dir_ + "/one/training_history.csv"));
  absl::StatusOr<TrainingHistory> h4 =
      ParseHistoryCsv(ReadAll(dir_ + "/four/training_history.csv"));
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_TRUE(h4.ok()) << h4.status();
  ASSERT_EQ(h1->iterations.size(), 6u);
  ASSERT_EQ(h4->iterations.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(h4->iterations[i].loss, h1->iterations[i].loss,
                1e-5 * h1->iterations[i].loss)
        << "iteration " << i + 1;
  }
  // Training moved the weights far more than the ranks differ.
  ASSERT_EQ(Train(dir_ + "/init", {"--max-iterations", "1"}).code, 0);
  EXPECT_GT(RelativeDifference(FinalParams(dir_ + "/init"), p1), 1e-3);
}

TEST_F(GraphTrainRun, ResumedRunEndsWithTheWeightsOfAWholeOne) {
  Result whole =
      Train(dir_ + "/whole", {"--max-iterations", "30", "--threads", "1"});
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;
  const std::string out = dir_ + "/parts";
  ASSERT_EQ(Train(out, {"--max-iterations", "20", "--threads", "1"}).code, 0);
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(out + "/checkpoint.dlbc");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->iteration, 20);
  Result r =
      Train(out, {"--max-iterations", "30", "--threads", "1", "--resume"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Resuming from"), std::string::npos) << r.out;
  EXPECT_EQ(FinalParams(out), FinalParams(dir_ + "/whole"));
  // The ONNX model of a graph net is written with the rest.
  EXPECT_GT(ReadAll(out + "/model.onnx").size(), 1000u);
  nlohmann::json m = nlohmann::json::parse(ReadAll(out + "/metrics.json"));
  EXPECT_EQ(m["resumed"], true);
}

}  // namespace
}  // namespace dlbatch::trainer
