// dlbatch-train's command, the parts that start no process: how many ranks
// a command line makes this process start or be, what the launched ranks
// are told, and the scheduler's rendezvous a worker asks for. Whole runs of
// the command are train_run_test's.
#include "trainer/command.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

namespace dlbatch::trainer {
namespace {

TEST(PlanRanks, ALoneRunIsRankZeroOfOne) {
  CommandLine cl;
  absl::StatusOr<RankPlan> plan = PlanRanks(cl, /*pool=*/0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->launch);
  EXPECT_EQ(plan->rank, 0);
  EXPECT_EQ(plan->world, 1);
  EXPECT_EQ(plan->local_ranks, 1);
}

TEST(PlanRanks, SeveralRanksOrAPoolAreLaunched) {
  CommandLine cl;
  absl::StatusOr<RankPlan> plan = PlanRanks(cl, /*pool=*/3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->launch);
  EXPECT_EQ(plan->range.count, 3);
  EXPECT_EQ(plan->range.first, 0);
  EXPECT_EQ(plan->range.world, 3);
  cl.ranks = 2;  // --ranks wins over the pool
  cl.first_rank = 4;
  cl.world = 8;
  cl.world_given = true;
  plan = PlanRanks(cl, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->launch);
  EXPECT_EQ(plan->range.count, 2);
  EXPECT_EQ(plan->range.first, 4);
  EXPECT_EQ(plan->range.world, 8);
}

TEST(PlanRanks, OneRankOfARunOverMachinesIsThatRank) {
  CommandLine cl;
  cl.ranks = 1;
  cl.first_rank = 3;
  cl.world = 4;
  cl.world_given = true;
  absl::StatusOr<RankPlan> plan = PlanRanks(cl, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->launch);
  EXPECT_EQ(plan->rank, 3);
  EXPECT_EQ(plan->world, 4);
  EXPECT_EQ(plan->local_ranks, 1);
}

TEST(PlanRanks, ALaunchedRankIsItsRankWithItsPeersUnknown) {
  CommandLine cl;
  cl.rank = 2;
  cl.rank_given = true;
  cl.world = 4;
  absl::StatusOr<RankPlan> plan = PlanRanks(cl, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->launch);
  EXPECT_EQ(plan->rank, 2);
  EXPECT_EQ(plan->world, 4);
  EXPECT_EQ(plan->local_ranks, 0);
}

TEST(PlanRanks, RanksOutsideTheWorldSayWhatToChange) {
  CommandLine cl;
  cl.ranks = 3;
  cl.first_rank = 2;
  cl.world = 4;
  cl.world_given = true;
  absl::StatusOr<RankPlan> plan = PlanRanks(cl, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "ranks 2..4 do not fit in --world 4");
  cl = CommandLine();
  cl.rank = 4;
  cl.rank_given = true;
  cl.world = 4;
  plan = PlanRanks(cl, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "--rank 4 is not in [0, --world 4)");
}

// --thread-ranks: the machine's ranks are this process's threads; nothing
// is launched.
TEST(PlanRanks, ThreadRanksAreThisProcesssRanks) {
  CommandLine cl;
  cl.thread_ranks = true;
  absl::StatusOr<RankPlan> plan = PlanRanks(cl, /*pool=*/2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->launch);
  EXPECT_EQ(plan->thread_ranks, 2);
  EXPECT_EQ(plan->rank, 0);
  EXPECT_EQ(plan->world, 2);
  EXPECT_EQ(plan->local_ranks, 2);
  // One machine's share of a run over several.
  cl.ranks = 2;
  cl.first_rank = 2;
  cl.world = 4;
  cl.world_given = true;
  plan = PlanRanks(cl, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->launch);
  EXPECT_EQ(plan->thread_ranks, 2);
  EXPECT_EQ(plan->rank, 2);
  EXPECT_EQ(plan->world, 4);
  cl.first_rank = 3;
  plan = PlanRanks(cl, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "ranks 3..4 do not fit in --world 4");
  cl = CommandLine();
  cl.thread_ranks = true;
  cl.rank = 1;
  cl.rank_given = true;
  cl.world = 2;
  plan = PlanRanks(cl, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("takes no --rank"),
            absl::string_view::npos)
      << plan.status();
}

TEST(RankArguments, DropTheLaunchersWorldAndAddThreadsAndOutput) {
  const std::vector<std::string> args = {
      "job.yaml",       "--ranks",      "2", "--world",   "8",
      "--first-rank=4", "--first-rank", "4", "--world=8", "--resume"};
  EXPECT_EQ(
      RankArguments(args, 3, "out"),
      (std::vector<std::string>{"job.yaml", "--ranks", "2", "--resume",
                                "--threads", "3", "--output-dir", "out"}));
}

TEST(SchedulerRendezvousFromEnvironment, NeedsItsCompanions) {
  unsetenv("DLBATCH_RENDEZVOUS");
  unsetenv("DLBATCH_JOB_ID");
  unsetenv("DLBATCH_ATTEMPT");
  unsetenv("DLBATCH_RENDEZVOUS_SECRET");
  auto c = SchedulerRendezvousFromEnvironment();
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->has_value());
  setenv("DLBATCH_RENDEZVOUS", "unix:/run/s.sock", 1);
  setenv("DLBATCH_JOB_ID", "12", 1);
  c = SchedulerRendezvousFromEnvironment();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("DLBATCH_RENDEZVOUS_SECRET"),
            std::string::npos);
  setenv("DLBATCH_ATTEMPT", "2", 1);
  setenv("DLBATCH_RENDEZVOUS_SECRET", "s3cret", 1);
  c = SchedulerRendezvousFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->address, "unix:/run/s.sock");
  EXPECT_EQ((*c)->job_id, 12);
  EXPECT_EQ((*c)->attempt, 2);
  EXPECT_EQ((*c)->secret, "s3cret");
  unsetenv("DLBATCH_RENDEZVOUS");
}

}  // namespace
}  // namespace dlbatch::trainer
