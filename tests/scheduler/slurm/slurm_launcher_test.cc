// Unit tests of the Slurm launcher (scheduler/slurm_launcher.h): a job's
// pool as a Slurm batch job, and sbatch between two commits, driven by a
// fake SlurmTool and a fake ledger that log, in one list, what happened in
// which order.
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/launcher.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::scheduler::slurm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// What happened, in order: "put 12 slurm=0", "sbatch", "scancel 4242".
using Log = std::vector<std::string>;

class FakeTool final : public SlurmTool {
 public:
  explicit FakeTool(Log* log) : log_(log) {}
  // The next calls' answers, in order; a call with none left fails.
  std::deque<absl::StatusOr<ToolResult>> answers;
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::string> inputs;

  absl::StatusOr<ToolResult> Run(const std::vector<std::string>& argv,
                                 const std::string& input) override {
    log_->push_back(argv[0] == "scancel" ? "scancel " + argv[1] : argv[0]);
    argvs.push_back(argv);
    inputs.push_back(input);
    if (answers.empty()) return absl::InternalError("no answer scripted");
    absl::StatusOr<ToolResult> next = std::move(answers.front());
    answers.pop_front();
    return next;
  }

 private:
  Log* log_;
};

class FakeLedger final : public SlurmJobLedger {
 public:
  explicit FakeLedger(Log* log) : log_(log) {}
  // Puts from this one on (1-based) fail.
  int fail_from_put = 0;
  std::vector<SlurmJobRecord> puts;

  absl::Status Put(const SlurmJobRecord& r) override {
    puts.push_back(r);
    log_->push_back(absl::StrCat("put ", r.job_id, " slurm=", r.slurm_id));
    if (fail_from_put > 0 && static_cast<int>(puts.size()) >= fail_from_put) {
      return absl::ResourceExhaustedError("disk full");
    }
    return absl::OkStatus();
  }
  absl::Status Forget(int64_t job_id) override {
    log_->push_back(absl::StrCat("forget ", job_id));
    return absl::OkStatus();
  }

 private:
  Log* log_;
};

SlurmProfile Cluster(int gpus_per_node = 4) {
  SlurmProfile p;
  p.name = "cluster";
  p.partition = "gpu";
  p.gpus_per_node = gpus_per_node;
  return p;
}

ToolResult Answer(int code, std::string out, std::string err = "") {
  return ToolResult{code, std::move(out), std::move(err)};
}

TEST(PlanBatchTest, AsFewNodesAsHoldThePoolEachWithTheSameCount) {
  auto one = PlanBatch(Cluster(), 12, 1, {.pool = 3});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->job_id, 12);
  EXPECT_EQ(one->attempt, 1);
  EXPECT_EQ(one->nodes, 1);
  EXPECT_EQ(one->gpus_per_node, 3);
  auto two = PlanBatch(Cluster(2), 12, 2,
                       {.pool = 4, .max_nodes = 2, .time_limit_s = 90});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->nodes, 2);
  EXPECT_EQ(two->gpus_per_node, 2);
  EXPECT_EQ(two->time_limit_s, 90);
  auto six = PlanBatch(Cluster(4), 1, 1, {.pool = 6, .max_nodes = 4});
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(six->nodes, 2);
  EXPECT_EQ(six->gpus_per_node, 3);
  // A CPU for each rank on its node.
  EXPECT_EQ(six->cpus_per_node, 3);
  // CPU-only nodes of unknown CPUs: one node, no GRES, the pool's CPUs.
  auto cpu = PlanBatch(Cluster(0), 1, 1, {.pool = 8});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->nodes, 1);
  EXPECT_EQ(cpu->gpus_per_node, 0);
  EXPECT_EQ(cpu->cpus_per_node, 8);
}

TEST(PlanBatchTest, CpuOnlyNodesHoldAsManySlotsAsTheyHaveCpus) {
  auto one = PlanBatch(Cluster(0), 1, 1, {.pool = 2}, /*node_cpus=*/2);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->nodes, 1);
  EXPECT_EQ(one->cpus_per_node, 2);
  auto spread =
      PlanBatch(Cluster(0), 1, 1, {.pool = 6, .max_nodes = 3}, /*node_cpus=*/4);
  ASSERT_TRUE(spread.ok()) << spread.status();
  EXPECT_EQ(spread->nodes, 2);
  EXPECT_EQ(spread->cpus_per_node, 3);
  EXPECT_EQ(spread->gpus_per_node, 0);
  EXPECT_THAT(PlanBatch(Cluster(0), 1, 1, {.pool = 3}, 2).status().message(),
              HasSubstr("pool 3 needs 2 nodes of profile 'cluster' (2 CPUs "
                        "each) but the job allows 1; set max_nodes: 2 in the "
                        "job, or use pool 2 or less"));
  EXPECT_THAT(
      PlanBatch(Cluster(0), 1, 1, {.pool = 5, .max_nodes = 2}, 4)
          .status()
          .message(),
      HasSubstr("pool 5 does not split evenly over the 2 nodes of profile "
                "'cluster' it needs (Slurm gives each node the same CPU "
                "count); use pool 4 or 6"));
}

TEST(ShapeOfGangTest, GpuNodesArePlannedCpuNodesShareThePoolOverSlurmsNodes) {
  auto gpus = ShapeOfGang(Cluster(2), {.pool = 4, .max_nodes = 2}, 2);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(gpus->nodes, 2);
  EXPECT_EQ(gpus->per_node, 2);
  EXPECT_TRUE(gpus->gpus);
  // A GPU plan that fails was refused at launch: not the gang's to say.
  EXPECT_TRUE(absl::IsInvalidArgument(
      ShapeOfGang(Cluster(2), {.pool = 5}, 1).status()));
  auto cpus = ShapeOfGang(Cluster(0), {.pool = 6, .max_nodes = 3}, 2);
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_EQ(cpus->nodes, 2);
  EXPECT_EQ(cpus->per_node, 3);
  EXPECT_FALSE(cpus->gpus);
  absl::Status uneven =
      ShapeOfGang(Cluster(0), {.pool = 5, .max_nodes = 3}, 2).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(uneven)) << uneven;
  EXPECT_THAT(uneven.message(), HasSubstr("Slurm gave the job 2 nodes"));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ShapeOfGang(Cluster(0), {.pool = 4}, 2).status()));
}

TEST(PlanBatchTest, RefusesWhatNeedsMoreNodesOrSplitsUnevenly) {
  EXPECT_THAT(
      PlanBatch(Cluster(), 1, 1, {.pool = 8}).status().message(),
      HasSubstr("pool 8 needs 2 nodes of profile 'cluster' (4 GPUs each) but "
                "the job allows 1; set max_nodes: 2 in the job, or use pool "
                "4 or less"));
  EXPECT_THAT(PlanBatch(Cluster(), 1, 1, {.pool = 5, .max_nodes = 2})
                  .status()
                  .message(),
              HasSubstr("pool 5 does not split evenly over the 2 nodes of "
                        "profile 'cluster' it needs (Slurm gives each node "
                        "the same GPU count); use pool 4 or 6"));
  EXPECT_FALSE(PlanBatch(Cluster(), 1, 1, {.pool = 0}).ok());
}

TEST(SlurmLauncherTest, CommitsTheIntentThenSubmitsThenCommitsTheId) {
  Log log;
  FakeTool tool(&log);
  FakeLedger ledger(&log);
  FakeClock clock;
  clock.SetNowMs(1'000);
  tool.answers.push_back(Answer(0, "4242\n"));
  SlurmLauncher launcher(&tool, &ledger, &clock);
  auto request = PlanBatch(Cluster(), 12, 1, {.pool = 2});
  ASSERT_TRUE(request.ok());
  request->instance = "0a1b2c3d";
  auto record =
      launcher.Launch(Cluster(), *request, {"head:7070", "", "dlbj_secret"});
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->job_id, 12);
  EXPECT_EQ(record->attempt, 1);
  EXPECT_EQ(record->slurm_id, 4242);
  EXPECT_EQ(record->profile, "cluster");
  EXPECT_EQ(record->submitted_ms, 1'000);
  // The one-job credential is kept by its hash only, from the first commit.
  EXPECT_EQ(record->token_sha256, Sha256Hex("dlbj_secret"));
  EXPECT_EQ(ledger.puts[0].token_sha256, Sha256Hex("dlbj_secret"));
  EXPECT_THAT(log,
              ElementsAre("put 12 slurm=0", "sbatch", "put 12 slurm=4242"));
  // sbatch got the job's arguments, and the credential only on stdin.
  EXPECT_THAT(absl::StrJoin(tool.argvs[0], " "),
              HasSubstr("--job-name=dlbatch-0a1b2c3d-12"));
  EXPECT_THAT(absl::StrJoin(tool.argvs[0], " "), HasSubstr("--gres=gpu:2"));
  EXPECT_THAT(absl::StrJoin(tool.argvs[0], " "),
              ::testing::Not(HasSubstr("dlbj_secret")));
  EXPECT_THAT(tool.inputs[0], HasSubstr("dlbj_secret"));
}

TEST(SlurmLauncherTest, NoIntentRecordedMeansNoSbatch) {
  Log log;
  FakeTool tool(&log);
  FakeLedger ledger(&log);
  FakeClock clock;
  ledger.fail_from_put = 1;
  SlurmLauncher launcher(&tool, &ledger, &clock);
  auto record = launcher.Launch(Cluster(), *PlanBatch(Cluster(), 3, 1, {}),
                                {"head:7070", "", "t"});
  ASSERT_FALSE(record.ok());
  EXPECT_THAT(record.status().message(),
              HasSubstr("job 3: not submitted to Slurm, as its submission "
                        "could not be recorded"));
  EXPECT_THAT(log, ElementsAre("put 3 slurm=0"));
}

TEST(SlurmLauncherTest, AnIdThatCannotBeRecordedIsCancelledAtOnce) {
  Log log;
  FakeTool tool(&log);
  FakeLedger ledger(&log);
  FakeClock clock;
  ledger.fail_from_put = 2;
  tool.answers.push_back(Answer(0, "77;cluster\n"));
  tool.answers.push_back(Answer(0, ""));
  SlurmLauncher launcher(&tool, &ledger, &clock);
  auto record = launcher.Launch(Cluster(), *PlanBatch(Cluster(), 3, 2, {}),
                                {"head:7070", "", "t"});
  ASSERT_FALSE(record.ok());
  EXPECT_EQ(record.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(record.status().message(),
              HasSubstr("Slurm job 77 could not be recorded, so it was "
                        "cancelled"));
  EXPECT_THAT(log, ElementsAre("put 3 slurm=0", "sbatch", "put 3 slurm=77",
                               "scancel 77"));
}

TEST(SlurmLauncherTest, ARefusalForgetsTheIntentAFailureKeepsIt) {
  Log log;
  FakeTool tool(&log);
  FakeLedger ledger(&log);
  FakeClock clock;
  SlurmLauncher launcher(&tool, &ledger, &clock);
  // Slurm said no: there is no Slurm job.
  tool.answers.push_back(Answer(
      1, "", "sbatch: error: Batch job submission failed: Invalid account\n"));
  auto refused = launcher.Launch(Cluster(), *PlanBatch(Cluster(), 5, 1, {}),
                                 {"head:7070", "", "t"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("Invalid account"));
  EXPECT_THAT(log, ElementsAre("put 5 slurm=0", "sbatch", "forget 5"));
  // sbatch did not answer in time: the job may exist, the intent stays for
  // the reconciler to find it by name.
  log.clear();
  tool.answers.push_back(absl::DeadlineExceededError("sbatch did not answer"));
  auto timed_out = launcher.Launch(Cluster(), *PlanBatch(Cluster(), 6, 1, {}),
                                   {"head:7070", "", "t"});
  ASSERT_FALSE(timed_out.ok());
  EXPECT_THAT(log, ElementsAre("put 6 slurm=0", "sbatch"));
  // An answer that does not parse: the same.
  log.clear();
  tool.answers.push_back(Answer(0, "Submitted batch job\n"));
  EXPECT_FALSE(launcher
                   .Launch(Cluster(), *PlanBatch(Cluster(), 7, 1, {}),
                           {"head:7070", "", "t"})
                   .ok());
  EXPECT_THAT(log, ElementsAre("put 7 slurm=0", "sbatch"));
  EXPECT_THAT(tool.answers, IsEmpty());
}

}  // namespace
}  // namespace dlbatch::scheduler::slurm
