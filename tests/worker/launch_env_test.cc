// What each process of a launched command job is told (launch_env.h): the
// variables torchrun would set for the same layout.
#include "worker/launch_env.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

std::map<std::string, std::string> Env(const RankEnv& r) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : r.env) {
    EXPECT_TRUE(m.emplace(k, v).second) << k << " set twice";
  }
  return m;
}

LaunchLayout TwoWorkersOfTwoSlots(const char* mode, int part) {
  LaunchLayout l;
  l.mode = mode;
  l.part = part;
  l.parts = 2;
  l.pool = 4;
  l.first_rank = 2 * part;
  l.slots = 2;
  l.hosts = {"10.0.0.1", "10.0.0.2"};
  l.master_port = 29511;
  return l;
}

TEST(LaunchRanksTest, PerSlotIsOneProcessPerSlotAsTorchrunStartsThem) {
  absl::StatusOr<std::vector<RankEnv>> ranks =
      LaunchRanks(TwoWorkersOfTwoSlots(kLaunchPerSlot, 1));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].rank, 2);
  EXPECT_EQ((*ranks)[1].rank, 3);
  const std::map<std::string, std::string> want = {
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29511"},
      {"WORLD_SIZE", "4"},
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"NODE_RANK", "1"},
      {"ROLE_RANK", "3"},
      {"ROLE_WORLD_SIZE", "4"},
      {"ROLE_NAME", "default"},
      {"DLBATCH_HOSTS", "10.0.0.1,10.0.0.2"},
      {"OMP_NUM_THREADS", "1"},
  };
  EXPECT_EQ(Env((*ranks)[1]), want);
  EXPECT_EQ(Env((*ranks)[0]).at("LOCAL_RANK"), "0");
  EXPECT_EQ(Env((*ranks)[0]).at("RANK"), "2");
}

TEST(LaunchRanksTest, PerNodeIsOneProcessPerPartWithTheCountsForALauncher) {
  absl::StatusOr<std::vector<RankEnv>> ranks =
      LaunchRanks(TwoWorkersOfTwoSlots(kLaunchPerNode, 1));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].rank, 1);
  const std::map<std::string, std::string> want = {
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29511"},
      {"WORLD_SIZE", "2"},
      {"RANK", "1"},
      {"LOCAL_RANK", "0"},
      {"LOCAL_WORLD_SIZE", "1"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"NODE_RANK", "1"},
      {"ROLE_RANK", "1"},
      {"ROLE_WORLD_SIZE", "2"},
      {"ROLE_NAME", "default"},
      {"NNODES", "2"},
      {"NPROC_PER_NODE", "2"},
      {"DLBATCH_HOSTS", "10.0.0.1,10.0.0.2"},
      {"OMP_NUM_THREADS", "2"},
  };
  EXPECT_EQ(Env((*ranks)[0]), want);
}

TEST(LaunchRanksTest, GpusLeaveTheThreadsToTheJob) {
  LaunchLayout l = TwoWorkersOfTwoSlots(kLaunchPerSlot, 0);
  l.gpus = true;
  absl::StatusOr<std::vector<RankEnv>> ranks = LaunchRanks(l);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (const RankEnv& r : *ranks)
    EXPECT_EQ(Env(r).count("OMP_NUM_THREADS"), 0u);
}

// Parts of unequal size (a pool of 3 over two workers): ranks follow the
// parts' first ranks, as the scheduler numbers them.
TEST(LaunchRanksTest, UnequalPartsNumberRanksFromEachPartsFirstRank) {
  LaunchLayout l = TwoWorkersOfTwoSlots(kLaunchPerSlot, 1);
  l.pool = 3;
  l.slots = 1;
  l.first_rank = 2;
  absl::StatusOr<std::vector<RankEnv>> ranks = LaunchRanks(l);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ(Env((*ranks)[0]).at("RANK"), "2");
  EXPECT_EQ(Env((*ranks)[0]).at("WORLD_SIZE"), "3");
  EXPECT_EQ(Env((*ranks)[0]).at("LOCAL_WORLD_SIZE"), "1");
}

TEST(LaunchRanksTest, OnePartTalksOverLoopback) {
  LaunchLayout l;
  l.mode = kLaunchPerSlot;
  l.pool = 3;
  l.slots = 3;
  l.hosts = {"127.0.0.1"};
  l.master_port = 40000;
  absl::StatusOr<std::vector<RankEnv>> ranks = LaunchRanks(l);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 3u);
  EXPECT_EQ(Env((*ranks)[2]).at("RANK"), "2");
  EXPECT_EQ(Env((*ranks)[2]).at("DLBATCH_HOSTS"), "127.0.0.1");
  EXPECT_EQ(Env((*ranks)[2]).at("GROUP_WORLD_SIZE"), "1");
}

TEST(LaunchRanksTest, AnInconsistentLayoutIsAnError) {
  LaunchLayout l = TwoWorkersOfTwoSlots(kLaunchPerSlot, 0);
  l.hosts.pop_back();
  EXPECT_FALSE(LaunchRanks(l).ok());
  l = TwoWorkersOfTwoSlots(kLaunchPerSlot, 2);
  EXPECT_FALSE(LaunchRanks(l).ok());
  l = TwoWorkersOfTwoSlots(kLaunchPerSlot, 1);
  l.master_port = 0;
  EXPECT_FALSE(LaunchRanks(l).ok());
  l = TwoWorkersOfTwoSlots("all", 1);
  EXPECT_FALSE(LaunchRanks(l).ok());
  l = TwoWorkersOfTwoSlots(kLaunchPerSlot, 1);
  l.pool = 3;  // ranks 2..3 do not fit
  EXPECT_FALSE(LaunchRanks(l).ok());
}

}  // namespace
}  // namespace dlbatch::worker
