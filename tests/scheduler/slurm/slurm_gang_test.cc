// Unit tests of a Slurm batch job's workers gathered by node
// (scheduler/slurm_gang.h): parts in node order once every node's worker
// has registered, whatever order they came in.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/gang.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(SlurmGangTest, PartsFollowNodeOrderWhateverOrderWorkersCameIn) {
  SlurmGang gang(12, 1, /*nodes=*/2, /*slots_per_node=*/2);
  EXPECT_FALSE(gang.complete());
  EXPECT_THAT(gang.Missing(), ElementsAre(0, 1));
  ASSERT_TRUE(gang.Join(1, 2, /*worker=*/40, /*slots=*/2).ok());
  EXPECT_FALSE(gang.complete());
  EXPECT_THAT(gang.Missing(), ElementsAre(0));
  ASSERT_TRUE(gang.Join(0, 2, /*worker=*/41, /*slots=*/2).ok());
  ASSERT_TRUE(gang.complete());
  EXPECT_THAT(gang.Missing(), IsEmpty());
  // Rank 0 (part 0) is on node 0.
  EXPECT_THAT(gang.Parts(), ElementsAre(Part{41, {0, 1}}, Part{40, {0, 1}}));
  EXPECT_EQ(gang.job_id(), 12);
  EXPECT_EQ(gang.attempt(), 1);
}

TEST(SlurmGangTest, AReconnectingWorkerKeepsItsNodeALeavingOneFreesIt) {
  SlurmGang gang(12, 1, 2, 1);
  ASSERT_TRUE(gang.Join(0, 2, 40, 1).ok());
  ASSERT_TRUE(gang.Join(0, 2, 40, 1).ok());  // the same worker again
  gang.Leave(40);
  EXPECT_THAT(gang.Missing(), ElementsAre(0, 1));
  gang.Leave(99);  // a stranger
  ASSERT_TRUE(gang.Join(0, 2, 42, 1).ok());
  EXPECT_THAT(gang.Missing(), ElementsAre(1));
}

TEST(SlurmGangTest, OnlyTheJobsNodesEachOnceWithTheirDevices) {
  SlurmGang gang(12, 2, 2, 4);
  EXPECT_THAT(gang.Join(2, 2, 40, 4).message(),
              HasSubstr("node 2 of attempt 2 of dlbatch job 12: not a node "
                        "of the job (0 to 1)"));
  // What the Slurm job cannot hold is FailedPrecondition: the job fails.
  absl::Status nodes = gang.Join(0, 3, 40, 4);
  EXPECT_TRUE(absl::IsFailedPrecondition(nodes)) << nodes;
  EXPECT_THAT(nodes.message(),
              HasSubstr("Slurm says the job has 3 nodes; dlbatch asked for 2"));
  absl::Status fewer = gang.Join(0, 2, 40, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(fewer)) << fewer;
  EXPECT_THAT(fewer.message(),
              HasSubstr("Slurm gave node 0 2 GPUs; the job needs 4 on each "
                        "node (attempt 2 of dlbatch job 12, 2 nodes): check "
                        "the profile's gpus_per_node and gres"));
  EXPECT_TRUE(absl::IsInvalidArgument(gang.Join(2, 2, 40, 4)));
  ASSERT_TRUE(gang.Join(0, 2, 40, 8).ok());  // more is fine: it uses 4
  EXPECT_THAT(gang.Join(0, 2, 41, 4).message(),
              HasSubstr("worker 40 already serves it"));
  EXPECT_THAT(gang.Join(1, 2, 40, 4).message(),
              HasSubstr("the worker already serves node 0"));
  ASSERT_TRUE(gang.Join(1, 2, 41, 4).ok());
  EXPECT_THAT(gang.Parts(),
              ElementsAre(Part{40, {0, 1, 2, 3}}, Part{41, {0, 1, 2, 3}}));
}

TEST(SlurmGangTest, ANodeWithFewerCpusThanItsShareCannotHoldTheJob) {
  SlurmGang gang(3, 1, 1, 2, /*gpus=*/false);
  absl::Status one = gang.Join(0, 1, 7, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(one)) << one;
  EXPECT_THAT(one.message(),
              HasSubstr("Slurm gave node 0 1 CPU; the job needs 2 on each "
                        "node (attempt 1 of dlbatch job 3, 1 node): see that "
                        "Slurm gives a job's task the CPUs it asks for"));
  EXPECT_FALSE(gang.complete());
  ASSERT_TRUE(gang.Join(0, 1, 7, 2).ok());
  EXPECT_TRUE(gang.complete());
}

TEST(SlurmGangTest, CpuOnlyNodesGiveThePoolOnOneNode) {
  SlurmGang gang(3, 1, 1, 8, /*gpus=*/false);
  ASSERT_TRUE(gang.Join(0, 1, 7, 8).ok());
  ASSERT_TRUE(gang.complete());
  ASSERT_EQ(gang.Parts().size(), 1u);
  EXPECT_EQ(gang.Parts()[0].devices.size(), 8u);
}

}  // namespace
}  // namespace dlbatch::scheduler
