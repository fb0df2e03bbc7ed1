// Drained, lost and forgotten workers in the placement core (issue 21): a
// draining worker takes no new jobs and is not counted at submit; a lost
// one is not counted at submit; once forgotten, queued jobs that can never
// run are named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scheduler/placement.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

QueuedJob Job(JobId id, int pool, int max_nodes = 1,
              const std::string& profile = "p") {
  QueuedJob job;
  job.id = id;
  job.profile = profile;
  job.pool = pool;
  job.seq = id;
  job.max_nodes = max_nodes;
  return job;
}

std::vector<JobId> Started(PlacementCore& core, TimeMs now) {
  std::vector<JobId> jobs;
  for (const Decision& d : core.Schedule(now)) jobs.push_back(d.job);
  return jobs;
}

TEST(PlacementDrain, DrainingWorkerTakesNoNewJobsButKeepsItsRunningOnes) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 2);
  core.Enqueue(Job(1, 1));
  ASSERT_EQ(core.Schedule(0).front().parts.front().worker, 1);
  core.SetDraining(1, true);
  EXPECT_TRUE(core.IsRunning(1));
  // Best fit would pick worker 1 (one free slot); it is draining.
  core.Enqueue(Job(2, 1));
  std::vector<Decision> d = core.Schedule(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].parts.front().worker, 2);
  // Full: the next waits although worker 1 has a free slot.
  core.Enqueue(Job(3, 2));
  core.Enqueue(Job(4, 1));
  EXPECT_THAT(Started(core, 2), IsEmpty());
  // Drain survives a reconnect; resuming lets job 4 start there.
  core.WorkerOffline(1);
  core.WorkerOnline(1, "p", 2);
  EXPECT_THAT(Started(core, 3), IsEmpty());
  core.SetDraining(1, false);
  EXPECT_THAT(Started(core, 4), ElementsAre(4));
}

TEST(PlacementDrain, SubmitCountsNeitherDrainingNorLostWorkers) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 2);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 2)).ok());
  core.SetDraining(2, true);
  absl::Status s = core.CheckSatisfiable(Job(1, 4, 2));
  EXPECT_THAT(s.message(), HasSubstr("pool 4 exceeds profile 'p' (2 slots on "
                                     "1 worker; not counting 1 draining"));
  core.SetDraining(2, false);
  // Offline but not lost (a reconnect, a scheduler restart): counted.
  core.WorkerOffline(2);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 2)).ok());
  core.WorkerLost(2);
  s = core.CheckSatisfiable(Job(1, 4, 2));
  EXPECT_THAT(s.message(), HasSubstr("not counting 1 lost"));
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 2)).ok());
  core.WorkerLost(1);
  s = core.CheckSatisfiable(Job(1, 1));
  EXPECT_THAT(s.message(), HasSubstr("no worker of it can take jobs now"));
  // It comes back: counted again.
  core.WorkerOnline(2, "p", 2);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 2)).ok());
}

TEST(PlacementDrain, ForgettingAWorkerNamesTheQueuedJobsThatCanNeverRun) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 2);
  core.Enqueue(Job(1, 2));
  core.Enqueue(Job(2, 2));
  ASSERT_EQ(core.Schedule(0).size(), 2u);
  core.Enqueue(Job(3, 4, 2));  // both workers at once
  core.Enqueue(Job(4, 2));     // either
  EXPECT_THAT(core.Unrunnable(), IsEmpty());
  core.WorkerLost(2);
  core.SetDraining(1, true);
  // Lost and draining workers still count as the profile's: no verdict.
  EXPECT_THAT(core.Unrunnable(), IsEmpty());
  core.ForgetWorker(2);
  auto never = core.Unrunnable();
  ASSERT_EQ(never.size(), 1u);
  EXPECT_EQ(never[0].first, 3);
  EXPECT_THAT(never[0].second,
              HasSubstr("pool 4 exceeds profile 'p' (2 slots on 1 worker)"));
  core.ForgetWorker(1);
  EXPECT_EQ(core.Unrunnable().size(), 2u);
}

}  // namespace
}  // namespace dlbatch::scheduler
