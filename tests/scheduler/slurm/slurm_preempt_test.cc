// What preemption of dlbatch's own jobs reads of one squeue read
// (scheduler/slurm/preempt.h): the jobs next in Slurm's line, the running
// jobs' nodes, nodes being released, each node's room, and how the Slurm
// jobs of stopping jobs are ended.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/preempt.h"

namespace dlbatch::scheduler::slurm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr int64_t kNow = 1'000'000;
constexpr char kInstance[] = "0a1b2c3d";

SlurmJobRecord Record(int64_t job_id, int64_t slurm_id,
                      const std::string& profile = "hpc") {
  SlurmJobRecord r;
  r.job_id = job_id;
  r.attempt = 1;
  r.slurm_id = slurm_id;
  r.profile = profile;
  r.submitted_ms = kNow - 60'000;
  return r;
}

SqueueRow Row(int64_t slurm_id, int64_t job_id, std::string state,
              std::string reason = "None", std::string nodes = "") {
  SqueueRow row;
  row.slurm_id = slurm_id;
  row.name = SlurmJobName(kInstance, job_id);
  row.state = std::move(state);
  row.user = "alice";
  row.nodes = std::move(nodes);
  row.reason = std::move(reason);
  return row;
}

ReconcileInput Input() {
  ReconcileInput in;
  in.instance = kInstance;
  in.partitions = {{"hpc", "gpu"}, {"other", "gpu"}};
  in.now_ms = kNow;
  return in;
}

TEST(SlurmPreemptScan, JobsNextInSlurmsLineAndTheRunningJobsNodes) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103), Record(4, 104),
                Record(5, 105, "other")};
  in.jobs = {{1, JobPhase::kWaiting},
             {2, JobPhase::kWaiting},
             {3, JobPhase::kRunning},
             {4, JobPhase::kRunning},
             {5, JobPhase::kWaiting}};
  in.rows = {Row(101, 1, "PENDING", "Resources"),
             Row(102, 2, "PENDING", "Priority"),
             Row(103, 3, "RUNNING", "None", "n[1-2]"),
             Row(104, 4, "RUNNING", "None", "n3"),
             Row(105, 5, "PENDING", "Resources")};
  PreemptionScan scan = ScanForPreemption(in, {"hpc"});
  // Job 2 waits behind others; job 5's profile does not preempt.
  EXPECT_THAT(scan.waiting, ElementsAre(Pair("hpc", ElementsAre(1))));
  EXPECT_THAT(scan.nodes, ElementsAre(Pair(3, ElementsAre("n1", "n2")),
                                      Pair(4, ElementsAre("n3"))));
  EXPECT_THAT(scan.releasing, IsEmpty());
}

TEST(SlurmPreemptScan, NodesBeingReleasedHoldPreemptionBack) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102)};
  // Job 2 was preempted and queued again: its Slurm job still runs.
  in.jobs = {{1, JobPhase::kWaiting}};
  in.rows = {Row(101, 1, "PENDING", "Resources"),
             Row(102, 2, "RUNNING", "None", "n1")};
  EXPECT_THAT(ScanForPreemption(in, {"hpc"}).releasing, ElementsAre("n1"));
  // Its record replaced by the next attempt's: a Slurm job of this
  // instance no record holds.
  in.records = {Record(1, 101)};
  EXPECT_THAT(ScanForPreemption(in, {"hpc"}).releasing, ElementsAre("n1"));
  // Gone: nothing is released.
  in.rows = {Row(101, 1, "PENDING", "Resources"),
             Row(102, 2, "COMPLETED", "None", "n1")};
  EXPECT_THAT(ScanForPreemption(in, {"hpc"}).releasing, IsEmpty());
  // Any Slurm job completing (another user's too) frees its nodes.
  SqueueRow theirs = Row(900, 9, "COMPLETING", "None", "n[2-3]");
  theirs.name = "train.sh";
  in.rows.push_back(theirs);
  PreemptionScan scan = ScanForPreemption(in, {"hpc"});
  EXPECT_THAT(scan.releasing, ElementsAre("n2", "n3"));
  EXPECT_FALSE(scan.releasing_unknown);
  in.rows.back().nodes = "n[3";
  EXPECT_TRUE(ScanForPreemption(in, {"hpc"}).releasing_unknown);
}

TEST(SlurmPreemptScan, RoomCountsRanksOfFreeGpusAndCpus) {
  NodeRow row;
  row.name = "n1";
  row.usable = true;
  row.gpus = 4;
  row.gpus_used = 1;
  row.cpus = 8;
  row.cpus_idle = 2;
  NodeRoom gpus = RoomOf(row, /*gpus=*/true);
  EXPECT_EQ(gpus.units, 4);
  EXPECT_EQ(gpus.free, 2);  // a core for each GPU: two cores left
  NodeRoom cpus = RoomOf(row, /*gpus=*/false);
  EXPECT_EQ(cpus.units, 8);
  EXPECT_EQ(cpus.free, 2);
  row.usable = false;
  EXPECT_EQ(RoomOf(row, true).units, 0);
}

TEST(SlurmPreemptStop, SignalsWhereUnreachableAndCancelsPastTheGrace) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103), Record(4, 104)};
  in.jobs = {{1, JobPhase::kRunning},
             {2, JobPhase::kRunning},
             {3, JobPhase::kRunning},
             {4, JobPhase::kRunning}};
  in.rows = {Row(101, 1, "RUNNING"), Row(102, 2, "RUNNING"),
             Row(103, 3, "RUNNING"), Row(104, 4, "COMPLETED")};
  std::map<int64_t, StoppingJob> stopping = {
      {1, {kNow + 10'000, /*unreachable=*/false}},
      {2, {kNow + 10'000, /*unreachable=*/true}},
      {3, {kNow - 20'000, /*unreachable=*/true}},
      {4, {kNow - 20'000, /*unreachable=*/true}}};
  StopDecisions d = StopPreempted(in, stopping, {}, 15'000);
  EXPECT_THAT(d.signal, ElementsAre(102));
  EXPECT_THAT(d.cancel, ElementsAre(103));  // 104 has ended already
  // Signalled once only; within the margin, not cancelled yet.
  d = StopPreempted(in, stopping, {102, 103}, 25'000);
  EXPECT_THAT(d.signal, IsEmpty());
  EXPECT_THAT(d.cancel, IsEmpty());
}

}  // namespace
}  // namespace dlbatch::scheduler::slurm
