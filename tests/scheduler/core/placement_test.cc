#include "scheduler/core/placement.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

QueuedJob Job(JobId id, int pool, int priority = 0, TimeMs limit = 0,
              int max_nodes = 1, const std::string& profile = "p") {
  QueuedJob job;
  job.id = id;
  job.profile = profile;
  job.pool = pool;
  job.priority = priority;
  job.seq = id;
  job.max_nodes = max_nodes;
  job.time_limit_ms = limit;
  return job;
}

std::vector<JobId> JobsOf(const std::vector<Decision>& decisions) {
  std::vector<JobId> jobs;
  for (const Decision& d : decisions) jobs.push_back(d.job);
  return jobs;
}

// Enqueues `job` and runs a pass at `now`; returns the one decision for it.
Decision StartNow(PlacementCore& core, const QueuedJob& job, TimeMs now = 0) {
  core.Enqueue(job);
  std::vector<Decision> decisions = core.Schedule(now);
  EXPECT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions.empty() ? -1 : decisions[0].job, job.id);
  return decisions.empty() ? Decision{} : decisions[0];
}

// --- Gang placement --------------------------------------------------------

TEST(PlacementGang, WaitsForWholePoolOnOneWorker) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 4);
  StartNow(core, Job(1, 2));  // worker 1 (tie: lower id)
  StartNow(core, Job(2, 3));  // worker 2, the only one with 3 free
  core.Enqueue(Job(3, 3));    // 2 + 1 free: enough in sum, not on one
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  EXPECT_TRUE(core.IsQueued(3));
  ASSERT_TRUE(core.Finished(1));
  std::vector<Decision> d = core.Schedule(2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 3);
  EXPECT_THAT(d[0].parts, ElementsAre(Part{1, {0, 1, 2}}));
}

TEST(PlacementGang, SpansWorkersOnlyWhenMaxNodesAllows) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 4);
  StartNow(core, Job(1, 2));  // worker 1
  StartNow(core, Job(2, 3));  // worker 2
  core.Enqueue(Job(3, 3, 0, 0, /*max_nodes=*/1));
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  ASSERT_TRUE(core.Dequeue(3));
  core.Enqueue(Job(4, 3, 0, 0, /*max_nodes=*/2));
  std::vector<Decision> d = core.Schedule(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 4);
  EXPECT_THAT(d[0].parts, ElementsAre(Part{1, {2, 3}}, Part{2, {3}}));
}

TEST(PlacementGang, DevicesAreTheLowestFreeIndices) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  EXPECT_THAT(StartNow(core, Job(1, 1)).parts, ElementsAre(Part{1, {0}}));
  EXPECT_THAT(StartNow(core, Job(2, 2)).parts, ElementsAre(Part{1, {1, 2}}));
  EXPECT_THAT(StartNow(core, Job(3, 1)).parts, ElementsAre(Part{1, {3}}));
  EXPECT_THAT(core.FreeDevices(1), IsEmpty());
  core.Finished(2);
  EXPECT_THAT(core.FreeDevices(1), ElementsAre(1, 2));
  EXPECT_THAT(StartNow(core, Job(4, 1)).parts, ElementsAre(Part{1, {1}}));
  EXPECT_THAT(core.FreeDevices(1), ElementsAre(2));
}

// --- Order -------------------------------------------------------------------

TEST(PlacementOrder, PriorityFirstThenSubmissionOrder) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 1);
  core.Enqueue(Job(10, 1, /*priority=*/0));
  core.Enqueue(Job(11, 1, /*priority=*/5));
  core.Enqueue(Job(12, 1, /*priority=*/0));
  core.Enqueue(Job(13, 1, /*priority=*/5));
  core.Enqueue(Job(14, 1, /*priority=*/-1));
  std::vector<JobId> order;
  for (TimeMs t = 0; t < 5; ++t) {
    std::vector<Decision> d = core.Schedule(t);
    ASSERT_EQ(d.size(), 1u);
    order.push_back(d[0].job);
    core.Finished(d[0].job);
  }
  EXPECT_THAT(order, ElementsAre(11, 13, 10, 12, 14));
}

TEST(PlacementOrder, SeqNotIdDecidesFifo) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 1);
  QueuedJob late = Job(1, 1);
  late.seq = 100;
  QueuedJob early = Job(2, 1);
  early.seq = 50;
  core.Enqueue(late);
  core.Enqueue(early);
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(2));
}

TEST(PlacementOrder, OneDecisionListInOrder) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  core.Enqueue(Job(1, 2, 0));
  core.Enqueue(Job(2, 2, 3));
  core.Enqueue(Job(3, 2, 1));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(2, 3, 1));
  EXPECT_EQ(core.running_count(), 3u);
  EXPECT_EQ(core.queued_count(), 0u);
}

// --- Best fit and spanning ---------------------------------------------------

TEST(PlacementFit, BestFitTakesFewestFreeThatHolds) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  core.WorkerOnline(2, "p", 4);
  core.WorkerOnline(3, "p", 2);
  EXPECT_THAT(StartNow(core, Job(1, 2)).parts, ElementsAre(Part{3, {0, 1}}));
  EXPECT_THAT(StartNow(core, Job(2, 3)).parts, ElementsAre(Part{2, {0, 1, 2}}));
  // Free now: 8, 1, 0. A pool of 1 goes to the worker with 1 free.
  EXPECT_THAT(StartNow(core, Job(3, 1)).parts, ElementsAre(Part{2, {3}}));
  EXPECT_EQ(StartNow(core, Job(4, 5)).parts[0].worker, 1);
}

TEST(PlacementFit, OneWorkerPreferredEvenWhenSpanningAllowed) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 3);
  core.WorkerOnline(2, "p", 5);
  core.WorkerOnline(3, "p", 6);
  Decision d = StartNow(core, Job(1, 5, 0, 0, /*max_nodes=*/3));
  EXPECT_THAT(d.parts, ElementsAre(Part{2, {0, 1, 2, 3, 4}}));
}

TEST(PlacementFit, SpanningUsesFewestWorkersMostFreeFirst) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "p", 3);
  core.WorkerOnline(3, "p", 5);
  core.WorkerOnline(4, "p", 6);
  // 10 = 6 + 4: two workers; the second is the best fit for 4 (5 free).
  Decision d = StartNow(core, Job(1, 10, 0, 0, /*max_nodes=*/4));
  EXPECT_THAT(d.parts,
              ElementsAre(Part{4, {0, 1, 2, 3, 4, 5}}, Part{3, {0, 1, 2, 3}}));
  core.Finished(1);
  // 12 = 6 + 5 + 1: three workers; the last is the best fit for 1 (2 free).
  d = StartNow(core, Job(2, 12, 0, 0, /*max_nodes=*/4));
  ASSERT_EQ(d.parts.size(), 3u);
  EXPECT_EQ(d.parts[0].worker, 4);
  EXPECT_EQ(d.parts[1].worker, 3);
  EXPECT_THAT(d.parts[2], (Part{1, {0}}));
}

TEST(PlacementFit, SpanningRespectsMaxNodes) {
  PlacementCore core;
  for (WorkerId w = 1; w <= 4; ++w) core.WorkerOnline(w, "p", 2);
  core.Enqueue(Job(1, 6, 0, 0, /*max_nodes=*/2));
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  core.Enqueue(Job(2, 6, 0, 0, /*max_nodes=*/3));
  std::vector<Decision> d = core.Schedule(0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 2);
  EXPECT_EQ(d[0].parts.size(), 3u);
}

// --- Backfill ----------------------------------------------------------------

// One worker of 4: job 1 holds 3 slots until t=100; job 2 (pool 4) waits
// with a reservation at t=100 on all 4 slots.
class BackfillOneWorker : public ::testing::Test {
 protected:
  void SetUp() override {
    core_.WorkerOnline(1, "p", 4);
    StartNow(core_, Job(1, 3, 0, /*limit=*/100), /*now=*/0);
    core_.Enqueue(Job(2, 4, /*priority=*/1));
    ASSERT_THAT(core_.Schedule(10), IsEmpty());
    std::optional<WaitInfo> info = core_.Explain(2);
    ASSERT_TRUE(info && info->reserved);
    ASSERT_EQ(info->reserved_start, 100);
  }
  PlacementCore core_;
};

TEST_F(BackfillOneWorker, JobEndingBeforeReservationStartsAhead) {
  core_.Enqueue(Job(3, 1, 0, /*limit=*/90));  // 10 + 90 <= 100
  EXPECT_THAT(JobsOf(core_.Schedule(10)), ElementsAre(3));
}

TEST_F(BackfillOneWorker, JobWithoutLimitOnNeededSlotsWaits) {
  core_.Enqueue(Job(3, 1));
  EXPECT_THAT(core_.Schedule(10), IsEmpty());
  EXPECT_TRUE(core_.IsQueued(3));
}

TEST_F(BackfillOneWorker, JobEndingAfterReservationWaits) {
  core_.Enqueue(Job(3, 1, 0, /*limit=*/91));  // 10 + 91 > 100
  EXPECT_THAT(core_.Schedule(10), IsEmpty());
}

TEST_F(BackfillOneWorker, HeadStartsWhenSlotsFree) {
  core_.Enqueue(Job(3, 1, 0, /*limit=*/50));
  EXPECT_THAT(JobsOf(core_.Schedule(10)), ElementsAre(3));
  core_.Finished(3);
  core_.Finished(1);
  EXPECT_THAT(JobsOf(core_.Schedule(100)), ElementsAre(2));
}

TEST(PlacementBackfill, JobOnSlotsTheHeadDoesNotNeedStarts) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 4);
  StartNow(core, Job(1, 3, 0, /*limit=*/100));  // worker 1, ends at 100
  StartNow(core, Job(2, 3));                    // worker 2, never ends
  core.Enqueue(Job(3, 4, /*priority=*/1));      // reserved: worker 1 at 100
  core.Enqueue(Job(4, 1));                      // no limit
  std::vector<Decision> d = core.Schedule(5);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 4);
  // Both workers have 1 free; the one on worker 1 is the head's.
  EXPECT_THAT(d[0].parts, ElementsAre(Part{2, {3}}));
  std::optional<WaitInfo> info = core.Explain(3);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->reserved);
  EXPECT_EQ(info->reserved_start, 100);
}

TEST(PlacementBackfill, SlackOnTheReservedWorkerIsUsedOnce) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  StartNow(core, Job(1, 4, 0, /*limit=*/100));
  StartNow(core, Job(2, 2));                // never ends: 6 free at t=100
  core.Enqueue(Job(3, 5, /*priority=*/1));  // needs 5 of those 6: slack 1
  core.Enqueue(Job(4, 1));
  core.Enqueue(Job(5, 1));
  core.Enqueue(Job(6, 1, 0, /*limit=*/50));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(4, 6));
  EXPECT_TRUE(core.IsQueued(5));
}

TEST(PlacementBackfill, UnestimatedReservationStillProtectsItsSlots) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 2);
  StartNow(core, Job(1, 3));   // worker 1, never ends
  core.Enqueue(Job(2, 4, 1));  // reserved at kNever on worker 1
  core.Enqueue(Job(3, 1));     // no limit: not on worker 1's last slot
  core.Enqueue(Job(4, 2));     // no limit: worker 2 is free of the head
  std::vector<Decision> d = core.Schedule(0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 3);
  EXPECT_EQ(d[0].parts[0].worker, 2);
  std::optional<WaitInfo> info = core.Explain(2);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->reserved);
  EXPECT_EQ(info->reserved_start, kNever);
  // A job with any limit ends before "never".
  core.Enqueue(Job(5, 1, 0, /*limit=*/1000000));
  EXPECT_THAT(JobsOf(core.Schedule(1)), ElementsAre(5));
}

// An unestimated reservation (kNever) counts the slots of jobs without a
// limit as never free: else each pass would find the slot a job backfilled
// in the pass before free again, and give it to another, and the head would
// never get its slots.
TEST(PlacementBackfill, UnestimatedReservationIsNotGivenAwayPassAfterPass) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 5);
  StartNow(core, Job(1, 3));   // never ends
  core.Enqueue(Job(2, 4, 1));  // the head: 4 of 5 once job 1 ends
  core.Enqueue(Job(3, 1));     // no limit
  core.Enqueue(Job(4, 1));     // no limit
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  ASSERT_TRUE(core.Finished(1, 2));
  EXPECT_THAT(JobsOf(core.Schedule(2)), ElementsAre(2, 3));
}

TEST(PlacementBackfill, OverdueJobsPutTheReservationAtNow) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.MarkRunning(Job(1, 4, 0, /*limit=*/10), {Part{1, {0, 1, 2, 3}}},
                   /*start=*/0);
  core.Enqueue(Job(2, 4));
  EXPECT_THAT(core.Schedule(50), IsEmpty());
  std::optional<WaitInfo> info = core.Explain(2);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->reserved);
  EXPECT_EQ(info->reserved_start, 50);
}

TEST(PlacementBackfill, JobThatCanNeverRunHoldsNoOneBack) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 8);
  core.WorkerOffline(2);
  core.Enqueue(Job(1, 8, /*priority=*/5));  // only fits the offline worker
  core.Enqueue(Job(2, 4));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(2));
  EXPECT_FALSE(core.Explain(1)->reserved);
}

TEST(PlacementBackfill, ManyJobsThatCanNeverRunAreSkipped) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 8);
  core.WorkerOffline(2);
  StartNow(core, Job(1, 3, 0, /*limit=*/100));
  for (JobId id = 100; id < 150; ++id) core.Enqueue(Job(id, 8, 5));
  core.Enqueue(Job(2, 4, 1));                // the head: at 100 on worker 1
  core.Enqueue(Job(3, 1));                   // no limit: would delay the head
  core.Enqueue(Job(4, 1, 0, /*limit=*/50));  // ends first
  core.Enqueue(Job(5, 6, 0, 0, /*max_nodes=*/2));  // never fits on worker 1
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(4));
  std::optional<WaitInfo> info = core.Explain(2);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->reserved);
  EXPECT_EQ(info->reserved_start, 100);
  EXPECT_EQ(info->jobs_ahead, 50);
  core.WorkerOnline(2, "p", 8);
  EXPECT_THAT(JobsOf(core.Schedule(1)), ElementsAre(100));
}

// Runs every job for exactly its time limit; passes happen at each end.
class Simulation {
 public:
  explicit Simulation(PlacementCore& core) : core_(core) {}

  void Submit(const QueuedJob& job) {
    jobs_[job.id] = job;
    core_.Enqueue(job);
  }
  void Started(JobId job, TimeMs at) {
    start_[job] = at;
    if (jobs_[job].time_limit_ms > 0) {
      ends_[at + jobs_[job].time_limit_ms].push_back(job);
    }
  }

  // After each pass, records for the job holding the reservation the
  // earliest reserved start it was given.
  void Pass(TimeMs now) {
    for (const Decision& d : core_.Schedule(now)) Started(d.job, now);
    for (const auto& [id, job] : jobs_) {
      if (!core_.IsQueued(id)) continue;
      std::optional<WaitInfo> info = core_.Explain(id);
      if (info && info->reserved && !promised_.count(id)) {
        promised_[id] = info->reserved_start;
      }
    }
  }

  void Run() {
    Pass(0);
    while (!ends_.empty()) {
      auto [t, ending] = *ends_.begin();
      ends_.erase(ends_.begin());
      for (JobId job : ending) core_.Finished(job);
      Pass(t);
    }
  }

  std::map<JobId, TimeMs> start_;
  std::map<JobId, TimeMs> promised_;

 private:
  PlacementCore& core_;
  std::map<JobId, QueuedJob> jobs_;
  std::map<TimeMs, std::vector<JobId>> ends_;
};

TEST(PlacementBackfill, HeadStartsExactlyAtItsReservation) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 4);
  Simulation sim(core);
  sim.Submit(Job(1, 4, 9, 100));  // worker 1 until 100
  sim.Submit(Job(2, 2, 9, 50));   // worker 2 until 50
  sim.Submit(Job(3, 1, 9, 300));  // worker 2 until 300
  sim.Submit(Job(4, 4, 5, 80));   // the head: worker 1 at 100
  JobId id = 10;
  for (int i = 0; i < 6; ++i) {
    sim.Submit(Job(id++, 1, 0, 30 + 20 * i));
    sim.Submit(Job(id++, 2, 0, 60 + 25 * i));
  }
  sim.Run();
  ASSERT_TRUE(sim.promised_.count(4));
  EXPECT_EQ(sim.promised_[4], 100);
  EXPECT_EQ(sim.start_[4], 100);
  // Backfill did happen ahead of the head.
  int ahead = 0;
  for (JobId j = 10; j < id; ++j) ahead += sim.start_[j] < 100;
  EXPECT_GT(ahead, 0);
}

TEST(PlacementBackfill, RandomHeadsAreNeverDelayed) {
  for (int seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) {
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    };
    PlacementCore core;
    const int workers = uniform(1, 4);
    for (WorkerId w = 1; w <= workers; ++w) {
      core.WorkerOnline(w, "p", uniform(2, 8));
    }
    const int largest = core.Profiles()[0].largest_worker;
    const int total = core.Profiles()[0].online_slots;
    Simulation sim(core);
    for (JobId id = 1; id <= 60; ++id) {
      const bool span = uniform(0, 3) == 0;
      sim.Submit(Job(id, uniform(1, span ? total : largest), uniform(0, 3),
                     uniform(1, 200), span ? workers : 1));
    }
    sim.Run();
    EXPECT_EQ(core.queued_count(), 0u);
    for (const auto& [job, promised] : sim.promised_) {
      EXPECT_EQ(sim.start_[job], promised) << "job " << job;
    }
  }
}

// --- Workers -----------------------------------------------------------------

TEST(PlacementWorkers, OfflineWorkerTakesNoJobsButKeepsItsOwn) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  StartNow(core, Job(1, 2));
  core.WorkerOffline(1);
  core.Enqueue(Job(2, 1));
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  EXPECT_TRUE(core.IsRunning(1));
  EXPECT_THAT(core.FreeDevices(1), ElementsAre(2, 3));
  ProfileSummary p = core.Profiles()[0];
  EXPECT_EQ(p.online_slots, 0);
  EXPECT_EQ(p.free_slots, 0);
  EXPECT_EQ(p.known_slots, 4);
  EXPECT_EQ(p.workers_online, 0);
  core.WorkerOnline(1, "p", 4);
  std::vector<Decision> d = core.Schedule(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(d[0].parts, ElementsAre(Part{1, {2}}));
}

TEST(PlacementWorkers, LostWorkerReturnsItsJobsAndLeavesThePool) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 2);
  StartNow(core, Job(1, 4));
  StartNow(core, Job(2, 1));  // worker 2
  core.Finished(1);
  StartNow(core, Job(3, 5, 0, 0, /*max_nodes=*/2));  // 4 on w1, 1 on w2
  EXPECT_THAT(core.WorkerLost(1), ElementsAre(3));
  EXPECT_FALSE(core.IsRunning(3));
  EXPECT_TRUE(core.IsRunning(2));
  EXPECT_EQ(core.running_count(), 1u);
  EXPECT_THAT(core.FreeDevices(2), ElementsAre(1));
  ProfileSummary p = core.Profiles()[0];
  EXPECT_EQ(p.online_slots, 2);
  EXPECT_EQ(p.known_slots, 6);
  EXPECT_EQ(p.free_slots, 1);
  EXPECT_EQ(p.running, 1);
  core.Enqueue(Job(4, 3));
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  // Still known, but a submit counts only workers not lost as capacity;
  // the queued job is not given up until the worker is forgotten.
  EXPECT_FALSE(core.CheckSatisfiable(Job(5, 4)).ok());
  EXPECT_THAT(core.Unrunnable(), IsEmpty());
  core.ForgetWorker(1);
  EXPECT_EQ(core.Profiles()[0].known_slots, 2);
  EXPECT_FALSE(core.CheckSatisfiable(Job(5, 4)).ok());
  ASSERT_EQ(core.Unrunnable().size(), 1u);
  EXPECT_EQ(core.Unrunnable()[0].first, 4);
  EXPECT_THAT(core.WorkerLost(99), IsEmpty());
}

TEST(PlacementWorkers, RecordedJobKeepsDevicesWhenWorkerJoins) {
  PlacementCore core;
  core.MarkRunning(Job(1, 2), {Part{7, {1, 2}}}, /*start=*/0);
  EXPECT_TRUE(core.IsRunning(1));
  core.WorkerOnline(7, "p", 4);
  EXPECT_THAT(core.FreeDevices(7), ElementsAre(0, 3));
  EXPECT_EQ(core.Profiles()[0].free_slots, 2);
  core.Enqueue(Job(2, 3));
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  core.Dequeue(2);
  core.Enqueue(Job(3, 2));
  std::vector<Decision> d = core.Schedule(0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(d[0].parts, ElementsAre(Part{7, {0, 3}}));
  core.Finished(1);
  EXPECT_THAT(core.FreeDevices(7), ElementsAre(1, 2));
}

TEST(PlacementWorkers, DevicesBeyondSlotsStayHeldUntilTheirJobEnds) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.MarkRunning(Job(1, 2), {Part{1, {3, 5}}}, 0);  // 5 is past the slots
  EXPECT_THAT(core.FreeDevices(1), ElementsAre(0, 1, 2));
  core.WorkerOnline(1, "p", 2);  // shrinks: device 3 is now past the slots
  EXPECT_THAT(core.FreeDevices(1), ElementsAre(0, 1));
  core.WorkerOnline(1, "p", 6);  // grows back: 3 and 5 still held
  EXPECT_THAT(core.FreeDevices(1), ElementsAre(0, 1, 2, 4));
  EXPECT_EQ(core.Profiles()[0].free_slots, 4);
  EXPECT_TRUE(core.Finished(1));
  EXPECT_EQ(core.Profiles()[0].free_slots, 6);
}

TEST(PlacementWorkers, MarkRunningTakesAQueuedJobOutOfTheQueue) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.Enqueue(Job(1, 1));
  core.MarkRunning(Job(1, 1), {Part{1, {1}}}, 0);
  EXPECT_FALSE(core.IsQueued(1));
  EXPECT_TRUE(core.IsRunning(1));
  EXPECT_EQ(core.queued_count(), 0u);
  EXPECT_EQ(core.Profiles()[0].queued, 0);
}

TEST(PlacementWorkers, WorkerMovesBetweenProfiles) {
  PlacementCore core;
  core.WorkerOnline(1, "a", 4);
  core.WorkerOnline(1, "b", 2);
  std::vector<ProfileSummary> p = core.Profiles();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].known_slots, 0);
  EXPECT_EQ(p[1].known_slots, 2);
  core.Enqueue(Job(1, 2, 0, 0, 1, "b"));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1));
}

TEST(PlacementQueue, DequeueAndFinishedReportWhatTheyDid) {
  PlacementCore core;
  core.Enqueue(Job(1, 1));
  EXPECT_TRUE(core.IsQueued(1));
  EXPECT_EQ(core.queued_count(), 1u);
  EXPECT_TRUE(core.Dequeue(1));
  EXPECT_FALSE(core.Dequeue(1));
  EXPECT_FALSE(core.Finished(1));
  EXPECT_EQ(core.queued_count(), 0u);
  EXPECT_FALSE(core.Explain(1).has_value());
  EXPECT_TRUE(core.HasProfile("p"));  // created by Enqueue
}

// --- CheckSatisfiable
// ---------------------------------------------------------

TEST(PlacementCheck, PoolLargerThanTheProfile) {
  PlacementCore core;
  core.WorkerOnline(1, "local", 4);
  absl::Status s = core.CheckSatisfiable(Job(1, 8, 0, 0, 1, "local"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "pool 8 exceeds profile 'local' (4 slots on 1 worker); use "
            "--pool 4 or another profile");
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 0, 0, 1, "local")).ok());
}

TEST(PlacementCheck, UnknownProfileListsKnownOnes) {
  PlacementCore core;
  core.AddProfile("local", 0);
  core.AddProfile("gpu", 0);
  absl::Status s = core.CheckSatisfiable(Job(1, 1, 0, 0, 1, "x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "unknown profile 'x'; known profiles: local, gpu");
}

TEST(PlacementCheck, PoolBelowOne) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  absl::Status s = core.CheckSatisfiable(Job(1, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pool 0 is not valid"));
  EXPECT_THAT(core.CheckSatisfiable(Job(1, -3)).message(),
              HasSubstr("use --pool 1"));
}

TEST(PlacementCheck, MaxPoolCaps) {
  PlacementCore core;
  core.AddProfile("gpu", 4);
  core.WorkerOnline(1, "gpu", 8);
  absl::Status s = core.CheckSatisfiable(Job(1, 6, 0, 0, 1, "gpu"));
  EXPECT_THAT(s.message(), HasSubstr("max_pool of profile 'gpu' (4)"));
  EXPECT_THAT(s.message(), HasSubstr("use --pool 4"));
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 4, 0, 0, 1, "gpu")).ok());
  core.AddProfile("gpu", 0);  // redeclared without a cap
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 6, 0, 0, 1, "gpu")).ok());
  EXPECT_EQ(core.Profiles()[0].max_pool_configured, 0);
}

TEST(PlacementCheck, LargerThanOneWorkerWithoutSpanning) {
  PlacementCore core;
  for (WorkerId w = 1; w <= 4; ++w) core.WorkerOnline(w, "gpu", 4);
  absl::Status s = core.CheckSatisfiable(Job(1, 8, 0, 0, 1, "gpu"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(16 slots on 4 workers)"));
  EXPECT_THAT(s.message(),
              HasSubstr("the largest worker has 4 slots; allow the job to "
                        "span workers with max_nodes, or use --pool 4"));
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 8, 0, 0, 2, "gpu")).ok());
}

TEST(PlacementCheck, SpanningNeedsMoreNodes) {
  PlacementCore core;
  for (WorkerId w = 1; w <= 4; ++w) core.WorkerOnline(w, "gpu", 4);
  absl::Status s = core.CheckSatisfiable(Job(1, 10, 0, 0, 2, "gpu"));
  EXPECT_THAT(s.message(), HasSubstr("raise max_nodes to 3"));
  EXPECT_THAT(s.message(), HasSubstr("use --pool 8"));
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 16, 0, 0, 4, "gpu")).ok());
  EXPECT_THAT(core.CheckSatisfiable(Job(1, 17, 0, 0, 8, "gpu")).message(),
              HasSubstr("exceeds profile 'gpu' (16 slots on 4 workers); use "
                        "--pool 16"));
}

TEST(PlacementCheck, AwaitedWorkersCountAsKnownCapacity) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  core.WorkerAwaited(1);  // known from before a restart, not back yet
  EXPECT_TRUE(core.CheckSatisfiable(Job(1, 8)).ok());
  core.WorkerOffline(1);  // it was back, and its connection broke
  EXPECT_FALSE(core.CheckSatisfiable(Job(1, 8)).ok());
  core.AddProfile("empty", 0);
  EXPECT_THAT(core.CheckSatisfiable(Job(1, 1, 0, 0, 1, "empty")).message(),
              HasSubstr("no worker has joined it"));
}

// --- Explain and Profiles
// -------------------------------------------------------

TEST(PlacementExplain, ReportsWhatTheJobWaitsFor) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 4);
  core.WorkerOnline(3, "p", 2);
  core.WorkerOffline(3);
  StartNow(core, Job(1, 4, 0, /*limit=*/100));  // worker 1 until 100
  StartNow(core, Job(2, 3));                    // worker 2
  core.Enqueue(Job(10, 4, /*priority=*/2));
  core.Enqueue(Job(11, 2, /*priority=*/0));
  core.Enqueue(Job(12, 2, /*priority=*/0));
  EXPECT_THAT(core.Schedule(5), IsEmpty());

  std::optional<WaitInfo> head = core.Explain(10);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->needed, 4);
  EXPECT_EQ(head->free_now, 1);
  EXPECT_EQ(head->largest_free, 1);
  EXPECT_EQ(head->online_slots, 8);
  EXPECT_EQ(head->offline_slots, 2);
  EXPECT_EQ(head->jobs_ahead, 0);
  EXPECT_EQ(head->first_ahead, 0);
  EXPECT_TRUE(head->reserved);
  EXPECT_EQ(head->reserved_start, 100);

  std::optional<WaitInfo> last = core.Explain(12);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->needed, 2);
  EXPECT_EQ(last->jobs_ahead, 2);
  EXPECT_EQ(last->first_ahead, 10);
  EXPECT_EQ(last->first_ahead_priority, 2);
  EXPECT_FALSE(last->reserved);
  EXPECT_EQ(last->reserved_start, kNever);
}

TEST(PlacementExplain, ProfilesSummarizeEachProfile) {
  PlacementCore core;
  core.AddProfile("gpu", 16);
  core.WorkerOnline(1, "gpu", 8);
  core.WorkerOnline(2, "gpu", 4);
  core.WorkerOnline(3, "cpu", 2);
  core.WorkerOffline(2);
  StartNow(core, Job(1, 3, 0, 0, 1, "gpu"));
  core.Enqueue(Job(2, 8, 0, 0, 1, "gpu"));
  core.Schedule(0);
  std::vector<ProfileSummary> p = core.Profiles();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "gpu");
  EXPECT_EQ(p[0].max_pool_configured, 16);
  EXPECT_EQ(p[0].workers, 2);
  EXPECT_EQ(p[0].workers_online, 1);
  EXPECT_EQ(p[0].online_slots, 8);
  EXPECT_EQ(p[0].free_slots, 5);
  EXPECT_EQ(p[0].known_slots, 12);
  EXPECT_EQ(p[0].largest_worker, 8);
  EXPECT_EQ(p[0].queued, 1);
  EXPECT_EQ(p[0].running, 1);
  EXPECT_EQ(p[1].name, "cpu");
  EXPECT_EQ(p[1].free_slots, 2);
}

TEST(PlacementExplain, ProfilesAreScheduledIndependently) {
  PlacementCore core;
  core.WorkerOnline(1, "a", 1);
  core.WorkerOnline(2, "b", 1);
  core.Enqueue(Job(1, 1, 0, 0, 1, "a"));
  core.Enqueue(Job(2, 1, 0, 0, 1, "a"));
  core.Enqueue(Job(3, 1, 0, 0, 1, "b"));
  std::vector<Decision> d = core.Schedule(0);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_THAT(d[0].parts, ElementsAre(Part{1, {0}}));
  EXPECT_THAT(d[1].parts, ElementsAre(Part{2, {0}}));
  EXPECT_THAT(JobsOf(d), ElementsAre(1, 3));
}

// --- Limits and fair share ---------------------------------------------------

QueuedJob UserJob(JobId id, const std::string& user, int pool, int priority = 0,
                  TimeMs limit = 0) {
  QueuedJob job = Job(id, pool, priority, limit);
  job.user = user;
  return job;
}

UserLimit Slots(int n) {
  UserLimit limit;
  limit.max_slots = n;
  return limit;
}

TEST(PlacementLimits, JobOverItsUsersSlotsWaitsAndSaysWhy) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 8);
  core.SetLimit("alice", "p", Slots(2));
  core.Enqueue(UserJob(1, "alice", 1));
  core.Enqueue(UserJob(2, "alice", 1));
  core.Enqueue(UserJob(3, "alice", 1));
  core.Enqueue(UserJob(4, "bob", 1));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1, 2, 4));
  std::optional<WaitInfo> info = core.Explain(3);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->over_limit);
  EXPECT_EQ(info->user, "alice");
  EXPECT_EQ(info->user_slots, 2);
  EXPECT_EQ(info->user_slot_limit, 2);
  EXPECT_FALSE(info->reserved);
  ASSERT_TRUE(core.Finished(1, 10));
  EXPECT_THAT(JobsOf(core.Schedule(10)), ElementsAre(3));
}

TEST(PlacementLimits, JobOverItsLimitHoldsNoOneBack) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.SetLimit("alice", "p", Slots(4));
  StartNow(core, UserJob(1, "alice", 2));
  // Alice's 4-slot job is first in order but over her limit: it takes no
  // reservation, and bob's later job takes the free slots.
  core.Enqueue(UserJob(2, "alice", 4, /*priority=*/5));
  core.Enqueue(UserJob(3, "bob", 2));
  EXPECT_THAT(JobsOf(core.Schedule(1)), ElementsAre(3));
  EXPECT_FALSE(core.Explain(2)->reserved);
}

TEST(PlacementLimits, RaisingALimitLetsTheJobStart) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.SetLimit("alice", "p", Slots(1));
  StartNow(core, UserJob(1, "alice", 1));
  core.Enqueue(UserJob(2, "alice", 1));
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  core.SetLimit("alice", "p", UserLimit{});
  EXPECT_THAT(JobsOf(core.Schedule(2)), ElementsAre(2));
  EXPECT_THAT(core.Limits(), IsEmpty());
}

TEST(PlacementLimits, BackfillLeavesTheHeadItsUsersRoom) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.WorkerOnline(2, "p", 4);
  core.SetLimit("alice", "p", Slots(4));
  StartNow(core, UserJob(1, "bob", 4, 0, /*limit=*/100));  // worker 1
  StartNow(core, UserJob(2, "bob", 1));                    // worker 2
  // Alice's head waits for worker 1 (t=100). Her 1-slot jobs fit on worker
  // 2's spare slots, but the head needs all 4 of her slots: none may start,
  // not even one that ends first. Bob's may.
  core.Enqueue(UserJob(3, "alice", 4, /*priority=*/1));
  core.Enqueue(UserJob(4, "alice", 1));
  core.Enqueue(UserJob(5, "alice", 1, 0, /*limit=*/10));
  core.Enqueue(UserJob(6, "bob", 1));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(6));
  std::optional<WaitInfo> head = core.Explain(3);
  ASSERT_TRUE(head.has_value());
  EXPECT_TRUE(head->reserved);
  EXPECT_EQ(head->reserved_start, 100);
  EXPECT_FALSE(head->over_limit);
  // With room for both, her small job backfills.
  core.SetLimit("alice", "p", Slots(5));
  EXPECT_THAT(JobsOf(core.Schedule(1)), ElementsAre(4));
  ASSERT_TRUE(core.Finished(1, 100));
  EXPECT_THAT(JobsOf(core.Schedule(100)), ElementsAre(3));
}

TEST(PlacementLimits, AdmissionNamesTheLimit) {
  PlacementCore core;
  core.WorkerOnline(1, "gpu", 8);
  UserLimit limit;
  limit.max_slots = 2;
  limit.max_queued = 2;
  core.SetLimit("alice", "gpu", limit);
  EXPECT_EQ(core.GetLimit("alice", "gpu"), limit);
  EXPECT_EQ(core.GetLimit("bob", "gpu"), UserLimit{});
  QueuedJob job = UserJob(1, "alice", 1);
  job.profile = "gpu";
  EXPECT_TRUE(core.CheckAdmission(job).ok());
  EXPECT_THAT(core.CheckAdmission(job, 3).message(),
              HasSubstr("alice has 0 of their 2 queued jobs on 'gpu' and "
                        "submits 3 more"));
  core.Enqueue(job);
  job.id = 2;
  core.Enqueue(job);
  absl::Status s = core.CheckAdmission(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(),
              HasSubstr("alice has 2 of their 2 queued jobs on 'gpu'"));
  EXPECT_THAT(s.message(), HasSubstr("--queued N"));
  job.pool = 3;
  s = core.CheckAdmission(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("pool 3 exceeds the limit of alice on 'gpu' (2 slots "
                        "at once); use --pool 2 or less"));
  job.user = "bob";
  EXPECT_TRUE(core.CheckAdmission(job, 100).ok());
  ASSERT_EQ(core.Limits().size(), 1u);
  EXPECT_EQ(core.Limits()[0].user, "alice");
  EXPECT_EQ(core.Limits()[0].profile, "gpu");
}

TEST(PlacementFairShare, LeastUsageStartsFirstAmongEqualPriorities) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 1);
  core.ChargeUsage("alice", 3600e3, 0);  // an hour of one slot
  core.Enqueue(UserJob(1, "alice", 1));
  core.Enqueue(UserJob(2, "alice", 1));
  core.Enqueue(UserJob(3, "bob", 1));
  core.Enqueue(UserJob(4, "carol", 1, /*priority=*/1));
  std::vector<JobId> order;
  for (TimeMs t = 1; t <= 4; ++t) {
    std::vector<Decision> d = core.Schedule(t);
    ASSERT_EQ(d.size(), 1u);
    order.push_back(d[0].job);
    ASSERT_TRUE(core.Finished(d[0].job, t + 1));
  }
  // Priority first; then bob, who has used nothing, before alice.
  EXPECT_THAT(order, ElementsAre(4, 3, 1, 2));
}

TEST(PlacementFairShare, RunningJobsCountAndUsersTakeTurns) {
  PlacementCore core;
  core.SetFairShareHalfLife(0);
  core.WorkerOnline(1, "p", 2);
  // Equal usage: submission order.
  for (JobId id = 1; id <= 6; ++id) {
    core.Enqueue(UserJob(id, id <= 3 ? "alice" : "bob", 1));
  }
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1, 2));
  // Alice has run 2 slots for 10 ms; bob nothing: bob's job goes first.
  ASSERT_TRUE(core.Finished(1, 10));
  EXPECT_THAT(JobsOf(core.Schedule(10)), ElementsAre(4));
  // Now alice 20 (job 2 still running: 10 + 10), bob 0 + running 0.
  ASSERT_TRUE(core.Finished(2, 20));
  EXPECT_THAT(JobsOf(core.Schedule(20)), ElementsAre(5));
  // At 40: alice 10 + 20; bob (40 - 10) + (40 - 20), both still running.
  std::vector<UserUsage> usage = core.Usage(40);
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].user, "alice");
  EXPECT_DOUBLE_EQ(usage[0].slot_seconds, 30 / 1000.0);
  EXPECT_EQ(usage[0].running_slots, 0);
  EXPECT_EQ(usage[1].user, "bob");
  EXPECT_DOUBLE_EQ(usage[1].slot_seconds, 50 / 1000.0);
  EXPECT_EQ(usage[1].running_slots, 2);
  EXPECT_DOUBLE_EQ(usage[0].share + usage[1].share, 1.0);
}

TEST(PlacementFairShare, UsageDecaysWithTheHalfLife) {
  PlacementCore core;
  constexpr TimeMs kHour = 3600 * 1000;
  core.SetFairShareHalfLife(kHour);
  core.WorkerOnline(1, "p", 4);
  core.ChargeUsage("alice", 1000e3, 0);
  StartNow(core, UserJob(1, "bob", 2), 0);
  ASSERT_TRUE(core.Finished(1, kHour));
  std::vector<UserUsage> at_hour = core.Usage(kHour);
  ASSERT_EQ(at_hour.size(), 2u);
  EXPECT_EQ(at_hour[0].user, "alice");
  EXPECT_NEAR(at_hour[0].slot_seconds, 500, 1e-6);
  // Two slots for an hour, each moment decayed: 2 h / ln 2 * (1 - 1/2).
  const double bob = 2 * 3600 / std::log(2.0) * 0.5;
  EXPECT_NEAR(at_hour[1].slot_seconds, bob, 1e-6);
  // Far ahead (the core moves its epoch on the way) both have halved often.
  for (TimeMs t = 2 * kHour; t <= 40 * kHour; t += kHour) core.Schedule(t);
  std::vector<UserUsage> later = core.Usage(41 * kHour);
  EXPECT_NEAR(later[0].slot_seconds, 500 * std::exp2(-40.0), 1e-15);
  EXPECT_NEAR(later[1].slot_seconds, bob * std::exp2(-40.0), 1e-15);
  EXPECT_NEAR(later[0].share, 500 / (500 + bob), 1e-9);
}

TEST(PlacementFairShare, OneUserKeepsSubmissionOrder) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 1);
  for (JobId id = 1; id <= 5; ++id) core.Enqueue(UserJob(id, "alice", 1));
  std::vector<JobId> order;
  for (TimeMs t = 0; t < 5; ++t) {
    std::vector<Decision> d = core.Schedule(t * 1000);
    ASSERT_EQ(d.size(), 1u);
    order.push_back(d[0].job);
    core.Finished(d[0].job, t * 1000 + 500);
  }
  EXPECT_THAT(order, ElementsAre(1, 2, 3, 4, 5));
}

// The order a pass tries the queue in, as the queue page shows it: fair
// share decides between users of one priority, so "priority, then
// submission" would put alice's older jobs first, wrongly.
TEST(PlacementQueueOrder, FairShareOrdersUsersOfOnePriority) {
  PlacementCore core;
  core.SetFairShareHalfLife(0);
  core.WorkerOnline(1, "p", 1);
  core.ChargeUsage("alice", 3600e3, 0);
  core.ChargeUsage("carol", 60e3, 0);
  StartNow(core, UserJob(1, "dave", 1), 0);  // the one slot is taken
  core.Enqueue(UserJob(2, "alice", 1));
  core.Enqueue(UserJob(3, "alice", 1));
  core.Enqueue(UserJob(4, "carol", 1));
  core.Enqueue(UserJob(5, "bob", 1));
  core.Enqueue(UserJob(6, "alice", 1, /*priority=*/2));
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  // Priority first; then bob (no usage), carol (a minute), alice (an hour);
  // each user's own jobs by submission.
  EXPECT_THAT(core.QueueOrder("p"), ElementsAre(6, 5, 4, 2, 3));
  EXPECT_THAT(core.QueueOrder("other"), IsEmpty());
  // Explain agrees, job by job.
  std::vector<JobId> order = core.QueueOrder("p");
  for (size_t i = 0; i < order.size(); ++i) {
    auto info = core.Explain(order[i]);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->position, static_cast<int>(i) + 1) << "job " << order[i];
    EXPECT_EQ(info->jobs_ahead, static_cast<int>(i));
  }
  // And it is the order they start in, one slot at a time.
  std::vector<JobId> started;
  ASSERT_TRUE(core.Finished(1, 2));
  for (TimeMs t = 2; t < 7; ++t) {
    std::vector<Decision> d = core.Schedule(t);
    ASSERT_EQ(d.size(), 1u);
    started.push_back(d[0].job);
    ASSERT_TRUE(core.Finished(d[0].job, t));  // no usage: the order holds
  }
  EXPECT_THAT(started, ElementsAre(6, 5, 4, 2, 3));
}

// Usage as of the last pass, running jobs counted: a user whose job started
// goes behind one who has none running.
TEST(PlacementQueueOrder, RunningUsageMovesAUserBack) {
  PlacementCore core;
  core.SetFairShareHalfLife(0);
  core.WorkerOnline(1, "p", 1);
  core.Enqueue(UserJob(1, "alice", 1));
  core.Enqueue(UserJob(2, "alice", 1));
  core.Enqueue(UserJob(3, "bob", 1));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1));
  EXPECT_THAT(core.QueueOrder("p"), ElementsAre(2, 3));  // equal usage at 0
  EXPECT_THAT(core.Schedule(1000), IsEmpty());  // alice: a second running
  EXPECT_THAT(core.QueueOrder("p"), ElementsAre(3, 2));
  EXPECT_EQ(core.Explain(2)->position, 2);
  EXPECT_EQ(core.Explain(3)->position, 1);
}

// Jobs parked by their array's %N are not tried, and have no position.
TEST(PlacementQueueOrder, ParkedArrayJobsAreLeftOut) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  for (JobId id = 1; id <= 3; ++id) {
    QueuedJob job = UserJob(id, "alice", 1);
    job.array_id = 100;
    job.array_limit = 1;
    core.Enqueue(job);
  }
  core.Enqueue(UserJob(4, "bob", 4));
  EXPECT_THAT(JobsOf(core.Schedule(0)), ElementsAre(1));
  EXPECT_THAT(core.QueueOrder("p"), ElementsAre(4));
  EXPECT_EQ(core.Explain(4)->position, 1);
  auto parked = core.Explain(2);
  ASSERT_TRUE(parked.has_value());
  EXPECT_TRUE(parked->array_limited);
  EXPECT_EQ(parked->position, 0);
}

// ExplainMany (and QueuePositions) answer as Explain does, job by job, in
// one walk of each profile's queue: over users with usage, priorities,
// pools that never fit, arrays parked by their %N, running jobs, a
// draining worker and two profiles.
TEST(PlacementQueueOrder, ExplainManyAgreesWithExplain) {
  for (int seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    PlacementCore core;
    core.SetFairShareHalfLife(0);
    core.WorkerOnline(1, "p", 4);
    core.WorkerOnline(2, "p", 2);
    core.WorkerOnline(3, "q", 3);
    if (seed % 3 == 0) core.SetDraining(2, true);
    const char* users[] = {"alice", "bob", "carol"};
    core.ChargeUsage("alice", 600e3, 0);
    core.ChargeUsage("carol", 60e3, 0);
    std::vector<JobId> ids;
    for (JobId id = 1; id <= 40; ++id) {
      QueuedJob job = UserJob(id, users[rng() % 3], 1 + rng() % 6,
                              static_cast<int>(rng() % 3));
      if (rng() % 2) job.profile = "q";
      if (rng() % 5 == 0) {
        job.array_id = 1000;
        job.array_limit = 2;
      }
      core.Enqueue(job);
      ids.push_back(id);
    }
    core.Schedule(1000);
    ids.push_back(999);  // never submitted
    const std::vector<std::optional<WaitInfo>> many = core.ExplainMany(ids);
    const std::vector<int> places = core.QueuePositions(ids);
    ASSERT_EQ(many.size(), ids.size());
    ASSERT_EQ(places.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::optional<WaitInfo> one = core.Explain(ids[i]);
      EXPECT_EQ(places[i], one ? one->position : 0) << "job " << ids[i];
      ASSERT_EQ(one.has_value(), many[i].has_value()) << "job " << ids[i];
      if (!one) continue;
      const WaitInfo& a = *one;
      const WaitInfo& b = *many[i];
      SCOPED_TRACE(testing::Message() << "seed " << seed << " job " << ids[i]);
      EXPECT_EQ(a.jobs_ahead, b.jobs_ahead);
      EXPECT_EQ(a.position, b.position);
      EXPECT_EQ(a.first_ahead, b.first_ahead);
      EXPECT_EQ(a.first_ahead_priority, b.first_ahead_priority);
      EXPECT_EQ(a.reserved, b.reserved);
      EXPECT_EQ(a.reserved_start, b.reserved_start);
      EXPECT_EQ(a.over_limit, b.over_limit);
      EXPECT_EQ(a.array_limited, b.array_limited);
      EXPECT_EQ(a.fits_online, b.fits_online);
      EXPECT_EQ(a.free_now, b.free_now);
      EXPECT_EQ(a.draining, b.draining);
    }
  }
}

// --- Whose jobs a worker runs ---------------------------------------------

WorkerUsers Only(const std::string& user) {
  WorkerUsers u;
  u.anyone = false;
  u.closed = true;
  u.can = {user};
  return u;
}

WorkerUsers Asked(std::set<std::string> can, std::set<std::string> cannot) {
  WorkerUsers u;
  u.anyone = false;
  u.can = std::move(can);
  u.cannot = std::move(cannot);
  return u;
}

TEST(PlacementUsers, JobsGoOnlyToWorkersThatRunTheirUser) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.SetWorkerUsers(1, Only("nobody"));
  core.WorkerOnline(2, "p", 4);
  core.SetWorkerUsers(2, Asked({"alice"}, {"carol"}));
  // Best fit alone would put the 1-slot job on either; the users decide.
  Decision alice = StartNow(core, UserJob(1, "alice", 1));
  EXPECT_THAT(alice.parts, ElementsAre(Part{2, {0}}));
  Decision nobody = StartNow(core, UserJob(2, "nobody", 3));
  EXPECT_THAT(nobody.parts, ElementsAre(Part{1, {0, 1, 2}}));
  core.Enqueue(UserJob(3, "carol", 1));
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  std::optional<WaitInfo> info = core.Explain(3);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->able_workers, 0);
  EXPECT_EQ(info->unable_workers, 2);
  EXPECT_EQ(info->undecided_workers, 0);
  EXPECT_FALSE(info->reserved);  // it can never start here: no head
  EXPECT_THAT(core.UserFits("p", "carol"),
              ElementsAre(std::pair{WorkerId{1}, UserFit::kNo},
                          std::pair{WorkerId{2}, UserFit::kNo}));
  EXPECT_THAT(core.UserFits("p", "alice"),
              ElementsAre(std::pair{WorkerId{1}, UserFit::kNo},
                          std::pair{WorkerId{2}, UserFit::kYes}));
  // A job of nobody's that does not fit on its one worker waits there, and
  // says that the other worker does not count for it.
  core.Enqueue(UserJob(4, "nobody", 2));
  EXPECT_THAT(core.Schedule(2), IsEmpty());
  info = core.Explain(4);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->able_workers, 1);
  EXPECT_EQ(info->able_free, 1);
  EXPECT_EQ(info->unable_workers, 1);
  EXPECT_EQ(info->free_now, 4);  // all workers: 1 + 3
  EXPECT_TRUE(info->reserved);
  ASSERT_TRUE(core.Finished(2, 3));
  EXPECT_THAT(JobsOf(core.Schedule(3)), ElementsAre(4));
}

TEST(PlacementUsers, AnUndecidedUserStartsOnceTheWorkerAnswers) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.SetWorkerUsers(1, Asked({}, {}));
  core.Enqueue(UserJob(1, "alice", 1));
  EXPECT_THAT(core.Schedule(0), IsEmpty());
  std::optional<WaitInfo> info = core.Explain(1);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->undecided_workers, 1);
  EXPECT_THAT(core.UserFits("p", "alice"),
              ElementsAre(std::pair{WorkerId{1}, UserFit::kUndecided}));
  core.SetWorkerUser(1, "alice", true);
  EXPECT_THAT(JobsOf(core.Schedule(1)), ElementsAre(1));
  // An answer of no keeps another user's job off it.
  core.SetWorkerUser(1, "bob", false);
  core.Enqueue(UserJob(2, "bob", 1));
  EXPECT_THAT(core.Schedule(2), IsEmpty());
  EXPECT_THAT(core.UserFits("p", "bob"),
              ElementsAre(std::pair{WorkerId{1}, UserFit::kNo}));
  // Forgotten (to be asked again): undecided, still not placed there.
  core.ForgetWorkerUser(1, "bob");
  EXPECT_THAT(core.UserFits("p", "bob"),
              ElementsAre(std::pair{WorkerId{1}, UserFit::kUndecided}));
  EXPECT_THAT(core.Schedule(2), IsEmpty());
  core.SetWorkerUser(1, "bob", false);
  // Users stay across going offline and back online.
  core.WorkerOffline(1);
  core.WorkerOnline(1, "p", 2);
  EXPECT_THAT(core.Schedule(3), IsEmpty());
  // A worker that says nothing runs anyone's.
  core.SetWorkerUsers(1, WorkerUsers{});
  EXPECT_THAT(JobsOf(core.Schedule(4)), ElementsAre(2));
}

TEST(PlacementUsers, BackfillKeepsTheHeadsReservationOnItsOwnWorkers) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.SetWorkerUsers(1, Only("nobody"));
  core.WorkerOnline(2, "p", 4);
  core.SetWorkerUsers(2, Asked({"root"}, {"nobody"}));
  StartNow(core, UserJob(1, "root", 2, 0, /*limit=*/100), 0);  // on worker 2
  // The head: all of worker 2, the only one that runs root's jobs; it
  // frees at 100.
  core.Enqueue(UserJob(2, "root", 4));
  // Root's 2-slot job without a limit would delay it: it may not take
  // worker 2's two free slots, nor worker 1's (which does not run root's).
  core.Enqueue(UserJob(3, "root", 2));
  // Nobody's job takes half of worker 1, which the head cannot use.
  core.Enqueue(UserJob(4, "nobody", 2));
  // Root's job that ends by 100 may use worker 2's free slots.
  core.Enqueue(UserJob(5, "root", 2, 0, /*limit=*/50));
  EXPECT_THAT(JobsOf(core.Schedule(1)), UnorderedElementsAre(4, 5));
  std::optional<WaitInfo> head = core.Explain(2);
  ASSERT_TRUE(head.has_value());
  EXPECT_TRUE(head->reserved);
  EXPECT_EQ(head->reserved_start, 100);
  ASSERT_TRUE(core.Finished(1, 40));
  ASSERT_TRUE(core.Finished(5, 40));
  EXPECT_THAT(JobsOf(core.Schedule(40)), ElementsAre(2));
}

}  // namespace
}  // namespace dlbatch::scheduler
