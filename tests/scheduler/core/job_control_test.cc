// DecideAfter: Slurm's afterok for `submit --after`.
#include "scheduler/core/job_control.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dlbatch::scheduler {
namespace {

using ::testing::HasSubstr;

TEST(DecideAfter, ReadyWhenEveryJobFinished) {
  EXPECT_EQ(DecideAfter({}).kind, AfterVerdict::kReady);
  EXPECT_EQ(DecideAfter({{1, v1::JOB_STATE_FINISHED, ""},
                         {2, v1::JOB_STATE_FINISHED, ""}})
                .kind,
            AfterVerdict::kReady);
}

TEST(DecideAfter, WaitsNamingTheJobsNotEnded) {
  AfterVerdict v = DecideAfter({{1, v1::JOB_STATE_FINISHED, ""},
                                {2, v1::JOB_STATE_RUNNING, ""},
                                {3, v1::JOB_STATE_QUEUED, ""}});
  EXPECT_EQ(v.kind, AfterVerdict::kWait);
  EXPECT_EQ(v.reason,
            "waiting for jobs #2 (running), #3 (queued) to finish (--after)");
}

TEST(DecideAfter, NeverOnceOneEndedBadlyOrIsGone) {
  AfterVerdict v = DecideAfter({{2, v1::JOB_STATE_RUNNING, ""},
                                {4, v1::JOB_STATE_FAILED, "exit code 3"}});
  EXPECT_EQ(v.kind, AfterVerdict::kNever);
  EXPECT_EQ(v.reason,
            "job 4 it was to start after (--after) failed: exit code 3");
  v = DecideAfter({{5, v1::JOB_STATE_CANCELLED, ""}});
  EXPECT_EQ(v.kind, AfterVerdict::kNever);
  EXPECT_THAT(v.reason, HasSubstr("cancelled"));
  v = DecideAfter({{6, std::nullopt, ""}});
  EXPECT_EQ(v.kind, AfterVerdict::kNever);
  EXPECT_THAT(v.reason, HasSubstr("no longer exists"));
}

}  // namespace
}  // namespace dlbatch::scheduler
