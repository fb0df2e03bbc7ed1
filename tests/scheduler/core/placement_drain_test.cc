// Drained, offline, lost and forgotten workers in the placement core: a
// draining worker takes no new jobs but counts at submit (jobs queue for
// it); an offline or lost one does not count at submit, and is named; once
// forgotten, queued jobs that can never run are named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/core/placement.h"

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

TEST(PlacementDrain, SubmitCountsDrainingWorkersButNotOfflineOrLostOnes) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 2);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 2)).ok());
  // Drain is maintenance: the job queues for the worker's return.
  core.SetDraining(2, true);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 2)).ok());
  core.SetDraining(1, true);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 1)).ok());
  // What the whole profile cannot hold, draining workers included, is
  // refused at once.
  absl::Status s = core.CheckSatisfiable(Job(1, 5, 2));
  EXPECT_EQ(s.message(),
            "pool 5 exceeds profile 'p' (4 slots on 2 workers); use --pool 4 "
            "or another profile");
  core.SetDraining(1, false);
  core.SetDraining(2, false);
  // Not back yet after a scheduler restart: expected back, counted.
  core.WorkerAwaited(2);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 2)).ok());
  // Its connection broke: its slots are not capacity, even before it is
  // lost.
  core.WorkerOffline(2);
  s = core.CheckSatisfiable(Job(1, 4, 2));
  EXPECT_EQ(s.message(),
            "pool 4 exceeds profile 'p' (2 slots on 1 online worker; '#2' is "
            "offline); use --pool 2, or wait for #2 to return");
  core.WorkerLost(2);
  EXPECT_THAT(core.CheckSatisfiable(Job(1, 4, 2)).message(),
              HasSubstr("'#2' is offline"));
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 2)).ok());
  core.WorkerOffline(1);
  s = core.CheckSatisfiable(Job(1, 1));
  EXPECT_EQ(s.message(),
            "pool 1 exceeds profile 'p' (0 slots on 0 online workers; '#1' is "
            "offline, '#2' is offline); no worker of it is online; wait for "
            "#1 and #2 to return, start a worker with this profile or use "
            "another profile");
  // It comes back: counted again.
  core.WorkerOnline(2, "p", 2);
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 2)).ok());
}

TEST(PlacementDrain, SubmitNamesTheOfflineWorkersItLeavesOut) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 1);
  core.WorkerOnline(3, "p", 4);
  core.WorkerOffline(2);
  core.WorkerOffline(3);
  const WorkerLabeler labels = [](WorkerId id) {
    return WorkerLabel{absl::StrCat("w", id),
                       absl::StrCat("offline since 12:0", id, ":00")};
  };
  // It would fit with w2: waiting for them is a way out.
  absl::Status s = core.CheckSatisfiable(Job(1, 3, 2), labels);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "pool 3 exceeds profile 'p' (2 slots on 1 online worker; 'w2' is "
            "offline since 12:02:00, 'w3' is offline since 12:03:00); use "
            "--pool 2, or wait for w2 and w3 to return");
  // Spanning: the hint stays, with the way to wait.
  s = core.CheckSatisfiable(Job(1, 4), labels);
  EXPECT_THAT(s.message(), HasSubstr("use --pool 2, or wait for w2 and w3 to "
                                     "return"));
  // Not even with them: no waiting offered.
  s = core.CheckSatisfiable(Job(1, 8, 3), labels);
  EXPECT_THAT(s.message(), HasSubstr("use --pool 2 or another profile"));
  EXPECT_THAT(s.message(), HasSubstr("'w3' is offline since 12:03:00"));
  // Many: the first few named, the rest counted.
  for (WorkerId w = 4; w <= 8; ++w) {
    core.WorkerOnline(w, "p", 1);
    core.WorkerOffline(w);
  }
  s = core.CheckSatisfiable(Job(1, 3), labels);
  EXPECT_THAT(s.message(), HasSubstr("'w5' is offline since 12:05:00, 3 more "
                                     "workers are offline); "));
  EXPECT_THAT(s.message(), HasSubstr("or wait for the offline workers to "
                                     "return"));
}

TEST(PlacementDrain, ExplainNamesTheWorkersAJobWaitsFor) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 2);
  core.WorkerOnline(3, "p", 1);
  core.SetDraining(1, true);
  core.Enqueue(Job(1, 2));
  EXPECT_THAT(Started(core, 0), ElementsAre(1));  // on worker 2
  core.Enqueue(Job(2, 2));
  EXPECT_THAT(Started(core, 1), IsEmpty());
  // Worker 2 frees up in time: the job waits for slots, not for workers.
  std::optional<WaitInfo> info = core.Explain(2);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->fits_online);
  EXPECT_EQ(info->draining_slots, 2);
  EXPECT_EQ(info->offline_slots, 0);
  EXPECT_THAT(info->draining, ElementsAre(1));
  // A pool 4 job fits only with the drained worker: it waits for it.
  QueuedJob wide = Job(3, 4, 2);
  wide.user = "alice";
  core.Enqueue(wide);
  info = core.Explain(3);
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->fits_online);
  EXPECT_THAT(info->draining, ElementsAre(1));
  EXPECT_THAT(info->offline, IsEmpty());
  core.WorkerOffline(3);
  core.WorkerLost(2);  // job 1 leaves with it
  info = core.Explain(3);
  EXPECT_FALSE(info->fits_online);
  EXPECT_THAT(info->offline, ElementsAre(2, 3));
  EXPECT_EQ(info->offline_slots, 3);
  EXPECT_EQ(info->draining_slots, 2);
  // A worker that does not run the job's user is no one to wait for.
  WorkerUsers only_bob;
  only_bob.anyone = false;
  only_bob.closed = true;
  only_bob.can = {"bob"};
  core.SetWorkerUsers(1, only_bob);
  info = core.Explain(3);
  EXPECT_THAT(info->draining, IsEmpty());
  // Resumed: it starts.
  core.SetWorkerUsers(1, WorkerUsers());
  core.SetDraining(1, false);
  EXPECT_THAT(Started(core, 2), ElementsAre(2));
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
