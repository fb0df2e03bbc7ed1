// The preemption policy over nodes another scheduler allocates (a Slurm
// partition): ChooseVictimsOnNodes, rule by rule. The input is the whole
// view (times are arguments), so each case is a table of nodes and jobs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scheduler/core/preemption.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr TimeMs kMinute = 60 * 1000;
constexpr TimeMs kNow = 60 * kMinute;

PreemptionPolicy Policy(PreemptionMode mode = PreemptionMode::kPriority) {
  PreemptionPolicy p;
  p.mode = mode;
  return p;
}

NodeCandidate Running(JobId id, std::vector<std::string> nodes, int per_node,
                      int priority = 0, TimeMs started = 0,
                      std::optional<TimeMs> checkpoint = std::nullopt) {
  NodeCandidate c;
  c.job.id = id;
  c.job.priority = priority;
  c.job.started = started;
  c.job.checkpoint = checkpoint;
  c.nodes = std::move(nodes);
  c.per_node = per_node;
  return c;
}

// Two nodes of two GPUs; the waiting job 10 (priority 10) asks for
// `nodes` nodes of `per_node`.
NodePreemptionInput TwoNodes(int nodes, int per_node) {
  NodePreemptionInput in;
  in.job.id = 10;
  in.job.priority = 10;
  in.nodes = nodes;
  in.per_node = per_node;
  in.room = {{"n1", 2, 0}, {"n2", 2, 0}};
  return in;
}

TEST(NodePreemption, TakesTheJobThatLosesTheLeastWorkOnOneNode) {
  NodePreemptionInput in = TwoNodes(1, 2);
  // Job 1 checkpointed 5 minutes ago, job 2 30 minutes ago.
  in.running = {Running(1, {"n1"}, 2, 0, 0, kNow - 5 * kMinute),
                Running(2, {"n2"}, 2, 0, 0, kNow - 30 * kMinute)};
  PreemptionChoice c = ChooseVictimsOnNodes(in, Policy(), kNow);
  EXPECT_THAT(c.ids(), ElementsAre(1)) << c.reason;
  EXPECT_EQ(c.lost_ms, 5 * kMinute);
}

TEST(NodePreemption, AJobOfTwoNodesTakesBothNodesJobs) {
  NodePreemptionInput in = TwoNodes(2, 2);
  in.running = {Running(1, {"n1"}, 2), Running(2, {"n2"}, 2)};
  EXPECT_THAT(ChooseVictimsOnNodes(in, Policy(), kNow).ids(),
              ElementsAre(1, 2));
}

TEST(NodePreemption, OneJobOverBothNodesIsFewerThanTwo) {
  NodePreemptionInput in = TwoNodes(2, 2);
  // Job 3 spans both nodes and loses more than 1 and 2 together: fewest
  // jobs comes first.
  in.running = {Running(3, {"n1", "n2"}, 2, 0, 0, kNow - 50 * kMinute)};
  EXPECT_THAT(ChooseVictimsOnNodes(in, Policy(), kNow).ids(), ElementsAre(3));
}

TEST(NodePreemption, WhatOthersHoldStaysTaken) {
  NodePreemptionInput in = TwoNodes(1, 2);
  // n1: job 1 holds one GPU, a job that is not dlbatch's the other; n2:
  // job 2 holds both. Only job 2's release gives a node two GPUs.
  in.room = {{"n1", 2, 0}, {"n2", 2, 0}};
  in.running = {Running(1, {"n1"}, 1, 0, 0, kNow),
                Running(2, {"n2"}, 2, 0, 0, kNow - 40 * kMinute)};
  EXPECT_THAT(ChooseVictimsOnNodes(in, Policy(), kNow).ids(), ElementsAre(2));
  // With n1's other GPU free, job 1 (nothing lost) is enough.
  in.room[0].free = 1;
  EXPECT_THAT(ChooseVictimsOnNodes(in, Policy(), kNow).ids(), ElementsAre(1));
}

TEST(NodePreemption, ANodeShortOfTheShareNeverTakesTheJob) {
  NodePreemptionInput in = TwoNodes(1, 2);
  in.room = {{"small", 1, 0}, {"n2", 2, 0}};
  in.running = {Running(1, {"small"}, 1), Running(2, {"n2"}, 2, 0, 0, kNow)};
  EXPECT_THAT(ChooseVictimsOnNodes(in, Policy(), kNow).ids(), ElementsAre(2));
}

TEST(NodePreemption, FreeRoomEnoughPreemptsNothing) {
  NodePreemptionInput in = TwoNodes(1, 2);
  in.room[1].free = 2;
  in.running = {Running(1, {"n1"}, 2)};
  PreemptionChoice c = ChooseVictimsOnNodes(in, Policy(), kNow);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kFitsNow);
}

TEST(NodePreemption, NeverEqualPriorityNonPreemptibleOrInsideMinRun) {
  NodePreemptionInput in = TwoNodes(1, 2);
  NodeCandidate equal = Running(1, {"n1"}, 2, /*priority=*/10);
  NodeCandidate pinned = Running(2, {"n2"}, 2);
  pinned.job.preemptible = false;
  in.running = {equal, pinned};
  PreemptionChoice c = ChooseVictimsOnNodes(in, Policy(), kNow);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kNoVictims);
  EXPECT_THAT(c.reason, HasSubstr("1 job of equal or higher priority"));
  EXPECT_THAT(c.reason, HasSubstr("1 job not preemptible"));
  // Started 5 minutes ago, inside the default min_run of 10.
  in.running = {Running(3, {"n1"}, 2, 0, kNow - 5 * kMinute)};
  c = ChooseVictimsOnNodes(in, Policy(), kNow);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_THAT(c.reason, HasSubstr("inside min_run"));
}

TEST(NodePreemption, NotOnTheNodesOrNotEnoughIsNoChoice) {
  NodePreemptionInput in = TwoNodes(2, 2);
  // Job 1 runs on a node the partition does not offer now (drained).
  in.running = {Running(1, {"n3"}, 2), Running(2, {"n2"}, 2)};
  PreemptionChoice c = ChooseVictimsOnNodes(in, Policy(), kNow);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kNeverFits);
}

TEST(NodePreemption, ModeOffAndAVictimThatPreemptedItBefore) {
  NodePreemptionInput in = TwoNodes(1, 2);
  in.running = {Running(1, {"n1"}, 2, /*priority=*/10)};
  EXPECT_EQ(ChooseVictimsOnNodes(in, Policy(PreemptionMode::kOff), kNow).why,
            NoPreemption::kOff);
  // Job 1 reclaimed its slots from job 10 at equal priority: job 10 never
  // takes them back from it.
  in.job.displaced = {{1, PreemptionKind::kReclaim}};
  in.job.user = "a";
  in.running[0].job.user = "b";
  in.usage = {{"a", 0, 0.0}, {"b", 100, 1.0}};
  EXPECT_THAT(
      ChooseVictimsOnNodes(in, Policy(PreemptionMode::kFairShare), kNow).ids(),
      IsEmpty());
}

TEST(NodePreemption, FairShareReclaimsAtEqualPriority) {
  NodePreemptionInput in = TwoNodes(1, 2);
  in.job.user = "a";
  NodeCandidate heavy = Running(1, {"n1"}, 2, /*priority=*/10);
  heavy.job.user = "b";
  NodeCandidate other = Running(2, {"n2"}, 2, /*priority=*/10);
  other.job.user = "b";
  in.running = {heavy, other};
  in.usage = {{"a", 0, 0.0}, {"b", 100, 1.0}};
  PreemptionChoice c =
      ChooseVictimsOnNodes(in, Policy(PreemptionMode::kFairShare), kNow);
  ASSERT_EQ(c.victims.size(), 1u) << c.reason;
  EXPECT_EQ(c.victims[0].kind, PreemptionKind::kReclaim);
  EXPECT_THAT(ChooseVictimsOnNodes(in, Policy(), kNow).ids(), IsEmpty());
}

}  // namespace
}  // namespace dlbatch::scheduler
