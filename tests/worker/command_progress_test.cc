// A command job's $DLBATCH_PROGRESS lines read into progress and history:
// the fields a train job reports, the job's own metrics, and every kind of
// bad line counted without changing anything.
#include "worker/command_progress.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

using ::testing::HasSubstr;
using Kind = CommandProgress::Result::Kind;

TEST(CommandProgressTest, KnownKeysSetTheTrainersFields) {
  CommandProgress cp(1000);
  auto r =
      cp.Read(R"({"iteration": 20, "iterations": 100, "epoch": 2, "epochs": 5,)"
              R"( "loss": 0.5, "accuracy": 81.5, "learn_rate": 0.01,)"
              R"( "images_per_s": 300})",
              true, 11000);
  ASSERT_EQ(r.kind, Kind::kProgress);
  const v1::TrainProgress& p = cp.progress();
  EXPECT_EQ(p.iteration(), 20);
  EXPECT_EQ(p.iterations(), 100);
  EXPECT_EQ(p.epoch(), 2);
  EXPECT_EQ(p.epochs(), 5);
  EXPECT_DOUBLE_EQ(p.loss(), 0.5);
  EXPECT_DOUBLE_EQ(p.accuracy(), 81.5);
  EXPECT_DOUBLE_EQ(p.learn_rate(), 0.01);
  EXPECT_DOUBLE_EQ(p.images_per_s(), 300);
  EXPECT_EQ(p.time_ms(), 11000);
  // Elapsed from the job's start, and the ETA from the rate so far.
  EXPECT_DOUBLE_EQ(p.elapsed_s(), 10);
  EXPECT_DOUBLE_EQ(p.eta_s(), 40);
  EXPECT_FALSE(p.has_validation());
}

TEST(CommandProgressTest, KeysLeftOutKeepTheirValuesAndStepIsIteration) {
  CommandProgress cp(0);
  cp.Read(R"({"step": 1, "loss": 2.0, "accuracy": 10})", true, 100);
  cp.Read(R"({"step": 2, "loss": 1.5})", true, 200);
  EXPECT_EQ(cp.progress().iteration(), 2);
  EXPECT_DOUBLE_EQ(cp.progress().loss(), 1.5);
  EXPECT_DOUBLE_EQ(cp.progress().accuracy(), 10);
}

TEST(CommandProgressTest, OtherNumbersAreTheJobsOwnMetrics) {
  CommandProgress cp(0);
  auto r = cp.Read(R"({"tokens_per_s": 1200.5, "phase": "warmup",)"
                   R"( "grad_norm": "NaN"})",
                   true, 5);
  ASSERT_EQ(r.kind, Kind::kProgress);
  EXPECT_DOUBLE_EQ(cp.progress().metrics().at("tokens_per_s"), 1200.5);
  EXPECT_TRUE(std::isnan(cp.progress().metrics().at("grad_norm")));
  // A label that is not a number is the job's own business.
  EXPECT_EQ(cp.progress().metrics().count("phase"), 0u);
}

TEST(CommandProgressTest, ValidationAndCheckpoint) {
  CommandProgress cp(0);
  auto r = cp.Read(R"({"iteration": 40, "validation_loss": 0.7,)"
                   R"( "validation_accuracy": 75, "checkpoint": 40})",
                   true, 5);
  EXPECT_EQ(r.kind, Kind::kCheckpoint);
  EXPECT_EQ(r.step, 40);
  EXPECT_TRUE(r.progress);
  EXPECT_TRUE(cp.progress().has_validation());
  EXPECT_DOUBLE_EQ(cp.progress().validation_accuracy(), 75);
  ASSERT_EQ(cp.history().validations.size(), 1u);
  EXPECT_EQ(cp.history().validations[0].iteration, 40);
  EXPECT_TRUE(cp.history().iterations.empty());
  r = cp.Read(R"({"checkpoint": 60})", true, 6);
  EXPECT_EQ(r.kind, Kind::kCheckpoint);
  EXPECT_FALSE(r.progress);
}

TEST(CommandProgressTest, BadLinesAreCountedAndChangeNothing) {
  CommandProgress cp(0);
  cp.Read(R"({"iteration": 5, "loss": 1.0})", true, 1);
  const std::string before = cp.progress().SerializeAsString();
  struct Case {
    std::string line;
    std::string problem;
  } cases[] = {
      {"step 6 loss 0.9", "not JSON"},
      {R"({"loss": NaN})", "write \"NaN\""},
      {"[1, 2]", "not a JSON object"},
      {R"({"iteration": 6, "loss": "low"})", "'loss' is not a number"},
      {R"({"iteration": -1})", "'iteration' is not a whole number"},
      {R"({"epoch": 1.5})", "'epoch' is not a whole number"},
      {R"({"loss": 0.9, "bad name": 1})", "the metric name 'bad name'"},
      {R"({"loss": 0.9, "accuracy": true})", "'accuracy' is not a number"},
  };
  for (const Case& c : cases) {
    auto r = cp.Read(c.line, true, 2);
    EXPECT_EQ(r.kind, Kind::kBad) << c.line;
    EXPECT_THAT(r.problem, HasSubstr(c.problem)) << c.line;
  }
  EXPECT_EQ(cp.bad_lines(), 8);
  EXPECT_EQ(cp.lines(), 9);
  EXPECT_EQ(cp.progress().SerializeAsString(), before);
  EXPECT_EQ(cp.history().iterations.size(), 1u);
}

TEST(CommandProgressTest, ALineLongerThanTheCapIsOneBadLine) {
  CommandProgress cp(0);
  const std::string piece(64 * 1024, 'x');
  auto r = cp.Read(piece, false, 1);
  EXPECT_EQ(r.kind, Kind::kBad);
  EXPECT_THAT(r.problem, HasSubstr("longer than"));
  EXPECT_EQ(cp.Read(piece, false, 1).kind, Kind::kPiece);
  EXPECT_EQ(cp.Read("}", true, 1).kind, Kind::kPiece);
  EXPECT_EQ(cp.bad_lines(), 1);
  // The next line is read as usual.
  EXPECT_EQ(cp.Read(R"({"loss": 1})", true, 1).kind, Kind::kProgress);
}

TEST(CommandProgressTest, MetricsPastTheLimitAreDroppedAndCounted) {
  CommandProgress cp(0);
  std::string line = "{";
  for (int i = 0; i < kMaxJobMetrics + 5; ++i)
    absl::StrAppend(&line, i ? "," : "", "\"m", i, "\": ", i);
  line += "}";
  EXPECT_EQ(cp.Read(line, true, 1).kind, Kind::kProgress);
  EXPECT_EQ(cp.progress().metrics_size(), kMaxJobMetrics);
  EXPECT_EQ(cp.metrics_dropped(), 5);
}

TEST(CommandProgressTest, HistoryIsThinnedNotUnbounded) {
  CommandProgress cp(0);
  const int rows = static_cast<int>(kMaxHistoryRows) * 3;
  for (int i = 1; i <= rows; ++i)
    cp.Read(absl::StrCat("{\"iteration\": ", i, ", \"loss\": 1}"), true, i);
  const auto& it = cp.history().iterations;
  EXPECT_LE(it.size(), kMaxHistoryRows);
  EXPECT_GE(it.size(), kMaxHistoryRows / 4);
  EXPECT_EQ(it.front().iteration, 1);
  EXPECT_GT(it.back().iteration, rows - 8);
  for (size_t i = 1; i < it.size(); ++i)
    ASSERT_LT(it[i - 1].iteration, it[i].iteration);
}

TEST(CommandProgressTest, HistoryFilesAsATrainJobsAndNoneWithoutLoss) {
  CommandProgress none(0);
  none.Read(R"({"iteration": 1})", true, 1);
  EXPECT_TRUE(HistoryFiles(none.history(), "x").empty());
  CommandProgress cp(0);
  cp.Read(R"({"iteration": 1, "epoch": 1, "loss": 2, "accuracy": 10,)"
          R"( "learn_rate": 0.1})",
          true, 1000);
  auto files = HistoryFiles(cp.history(), "<b>name</b>");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].name, "training_history.csv");
  EXPECT_THAT(files[0].content,
              HasSubstr("kind,iteration,epoch,time_s,loss,accuracy,learn_rate\n"
                        "train,1,1,1,2,10,0.1"));
  EXPECT_EQ(files[1].name, "training_progress.svg");
  // The job's name is text in the plot, never markup.
  EXPECT_THAT(files[1].content, HasSubstr("&lt;b&gt;name"));
  EXPECT_THAT(files[1].content, ::testing::Not(HasSubstr("<b>")));
}

}  // namespace
}  // namespace dlbatch::worker
