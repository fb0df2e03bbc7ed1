// The %N of job arrays in the placement core: at most N jobs of an array
// run at once, the others park without holding anyone back, a requeued job
// goes ahead of the parked ones, a restart that finds more running than
// the limit starts none until enough end; and a property test over random
// events.
#include "scheduler/core/array_limits.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/core/placement.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

QueuedJob Job(JobId id, int64_t array = 0, int limit = 0, int pool = 1,
              int priority = 0) {
  QueuedJob job;
  job.id = id;
  job.profile = "p";
  job.pool = pool;
  job.priority = priority;
  job.seq = id;
  job.user = "alice";
  job.array_id = array;
  job.array_limit = limit;
  return job;
}

std::vector<JobId> JobsOf(const std::vector<Decision>& decisions) {
  std::vector<JobId> jobs;
  for (const Decision& d : decisions) jobs.push_back(d.job);
  std::sort(jobs.begin(), jobs.end());
  return jobs;
}

TEST(ArrayLimits, ReleasesTheFirstJobsUpToTheLimit) {
  ArrayLimits limits;
  std::vector<int64_t> released, parked;
  auto settle = [&] {
    released.clear();
    parked.clear();
    limits.Settle([&](int64_t id) { released.push_back(id); },
                  [&](int64_t id) { parked.push_back(id); });
  };
  for (int64_t id : {3, 1, 2, 4}) limits.Queued({7, 2, 0, id, id});
  settle();
  EXPECT_THAT(released, ElementsAre(1, 2));
  EXPECT_THAT(parked, IsEmpty());
  EXPECT_TRUE(limits.IsParked({7, 2, 0, 3, 3}));
  EXPECT_FALSE(limits.IsParked({7, 2, 0, 1, 1}));

  // Started: released -> running keeps the sum; nothing moves.
  limits.Unqueued({7, 2, 0, 1, 1});
  limits.Started({7, 2, 0, 1, 1});
  settle();
  EXPECT_THAT(released, IsEmpty());
  EXPECT_EQ(limits.Standing(7)->running, 1);
  EXPECT_EQ(limits.Standing(7)->released, 1);
  EXPECT_EQ(limits.Standing(7)->parked, 2);

  // A released job held (unqueued): the next one takes its place.
  limits.Unqueued({7, 2, 0, 2, 2});
  settle();
  EXPECT_THAT(released, ElementsAre(3));
  // Queued again (released), ahead of 3: 3 parks, 2 is released.
  limits.Queued({7, 2, 0, 2, 2});
  settle();
  EXPECT_THAT(released, ElementsAre(2));
  EXPECT_THAT(parked, ElementsAre(3));
  // More running than the limit: every queued job parks.
  limits.Started({7, 2, 0, 9, 9});
  limits.Started({7, 2, 0, 10, 10});
  settle();
  EXPECT_THAT(parked, ElementsAre(2));
  limits.Ended({7, 2, 0, 9, 9});
  settle();
  EXPECT_THAT(released, IsEmpty());  // 2 running of 2
  limits.Ended({7, 2, 0, 10, 10});
  settle();
  EXPECT_THAT(released, ElementsAre(2));
}

TEST(ArrayLimits, WaitText) {
  EXPECT_EQ(ArrayWaitText({12, 3, 3, 0, 17}),
            "array 12 has 3 of 3 running (%3)");
  EXPECT_EQ(ArrayWaitText({12, 3, 1, 2, 17}),
            "array 12 has 1 of 3 running and 2 next to start (%3)");
}

TEST(PlacementArrays, AtMostTheLimitRunAndParkedJobsHoldNoOneBack) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  for (JobId id = 1; id <= 20; ++id) core.Enqueue(Job(id, 5, 3));
  core.Enqueue(Job(21));           // a plain job behind the array
  core.Enqueue(Job(22, 6, 2, 2));  // another array, pool 2, %2
  core.Enqueue(Job(23, 6, 2, 2));
  core.Enqueue(Job(24, 6, 2, 2));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1, 2, 3, 21, 22, 23));
  EXPECT_EQ(core.queued_count(), 18u);

  std::optional<WaitInfo> info = core.Explain(4);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->array_limited);
  EXPECT_FALSE(info->reserved);
  EXPECT_EQ(ArrayWaitText(info->array), "array 5 has 3 of 3 running (%3)");
  EXPECT_EQ(core.Explain(24)->array.running, 2);
  EXPECT_FALSE(core.FitsWithReleased(4, {1}));  // parked: never
  EXPECT_FALSE(core.PreemptionSnapshot(4, 0)->within_limit);

  // One ends: the next index starts, in order.
  ASSERT_TRUE(core.Finished(2, 10));
  EXPECT_THAT(JobsOf(core.Schedule(10)), ElementsAre(4));
  // A parked job cancelled, a running one too: the next still in order.
  ASSERT_TRUE(core.Dequeue(5));
  ASSERT_TRUE(core.Finished(1, 20));
  EXPECT_THAT(JobsOf(core.Schedule(20)), ElementsAre(6));
  EXPECT_FALSE(core.IsQueued(5));
}

TEST(PlacementArrays, AReleasedJobWaitingForSlotsKeepsItsPlace) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 1);
  core.Enqueue(Job(1));  // takes the one slot
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1));
  for (JobId id = 2; id <= 5; ++id) core.Enqueue(Job(id, 9, 2));
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  // 2 and 3 wait for a slot; 4 and 5 for the array.
  EXPECT_FALSE(core.Explain(2)->array_limited);
  EXPECT_TRUE(core.Explain(4)->array_limited);
  EXPECT_EQ(ArrayWaitText(core.Explain(4)->array),
            "array 9 has 0 of 2 running and 2 next to start (%2)");
  ASSERT_TRUE(core.Finished(1, 2));
  EXPECT_THAT(JobsOf(core.Schedule(2)), ElementsAre(2));
}

TEST(PlacementArrays, ARequeuedJobGoesAheadOfTheParkedOnes) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 2);
  for (JobId id = 1; id <= 6; ++id) core.Enqueue(Job(id, 4, 2));
  std::vector<Decision> first = core.Schedule(0);
  ASSERT_EQ(first.size(), 2u);
  const WorkerId lost_worker = first[0].parts[0].worker;
  std::vector<JobId> lost = core.WorkerLost(lost_worker);
  ASSERT_FALSE(lost.empty());
  // The scheduler queues the lost jobs again (their seq is their id).
  for (JobId id : lost) core.Enqueue(Job(id, 4, 2));
  std::vector<JobId> again = JobsOf(core.Schedule(1));
  EXPECT_EQ(again, lost) << "a parked job went ahead of a requeued one";
}

TEST(PlacementArrays, ARestartWithMoreRunningThanTheLimitStartsNone) {
  // As the scheduler rebuilds its core: queued jobs first, then the running
  // ones its store lists (the limit was lowered, or the store says so).
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  for (JobId id = 4; id <= 10; ++id) core.Enqueue(Job(id, 3, 2));
  for (JobId id = 1; id <= 3; ++id) {
    core.MarkRunning(Job(id, 3, 2), {Part{1, {static_cast<int>(id)}}}, 0);
  }
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  EXPECT_EQ(ArrayWaitText(core.Explain(4)->array),
            "array 3 has 3 of 2 running (%2)");
  ASSERT_TRUE(core.Finished(1, 1));
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  ASSERT_TRUE(core.Finished(2, 2));
  EXPECT_THAT(JobsOf(core.Schedule(2)), ElementsAre(4));
}

// Random events on one profile of pool-1 jobs of one user: arrays with
// limits, plain jobs, ends, cancels and lost workers. After every pass: no
// array runs more than its limit, and the core holds no job back that
// could run (a free slot and a queued job mean an array at its limit).
TEST(PlacementArrays, RandomEventsNeverPassALimitAndWasteNoSlot) {
  std::mt19937 rng(43);
  for (int round = 0; round < 20; ++round) {
    PlacementCore core;
    std::map<WorkerId, int> workers = {{1, 3}, {2, 2}, {3, 4}};
    for (const auto& [w, slots] : workers) core.WorkerOnline(w, "p", slots);
    std::map<int64_t, int> limit_of = {{0, 0}, {1, 1}, {2, 2}, {3, 3}};
    std::map<JobId, QueuedJob> queued, running;
    std::map<JobId, WorkerId> where;
    JobId next = 1;
    for (int step = 0; step < 300; ++step) {
      const int what = static_cast<int>(rng() % 10);
      if (what < 5) {
        const int64_t array = static_cast<int64_t>(rng() % 4);
        QueuedJob job = Job(next++, array, limit_of[array]);
        core.Enqueue(job);
        queued[job.id] = job;
      } else if (what < 8 && !running.empty()) {
        auto it = std::next(running.begin(), rng() % running.size());
        ASSERT_TRUE(core.Finished(it->first, step));
        where.erase(it->first);
        running.erase(it);
      } else if (what == 8 && !queued.empty()) {
        auto it = std::next(queued.begin(), rng() % queued.size());
        ASSERT_TRUE(core.Dequeue(it->first));
        queued.erase(it);
      } else if (what == 9) {
        const WorkerId w = 1 + static_cast<WorkerId>(rng() % 3);
        for (JobId id : core.WorkerLost(w)) {
          // Lost jobs are queued again, as the scheduler does.
          QueuedJob job = running.at(id);
          running.erase(id);
          where.erase(id);
          core.Enqueue(job);
          queued[id] = job;
        }
        core.WorkerOnline(w, "p", workers[w]);
      }
      for (const Decision& d : core.Schedule(step)) {
        ASSERT_EQ(queued.count(d.job), 1u) << "started a job not queued";
        running[d.job] = queued.at(d.job);
        where[d.job] = d.parts[0].worker;
        queued.erase(d.job);
      }
      std::map<int64_t, int> running_of;
      for (const auto& [id, job] : running) ++running_of[job.array_id];
      for (const auto& [array, limit] : limit_of) {
        if (limit == 0) continue;
        ASSERT_LE(running_of[array], limit)
            << "array " << array << " at step " << step;
      }
      int free = 0;
      for (const auto& [w, slots] : workers) {
        free += static_cast<int>(core.FreeDevices(w).size());
      }
      if (free == 0) continue;
      for (const auto& [id, job] : queued) {
        ASSERT_TRUE(job.array_limit > 0 &&
                    running_of[job.array_id] == job.array_limit)
            << "job " << id << " of array " << job.array_id << " waits with "
            << free << " slots free at step " << step;
        ASSERT_TRUE(core.Explain(id)->array_limited);
      }
    }
  }
}

}  // namespace
}  // namespace dlbatch::scheduler
