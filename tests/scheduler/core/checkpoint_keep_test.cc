// The pure choice of kept checkpoints and of the step a resume uses.
#include "scheduler/core/checkpoint_keep.h"

#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

using Keys = std::vector<CheckpointKey>;

TEST(ResumeStep, OnePartResumesFromItsNewest) {
  EXPECT_EQ(ResumeStep({}, 1), std::nullopt);
  EXPECT_EQ(ResumeStep({{0, 10}, {0, 30}, {0, 20}}, 1), 30);
  // Only part 0 counts for a job part 0 speaks for.
  EXPECT_EQ(ResumeStep({{0, 10}, {1, 40}}, 1), 10);
}

TEST(ResumeStep, EveryPartNeedsTheStep) {
  // Part 0 is ahead: the newest step both have.
  EXPECT_EQ(ResumeStep({{0, 10}, {0, 20}, {0, 30}, {1, 10}, {1, 20}}, 2), 20);
  // Steps need not be in order nor regular.
  EXPECT_EQ(ResumeStep({{1, 7}, {0, 30}, {1, 30}, {0, 7}, {1, 45}}, 2), 30);
  // No step in common, or a part with none.
  EXPECT_EQ(ResumeStep({{0, 10}, {1, 20}}, 2), std::nullopt);
  EXPECT_EQ(ResumeStep({{0, 10}, {0, 20}}, 2), std::nullopt);
  // Three parts: 20 lacks part 2.
  EXPECT_EQ(ResumeStep({{0, 10}, {1, 10}, {2, 10}, {0, 20}, {1, 20}}, 3), 10);
  // Parts outside 0 .. parts - 1 are not asked for.
  EXPECT_EQ(ResumeStep({{0, 10}, {1, 10}, {2, 30}, {0, 30}, {1, 30}}, 2), 30);
  EXPECT_EQ(ResumeStep({{0, 10}}, 0), std::nullopt);
}

TEST(CheckpointsToDrop, EachPartKeepsItsNewest) {
  EXPECT_THAT(CheckpointsToDrop({}, std::nullopt, 3), IsEmpty());
  EXPECT_THAT(CheckpointsToDrop({{0, 10}, {0, 20}, {0, 30}}, 30, 3), IsEmpty());
  EXPECT_THAT(CheckpointsToDrop({{0, 40}, {0, 10}, {0, 30}, {0, 20}}, 40, 3),
              ElementsAre(CheckpointKey{0, 10}));
  EXPECT_THAT(
      CheckpointsToDrop({{0, 10}, {0, 20}, {0, 30}, {0, 40}, {0, 50}}, 50, 2),
      ElementsAre(CheckpointKey{0, 10}, CheckpointKey{0, 20},
                  CheckpointKey{0, 30}));
  // Per part.
  EXPECT_THAT(
      CheckpointsToDrop({{0, 10}, {0, 20}, {1, 10}, {1, 20}, {1, 30}}, 20, 2),
      ElementsAre(CheckpointKey{1, 10}));
}

TEST(CheckpointsToDrop, TheResumeStepStaysInPlaceOfTheOldestOther) {
  // Part 0 raced ahead to 40 while part 1 has only 10: 10 is what a
  // resume needs, so part 0 keeps it with its two newest.
  const Keys kept = {{0, 10}, {0, 20}, {0, 30}, {0, 40}, {1, 10}};
  const std::optional<int64_t> resume = ResumeStep(kept, 2);
  ASSERT_EQ(resume, 10);
  EXPECT_THAT(CheckpointsToDrop(kept, resume, 3),
              ElementsAre(CheckpointKey{0, 20}));
  // Keeping one: only the resume step.
  EXPECT_THAT(CheckpointsToDrop(kept, resume, 1),
              ElementsAre(CheckpointKey{0, 20}, CheckpointKey{0, 30},
                          CheckpointKey{0, 40}));
  // A part without the resume step keeps its newest (keep < 1 is 1).
  EXPECT_THAT(CheckpointsToDrop({{1, 5}, {1, 7}}, 10, 0),
              ElementsAre(CheckpointKey{1, 5}));
}

TEST(CheckpointsAfter, ANewAttemptLeavesLaterStepsBehind) {
  const Keys kept = {{1, 20}, {0, 10}, {0, 20}, {0, 30}, {1, 10}};
  EXPECT_THAT(CheckpointsAfter(kept, 20), ElementsAre(CheckpointKey{0, 30}));
  EXPECT_THAT(CheckpointsAfter(kept, 30), IsEmpty());
  // Afresh: none of them is continued.
  EXPECT_THAT(CheckpointsAfter(kept, std::nullopt),
              ElementsAre(CheckpointKey{0, 10}, CheckpointKey{0, 20},
                          CheckpointKey{0, 30}, CheckpointKey{1, 10},
                          CheckpointKey{1, 20}));
}

}  // namespace
}  // namespace dlbatch::scheduler
