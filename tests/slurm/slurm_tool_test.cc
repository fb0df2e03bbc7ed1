// dlbatch's conversations with a real Slurm (tests/slurm/slurm-cluster.sh):
// the batch script it writes runs one task per node with the node's GPUs,
// squeue and sinfo read back as dlbatch maps them, Slurm's refusals arrive
// in its own words, and scancel of a pending, a running or an unknown job
// is done.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/tool.h"

namespace dlbatch::scheduler::slurm {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SlurmToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-slurm-tool-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string start = absl::StrCat(
        kClusterScript, " start ", dir_, "/slurm 2 >", dir_, "/start.log 2>&1");
    const int rc = system(start.c_str());
    started_ = true;
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2) {
      GTEST_SKIP() << "Slurm cannot run here: " << ReadAll(dir_ + "/start.log");
    }
    ASSERT_EQ(rc, 0) << ReadAll(dir_ + "/start.log");
    tool_ =
        std::make_unique<ProcessSlurmTool>(std::map<std::string, std::string>{
            {"SLURM_CONF", dir_ + "/slurm/slurm.conf"}});
    // Stands in for dlbatch-worker: says where it ran and what it got.
    bin_ = dir_ + "/bin";
    std::filesystem::create_directories(bin_);
    std::ofstream(bin_ + "/dlbatch-worker")
        << "#!/bin/sh\n"
           "echo \"$SLURM_PROCID $SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES "
           "at=$DLBATCH_SCHEDULER token=$DLBATCH_TOKEN args=$*\" "
           ">\"$8/rank-$SLURM_PROCID\"\n"  // $8: the --work-dir
           "sleep \"${DLBATCH_TEST_SLEEP:-0}\"\n";
    chmod((bin_ + "/dlbatch-worker").c_str(), 0755);
    profile_.name = "hpc";
    profile_.partition = "gpu";
    profile_.gpus_per_node = 2;
    profile_.bin_dir = bin_;
    // The nodes' folder exists on every node before a job starts: Slurm
    // opens the job's output file there first.
    profile_.node_dir = dir_ + "/nodes";
    std::filesystem::create_directories(profile_.node_dir);
  }
  void TearDown() override {
    if (started_) {
      system(absl::StrCat(kClusterScript, " stop ", dir_, "/slurm").c_str());
    }
    std::filesystem::remove_all(dir_);
  }

  // Waits for the Slurm job to reach a state for which `done` holds.
  std::optional<SqueueRow> WaitState(
      int64_t id, const std::function<bool(const std::string&)>& done) {
    for (int i = 0; i < 150; ++i) {
      auto rows = ReadQueue(*tool_, {"gpu"});
      if (rows.ok()) {
        for (const SqueueRow& r : *rows) {
          if (r.slurm_id == id && done(r.state)) return r;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return std::nullopt;
  }

  static constexpr const char* kClusterScript = DLBATCH_SLURM_CLUSTER_SCRIPT;
  std::string dir_, bin_;
  bool started_ = false;
  std::unique_ptr<ProcessSlurmTool> tool_;
  SlurmProfile profile_;
};

TEST_F(SlurmToolTest, AJobOnTwoNodesRunsOneWorkerEachWithItsGpus) {
  auto limits = ReadPartition(*tool_, profile_);
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->nodes, 2);
  EXPECT_EQ(limits->max_gpus_per_node, 2);
  EXPECT_EQ(limits->max_time_s, 0);
  EXPECT_EQ(limits->max_cpus_per_node, 2);  // CPUs=2 (slurm-cluster.sh)

  BatchRequest r;
  r.instance = "0a1b2c3d";
  r.job_id = 41;
  r.nodes = 2;
  r.gpus_per_node = 2;
  r.time_limit_s = 60;
  ASSERT_TRUE(CheckFits(*limits, r).ok());
  auto id = SubmitBatch(*tool_, profile_, r, {"unix:/x.sock", "", "dlbw_t"});
  ASSERT_TRUE(id.ok()) << id.status();
  auto row = WaitState(*id, [](const std::string& s) {
    return s == "COMPLETED" || s == "FAILED";
  });
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->state, "COMPLETED") << ReadAll(
      absl::StrCat(profile_.node_dir, "/dlbatch-0a1b2c3d-41-", *id, ".out"));
  EXPECT_EQ(row->name, "dlbatch-0a1b2c3d-41");
  EXPECT_EQ(ParseSlurmJobName(row->name), (ParsedSlurmName{"0a1b2c3d", 41}));
  const std::string rank0 = ReadAll(profile_.node_dir + "/rank-0");
  const std::string rank1 = ReadAll(profile_.node_dir + "/rank-1");
  EXPECT_THAT(rank0, HasSubstr("0 n1 gpus=0,1 at=unix:/x.sock token=dlbw_t"));
  EXPECT_THAT(rank1, HasSubstr("1 n2 gpus=0,1"));
  EXPECT_THAT(rank0, HasSubstr("--slurm-job 41 --attempt 1 --profile hpc"));
}

TEST_F(SlurmToolTest, SlurmsRefusalIsInItsOwnWords) {
  BatchRequest r;
  r.instance = "0a1b2c3d";
  r.job_id = 42;
  r.gpus_per_node = 3;  // each node has 2
  auto id = SubmitBatch(*tool_, profile_, r, {"unix:/x.sock", "", "t"});
  ASSERT_FALSE(id.ok());
  EXPECT_THAT(id.status().message(),
              HasSubstr("Slurm refused the job: sbatch: error: Batch job "
                        "submission failed"));
}

TEST_F(SlurmToolTest, CancelOfPendingRunningAndUnknownJobsIsDone) {
  BatchRequest r;
  r.instance = "0a1b2c3d";
  r.job_id = 43;
  r.nodes = 3;  // more than the partition has: Slurm queues it for ever
  auto pending = SubmitBatch(*tool_, profile_, r, {"unix:/x.sock", "", "t"});
  ASSERT_TRUE(pending.ok()) << pending.status();
  auto row =
      WaitState(*pending, [](const std::string& s) { return s == "PENDING"; });
  ASSERT_TRUE(row.has_value());
  SlurmVerdict v = MapSlurmState(*row, "gpu");
  EXPECT_EQ(v.phase, SlurmPhase::kPending);
  EXPECT_THAT(v.reason, HasSubstr("waiting in Slurm: "));
  EXPECT_THAT(v.reason, HasSubstr("(partition gpu)"));

  // The last --export wins over the profile's --export=NONE.
  r.instance = "0a1b2c3d";
  r.job_id = 44;
  r.nodes = 1;
  r.gpus_per_node = 1;
  profile_.sbatch_args = {"--export=DLBATCH_TEST_SLEEP=60"};
  auto running = SubmitBatch(*tool_, profile_, r, {"unix:/x.sock", "", "t"});
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(WaitState(*running, [](const std::string& s) {
                return s == "RUNNING";
              }).has_value());

  // Slurm's view for `dlbatch profiles`: one node busy with one GPU of
  // four; then a node drained by hand is unavailable.
  auto view = ReadPartitionView(*tool_, profile_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->nodes, 2);
  EXPECT_EQ(view->busy, 1);
  EXPECT_EQ(view->idle, 1);
  EXPECT_EQ(view->unavailable, 0);
  EXPECT_EQ(view->gpus, 4);
  EXPECT_EQ(view->gpus_used, 1);
  auto drained = tool_->Run(
      {"scontrol", "update", "nodename=n2", "state=drain", "reason=test"}, "");
  ASSERT_TRUE(drained.ok() && drained->exit_code == 0)
      << (drained.ok() ? drained->err : drained.status().ToString());
  view = ReadPartitionView(*tool_, profile_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->nodes, 2);
  EXPECT_EQ(view->unavailable, 1);

  EXPECT_TRUE(CancelBatch(*tool_, *pending).ok());
  EXPECT_TRUE(CancelBatch(*tool_, *running).ok());
  EXPECT_TRUE(CancelBatch(*tool_, 999999).ok());
  for (int64_t id : {*pending, *running}) {
    auto ended = WaitState(
        id, [](const std::string& s) { return s.rfind("CANCELLED", 0) == 0; });
    ASSERT_TRUE(ended.has_value()) << id;
    EXPECT_EQ(MapSlurmState(*ended, "gpu").phase, SlurmPhase::kEnded);
  }
}

}  // namespace
}  // namespace dlbatch::scheduler::slurm
