// The preemption policy of the scheduling core, rule by rule, on a real
// PlacementCore with a fake clock (times are arguments): who may be taken,
// which of them is, and the text the waiting job shows.
#include "scheduler/core/preemption.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "scheduler/core/placement.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr TimeMs kMinute = 60 * 1000;

QueuedJob Job(JobId id, int pool, int priority = 0,
              const std::string& user = "", int max_nodes = 1) {
  QueuedJob job;
  job.id = id;
  job.profile = "p";
  job.pool = pool;
  job.priority = priority;
  job.seq = id;
  job.user = user;
  job.max_nodes = max_nodes;
  return job;
}

PreemptionPolicy Policy(PreemptionMode mode) {
  PreemptionPolicy p;
  p.mode = mode;
  return p;
}

// A core and the facts it does not keep, with helpers to start jobs at a
// given time.
class PreemptionTest : public ::testing::Test {
 protected:
  // Enqueues `job` and starts it at `at`. REQUIRES: it fits now.
  void Run(const QueuedJob& job, TimeMs at) {
    core_.Enqueue(job);
    std::vector<Decision> d = core_.Schedule(at);
    ASSERT_EQ(d.size(), 1u) << "job " << job.id << " did not start";
    ASSERT_EQ(d[0].job, job.id);
    parts_[job.id] = d[0].parts;
  }

  PreemptionChoice Choose(JobId waiting, PreemptionMode mode, TimeMs now,
                          const std::vector<Displacement>& displaced = {}) {
    return ChooseVictims(
        core_, waiting, displaced, Policy(mode), now, [this](JobId id) {
          auto it = facts_.find(id);
          return it == facts_.end() ? RunningFacts{} : it->second;
        });
  }

  PlacementCore core_;
  std::map<JobId, RunningFacts> facts_;
  std::map<JobId, std::vector<Part>> parts_;
};

TEST_F(PreemptionTest, TakesOnlyJobsOfLowerPriority) {
  core_.WorkerOnline(1, "p", 2);
  Run(Job(1, 1, /*priority=*/5), 0);
  Run(Job(2, 1, /*priority=*/0), 0);
  core_.Enqueue(Job(3, 1, /*priority=*/5));
  PreemptionChoice c = Choose(3, PreemptionMode::kPriority, 20 * kMinute);
  EXPECT_THAT(c.ids(), ElementsAre(2));
  EXPECT_EQ(c.victims[0].kind, PreemptionKind::kPriority);
  EXPECT_EQ(c.lost_ms, 20 * kMinute);  // no checkpoint: all since its start
  EXPECT_TRUE(c.exact);
  // A job of priority 0 takes from no one: the others are equal or higher.
  core_.Enqueue(Job(4, 1, /*priority=*/0));
  c = Choose(4, PreemptionMode::kPriority, 20 * kMinute);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kNoVictims);
  EXPECT_THAT(c.reason, HasSubstr("2 jobs of equal or higher priority"));
}

TEST_F(PreemptionTest, TakesTheJobWithTheMoreRecentCheckpoint) {
  core_.WorkerOnline(1, "p", 2);
  Run(Job(1, 1), 0);
  Run(Job(2, 1), 0);
  facts_[1].checkpoint = 15 * kMinute;  // would lose 15 minutes
  facts_[2].checkpoint = 25 * kMinute;  // would lose 5
  core_.Enqueue(Job(3, 1, /*priority=*/10));
  PreemptionChoice c = Choose(3, PreemptionMode::kPriority, 30 * kMinute);
  EXPECT_THAT(c.ids(), ElementsAre(2));
  EXPECT_EQ(c.lost_ms, 5 * kMinute);
  // The other way round, the other is taken.
  facts_[1].checkpoint = 29 * kMinute;
  EXPECT_THAT(Choose(3, PreemptionMode::kPriority, 30 * kMinute).ids(),
              ElementsAre(1));
}

TEST_F(PreemptionTest, EqualWorkLostTakesLowerPriorityThenLatestStart) {
  core_.WorkerOnline(1, "p", 3);
  Run(Job(1, 1, /*priority=*/2), 0);
  Run(Job(2, 1, /*priority=*/1), 0);
  Run(Job(3, 1, /*priority=*/1), kMinute);
  for (JobId id : {1, 2, 3}) facts_[id].checkpoint = 19 * kMinute;
  core_.Enqueue(Job(4, 1, /*priority=*/5));
  // All lose 1 minute; 2 and 3 have the lower priority; 3 started last.
  EXPECT_THAT(Choose(4, PreemptionMode::kPriority, 20 * kMinute).ids(),
              ElementsAre(3));
}

TEST_F(PreemptionTest, TakesTheFewestJobsBeforeTheLeastWork) {
  core_.WorkerOnline(1, "p", 4);
  core_.WorkerOnline(2, "p", 4);
  Run(Job(1, 4), 0);  // worker 1, loses 30 minutes
  for (JobId id = 2; id <= 5; ++id) {
    Run(Job(id, 1), 0);  // worker 2, each loses 1 minute
    facts_[id].checkpoint = 29 * kMinute;
  }
  core_.Enqueue(Job(6, 4, /*priority=*/1));
  PreemptionChoice c = Choose(6, PreemptionMode::kPriority, 30 * kMinute);
  EXPECT_THAT(c.ids(), ElementsAre(1));
  EXPECT_EQ(c.lost_ms, 30 * kMinute);
  EXPECT_TRUE(core_.FitsWithReleased(6, c.ids()));
  // Two slots: still the one large job, not two small ones.
  core_.Enqueue(Job(7, 2, /*priority=*/1));
  c = Choose(7, PreemptionMode::kPriority, 30 * kMinute);
  EXPECT_EQ(c.victims.size(), 1u) << "one 4-slot job frees 2 with 1 victim";
  EXPECT_THAT(c.ids(), ElementsAre(1));
}

TEST_F(PreemptionTest, NeverTouchesJobsInsideMinRunOrNotPreemptible) {
  core_.WorkerOnline(1, "p", 1);
  core_.WorkerOnline(2, "p", 1);
  core_.WorkerOnline(3, "p", 1);
  Run(Job(1, 1), 0);
  Run(Job(2, 1), 0);
  Run(Job(3, 1), 25 * kMinute);  // inside min_run at 30 minutes
  facts_[2].preemptible = false;
  core_.Enqueue(Job(4, 1, /*priority=*/9));
  EXPECT_THAT(Choose(4, PreemptionMode::kPriority, 30 * kMinute).ids(),
              ElementsAre(1));
  ASSERT_TRUE(core_.Finished(1, 30 * kMinute));
  core_.Enqueue(Job(5, 1, /*priority=*/9));
  ASSERT_EQ(core_.Schedule(30 * kMinute).size(), 1u);  // 4 or 5 starts
  const JobId waiting = core_.IsQueued(4) ? 4 : 5;
  PreemptionChoice c = Choose(waiting, PreemptionMode::kPriority, 31 * kMinute);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kNoVictims);
  EXPECT_THAT(c.reason, HasSubstr("1 job not preemptible"));
  EXPECT_THAT(c.reason, HasSubstr("inside min_run (10m)"));
  // Past job 3's min_run it may be taken; job 2 never.
  EXPECT_THAT(Choose(waiting, PreemptionMode::kPriority, 35 * kMinute).ids(),
              ElementsAre(3));
}

TEST_F(PreemptionTest, ModeOffChangesNothing) {
  core_.WorkerOnline(1, "p", 1);
  Run(Job(1, 1), 0);
  core_.Enqueue(Job(2, 1, /*priority=*/10));
  PreemptionChoice c = Choose(2, PreemptionMode::kOff, 60 * kMinute);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kOff);
  EXPECT_TRUE(core_.IsRunning(1));
  EXPECT_TRUE(core_.IsQueued(2));
  EXPECT_THAT(core_.Schedule(60 * kMinute), IsEmpty());
}

TEST_F(PreemptionTest, FairShareReclaimsBetweenTwoUsersAtEqualPriority) {
  core_.WorkerOnline(1, "p", 2);
  core_.ChargeUsage("alice", 100.0 * kMinute, 0);  // alice used far more
  Run(Job(1, 1, 0, "alice"), 0);
  Run(Job(2, 1, 0, "alice"), 0);
  facts_[2].checkpoint = 25 * kMinute;
  core_.Enqueue(Job(3, 1, 0, "bob"));
  // Priority mode: equal priority, nothing to take.
  EXPECT_EQ(Choose(3, PreemptionMode::kPriority, 30 * kMinute).why,
            NoPreemption::kNoVictims);
  // Fair share: bob is below his share, alice above hers.
  PreemptionChoice c = Choose(3, PreemptionMode::kFairShare, 30 * kMinute);
  ASSERT_THAT(c.ids(), ElementsAre(2));
  EXPECT_EQ(c.victims[0].kind, PreemptionKind::kReclaim);
  // Alice, above her share, reclaims nothing from bob.
  ASSERT_TRUE(core_.Finished(2, 30 * kMinute));
  ASSERT_EQ(core_.Schedule(30 * kMinute).size(), 1u);  // bob's job 3
  core_.Enqueue(Job(4, 1, 0, "alice"));
  EXPECT_EQ(Choose(4, PreemptionMode::kFairShare, 45 * kMinute).why,
            NoPreemption::kNoVictims);
}

TEST_F(PreemptionTest, AReclaimedJobNeverReclaimsNorTakesItsDisplacer) {
  core_.WorkerOnline(1, "p", 1);
  core_.ChargeUsage("alice", 100.0 * kMinute, 0);
  Run(Job(1, 1, 0, "alice"), 0);
  core_.Enqueue(Job(2, 1, 0, "bob"));
  ASSERT_THAT(Choose(2, PreemptionMode::kFairShare, 20 * kMinute).ids(),
              ElementsAre(1));
  // Bob's job was reclaimed from once (by job 9): it reclaims no more.
  EXPECT_EQ(Choose(2, PreemptionMode::kFairShare, 20 * kMinute,
                   {{9, PreemptionKind::kReclaim}})
                .why,
            NoPreemption::kNoVictims);
  // Nor does it take the job that preempted it, at equal priority.
  PreemptionChoice c = Choose(2, PreemptionMode::kFairShare, 20 * kMinute,
                              {{1, PreemptionKind::kPriority}});
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_THAT(c.reason, HasSubstr("1 job that preempted it before"));
}

TEST_F(PreemptionTest, TakesAGangSpanningTwoWorkersWhole) {
  core_.WorkerOnline(1, "p", 2);
  core_.WorkerOnline(2, "p", 2);
  Run(Job(1, 4, 0, "", /*max_nodes=*/2), 0);
  ASSERT_EQ(parts_[1].size(), 2u);
  // A 2-slot job takes the gang: the one victim, on both workers.
  core_.Enqueue(Job(2, 2, /*priority=*/5));
  PreemptionChoice c = Choose(2, PreemptionMode::kPriority, 20 * kMinute);
  EXPECT_THAT(c.ids(), ElementsAre(1));
  // A job spanning both workers takes two single-worker jobs together.
  ASSERT_TRUE(core_.Finished(1, 20 * kMinute));
  core_.Dequeue(2);
  Run(Job(3, 2), 20 * kMinute);
  Run(Job(4, 2), 20 * kMinute);
  core_.Enqueue(Job(5, 4, /*priority=*/5, "", /*max_nodes=*/2));
  c = Choose(5, PreemptionMode::kPriority, 40 * kMinute);
  EXPECT_THAT(c.ids(), ElementsAre(3, 4));
  EXPECT_TRUE(core_.FitsWithReleased(5, {3, 4}));
  EXPECT_FALSE(core_.FitsWithReleased(5, {3}));
}

TEST_F(PreemptionTest, NoPreemptionWhenItsUsersLimitHoldsItAnyway) {
  core_.WorkerOnline(1, "p", 2);
  UserLimit limit;
  limit.max_slots = 1;
  core_.SetLimit("bob", "p", limit);
  Run(Job(1, 1, 0, "bob"), 0);
  Run(Job(2, 1, 0, "alice"), 0);
  core_.Enqueue(Job(3, 1, /*priority=*/10, "bob"));
  PreemptionChoice c = Choose(3, PreemptionMode::kPriority, 20 * kMinute);
  EXPECT_THAT(c.ids(), IsEmpty());
  EXPECT_EQ(c.why, NoPreemption::kOverLimit);
  EXPECT_THAT(c.reason, HasSubstr("1 of 1 slots"));
  // And the core agrees: freeing alice's slot would not start it.
  EXPECT_FALSE(core_.FitsWithReleased(3, {2}));
}

TEST_F(PreemptionTest, NothingForAJobThatFitsNowOrNever) {
  core_.WorkerOnline(1, "p", 2);
  core_.WorkerOnline(2, "p", 2);
  Run(Job(1, 2), 0);
  core_.Enqueue(Job(2, 2, /*priority=*/5));  // worker 2 is free
  EXPECT_EQ(Choose(2, PreemptionMode::kPriority, 20 * kMinute).why,
            NoPreemption::kFitsNow);
  core_.Enqueue(Job(3, 4, /*priority=*/5));  // spans no workers: never fits
  EXPECT_EQ(Choose(3, PreemptionMode::kPriority, 20 * kMinute).why,
            NoPreemption::kNeverFits);
  // Workers that do not run its user's jobs do not count for it.
  core_.Dequeue(2);
  core_.Dequeue(3);
  Run(Job(4, 2), 0);
  WorkerUsers only_alice;
  only_alice.anyone = false;
  only_alice.closed = true;
  only_alice.can = {"alice"};
  core_.SetWorkerUsers(1, only_alice);
  core_.Enqueue(Job(5, 2, /*priority=*/5, "bob"));
  PreemptionChoice c = Choose(5, PreemptionMode::kPriority, 20 * kMinute);
  ASSERT_THAT(c.ids(), ElementsAre(4));  // job 4 holds worker 2
  EXPECT_EQ(c.victims.size(), 1u);
}

// --- The job that preempts (PlacementCore::FirstBlocked) -----------------

TEST(PreemptionFirstBlocked, AJobThatFitsIsNotIt) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);  // no pass yet
  core.Enqueue(Job(1, 2));
  EXPECT_EQ(core.Schedule(0).size(), 1u);
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);  // free slots, none waits
  core.Enqueue(Job(3, 3));                          // 2 free: waits, reserved
  core.Enqueue(Job(4, 1, /*priority=*/10));         // first in order, and fits
  std::vector<Decision> d = core.Schedule(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 4);
  EXPECT_EQ(core.FirstBlocked("p"), 3);
  std::optional<WaitInfo> info = core.Explain(3);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->reserved);
  EXPECT_EQ(core.FirstBlocked("unknown"), std::nullopt);
}

TEST(PreemptionFirstBlocked, OnAFullProfileTheHighestPriorityWaitingJob) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 2);
  core.WorkerOnline(2, "q", 1);
  core.Enqueue(Job(1, 1));
  core.Enqueue(Job(2, 1));
  EXPECT_EQ(core.Schedule(0).size(), 2u);
  // The pass gave the last free slot: no pass reached a waiting job.
  core.Enqueue(Job(3, 1, /*priority=*/0));
  core.Enqueue(Job(4, 2, /*priority=*/10));
  core.Enqueue(Job(5, 1, /*priority=*/10));
  core.Enqueue(Job(6, 3, /*priority=*/20));  // never fits 2 slots: skipped
  EXPECT_THAT(core.Schedule(1), IsEmpty());  // full: no pass at all
  EXPECT_EQ(core.FirstBlocked("p"), 4);      // priority, then submit order
  EXPECT_EQ(core.FirstBlocked("q"), std::nullopt);
  // It is the job ChooseVictims takes slots for.
  PreemptionChoice c =
      ChooseVictims(core, *core.FirstBlocked("p"), {},
                    Policy(PreemptionMode::kPriority), 20 * kMinute, nullptr);
  EXPECT_THAT(c.ids(), ElementsAre(1, 2));
  // With a slot free, the pass records it: 4 needs 2, and 5 may not take
  // the slot 4's reservation holds.
  ASSERT_TRUE(core.Finished(1, 2));
  EXPECT_THAT(core.Schedule(2), IsEmpty());
  EXPECT_EQ(core.FirstBlocked("p"), 4);
}

TEST(PreemptionFirstBlocked, AJobItsUsersLimitHoldsIsSkipped) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  UserLimit limit;
  limit.max_slots = 3;
  core.SetLimit("alice", "p", limit);
  core.Enqueue(Job(1, 2, 0, "alice"));
  core.Enqueue(Job(2, 2, 0, "bob"));
  EXPECT_EQ(core.Schedule(0).size(), 2u);
  core.Enqueue(Job(3, 2, /*priority=*/10, "alice"));  // 2 + 2 > her 3
  core.Enqueue(Job(4, 2, /*priority=*/5, "bob"));
  core.Enqueue(Job(5, 1, /*priority=*/0, "alice"));  // within her room
  EXPECT_THAT(core.Schedule(1), IsEmpty());
  EXPECT_EQ(core.FirstBlocked("p"), 4);
  // A pass skips it too.
  core.Enqueue(Job(6, 3, /*priority=*/1, "carol"));
  ASSERT_TRUE(core.Finished(2, 2));  // 2 free: 4 starts, 6 needs 3
  std::vector<Decision> d = core.Schedule(2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 4);
  EXPECT_EQ(core.FirstBlocked("p"), 6);
  ASSERT_TRUE(core.Dequeue(6));
  EXPECT_THAT(core.Schedule(3), IsEmpty());
  EXPECT_EQ(core.FirstBlocked("p"), 5);
  // Only the job her limit holds waits: nothing preempts for it.
  ASSERT_TRUE(core.Dequeue(5));
  EXPECT_THAT(core.Schedule(4), IsEmpty());
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);
}

TEST(PreemptionFirstBlocked, ClearedWhenItStartsOrLeaves) {
  PlacementCore core;
  core.WorkerOnline(1, "p", 4);
  core.Enqueue(Job(1, 3));
  EXPECT_EQ(core.Schedule(0).size(), 1u);
  core.Enqueue(Job(2, 2, /*priority=*/5));
  core.Enqueue(Job(3, 2));
  EXPECT_THAT(core.Schedule(1), IsEmpty());  // 1 free
  EXPECT_EQ(core.FirstBlocked("p"), 2);
  // It leaves: not it any more, until the next pass says who is.
  ASSERT_TRUE(core.Dequeue(2));
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);
  EXPECT_THAT(core.Schedule(2), IsEmpty());
  EXPECT_EQ(core.FirstBlocked("p"), 3);
  // It starts (here placed from outside, as after a restart): cleared.
  core.MarkRunning(Job(3, 2), {Part{1, {3}}}, 3);
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);
  // It starts in a pass: the next one waiting is it, or none.
  core.Enqueue(Job(4, 2));
  EXPECT_THAT(core.Schedule(4), IsEmpty());  // full
  EXPECT_EQ(core.FirstBlocked("p"), 4);
  ASSERT_TRUE(core.Finished(1, 5));  // 3 free
  std::vector<Decision> d = core.Schedule(5);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 4);
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);
  // The pass gives the last free slot to 5; 6 is found at the call, and
  // is no more once it leaves.
  core.Enqueue(Job(5, 1));
  core.Enqueue(Job(6, 1));
  d = core.Schedule(6);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, 5);
  EXPECT_EQ(core.FirstBlocked("p"), 6);
  ASSERT_TRUE(core.Dequeue(6));
  EXPECT_EQ(core.FirstBlocked("p"), std::nullopt);
}

TEST(PreemptionText, SaysWhomItPreemptsAndHowLongAtMost) {
  EXPECT_EQ(PreemptingText({3}, 2 * kMinute),
            "preempting job 3 (checkpointing; at most 2m)");
  EXPECT_EQ(PreemptingText({4, 3}, 2 * kMinute),
            "preempting jobs 3 and 4 (checkpointing; at most 2m)");
  EXPECT_EQ(PreemptingText({1, 2, 3}, 90 * 1000),
            "preempting jobs 1, 2 and 3 (checkpointing; at most 1m30s)");
  EXPECT_EQ(PreemptingText({1, 2, 3, 4, 5, 6, 7}, 3600 * 1000),
            "preempting jobs 1, 2, 3, 4 and 3 more (checkpointing; at most "
            "1h)");
  EXPECT_EQ(DurationText(500), "500ms");
  EXPECT_EQ(DurationText(1500), "2s");  // "at most": rounded up
  EXPECT_EQ(DurationText(3 * 3600 * 1000 + 60 * 1000), "3h1m");
  EXPECT_EQ(DurationText(0), "0ms");
}

TEST(PreemptionLostWork, SinceTheLastCheckpointOrTheStart) {
  PreemptionCandidate c;
  c.started = 1000;
  EXPECT_EQ(LostWorkMs(c, 5000), 4000);
  c.checkpoint = 4000;
  EXPECT_EQ(LostWorkMs(c, 5000), 1000);
  c.checkpoint = 500;  // from a previous attempt: resumed from at start
  EXPECT_EQ(LostWorkMs(c, 5000), 4000);
}

// --- Property test ---------------------------------------------------------
//
// Thousands of random events (submits of random priority, user, size and
// span; ends; checkpoints; time passing; preemptions chosen and applied)
// on a small cluster, checking after each choice the rules against an
// independent reading of them, the count and work lost against brute force
// over every subset of the jobs that may be taken, and over the whole run
// that no preemption cycle forms.

struct JobFacts {
  QueuedJob job;
  bool preemptible = true;
  std::optional<TimeMs> checkpoint;
  std::vector<Displacement> displaced;
};

class RandomRun {
 public:
  RandomRun(unsigned seed, PreemptionMode mode) : rng_(seed) {
    policy_.mode = mode;
    for (WorkerId w = 1; w <= 3; ++w) core_.WorkerOnline(w, "p", Uniform(2, 4));
    UserLimit limit;
    limit.max_slots = 3;
    core_.SetLimit("u2", "p", limit);
  }

  void Step() {
    const int r = Uniform(0, 99);
    if (r < 30) {
      Submit();
    } else if (r < 42) {
      EndOne();
    } else if (r < 52) {
      if (JobId id = AnyRunning()) facts_[id].checkpoint = now_;
    } else if (r < 72) {
      now_ += Uniform(0, 4 * 60) * 1000;
    } else {
      Preempt();
    }
  }

  int preemptions() const { return static_cast<int>(edges_.size()); }
  int reclaims() const { return reclaims_; }
  int brute_checked() const { return brute_checked_; }

 private:
  int Uniform(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

  void Schedule() {
    for (const Decision& d : core_.Schedule(now_)) start_[d.job] = now_;
  }

  void Submit() {
    JobFacts f;
    f.job = Job(next_++, Uniform(1, 4), Uniform(0, 3),
                "u" + std::to_string(Uniform(0, 2)), Uniform(1, 2));
    f.preemptible = Uniform(0, 4) != 0;
    if (!core_.CheckSatisfiable(f.job).ok() ||
        !core_.CheckAdmission(f.job).ok()) {
      return;
    }
    core_.Enqueue(f.job);
    facts_[f.job.id] = f;
    Schedule();
  }

  JobId AnyRunning() {
    if (start_.empty()) return 0;
    auto it = start_.begin();
    std::advance(it, Uniform(0, static_cast<int>(start_.size()) - 1));
    return it->first;
  }

  void EndOne() {
    const JobId id = AnyRunning();
    if (id == 0) return;
    ASSERT_TRUE(core_.Finished(id, now_));
    start_.erase(id);
    Schedule();
  }

  // The test's own reading of who may be taken for `waiting`, and how.
  std::map<JobId, PreemptionKind> Eligible(const JobFacts& waiting,
                                           const PlacementSnapshot& snap) {
    std::map<JobId, PreemptionKind> out;
    if (policy_.mode == PreemptionMode::kOff) return out;
    std::map<std::string, double> share;
    for (const UserUsage& u : snap.active_usage) share[u.user] = u.share;
    const double fair = 1.0 / static_cast<double>(snap.active_usage.size());
    bool reclaimed = false;
    std::set<JobId> displacers;
    for (const Displacement& d : waiting.displaced) {
      reclaimed = reclaimed || d.kind == PreemptionKind::kReclaim;
      displacers.insert(d.by);
    }
    for (const auto& [id, start] : start_) {
      const JobFacts& f = facts_.at(id);
      if (!f.preemptible || now_ - start < policy_.min_run_ms) continue;
      if (displacers.count(id) && f.job.priority >= waiting.job.priority) {
        continue;
      }
      if (f.job.priority < waiting.job.priority) {
        out[id] = PreemptionKind::kPriority;
      } else if (policy_.mode == PreemptionMode::kFairShare && !reclaimed &&
                 f.job.priority == waiting.job.priority &&
                 share[waiting.job.user] < fair - 1e-9 &&
                 share[f.job.user] > fair + 1e-9) {
        out[id] = PreemptionKind::kReclaim;
      }
    }
    return out;
  }

  TimeMs Lost(JobId id) const {
    TimeMs since = start_.at(id);
    const auto& ck = facts_.at(id).checkpoint;
    if (ck && *ck > since) since = *ck;
    return now_ - since;
  }

  void Check(const JobFacts& waiting, const PreemptionChoice& c) {
    const JobId j = waiting.job.id;
    std::optional<PlacementSnapshot> snap = core_.PreemptionSnapshot(j, now_);
    ASSERT_TRUE(snap.has_value());
    const std::map<JobId, PreemptionKind> eligible = Eligible(waiting, *snap);
    if (policy_.mode == PreemptionMode::kOff) {
      EXPECT_EQ(c.why, NoPreemption::kOff);
    }
    for (const Victim& v : c.victims) {
      ASSERT_EQ(start_.count(v.id), 1u) << "victim " << v.id << " not running";
      const JobFacts& f = facts_.at(v.id);
      EXPECT_GE(now_ - start_.at(v.id), policy_.min_run_ms) << v.id;
      EXPECT_TRUE(f.preemptible) << v.id;
      if (policy_.mode == PreemptionMode::kPriority) {
        EXPECT_LT(f.job.priority, waiting.job.priority) << v.id;
      }
      ASSERT_EQ(eligible.count(v.id), 1u) << "victim " << v.id;
      EXPECT_EQ(eligible.at(v.id), v.kind) << v.id;
      EXPECT_EQ(v.lost_ms, Lost(v.id));
    }
    if (!c.victims.empty()) {
      EXPECT_TRUE(core_.FitsWithReleased(j, c.ids()));
      EXPECT_FALSE(core_.FitsWithReleased(j, {}));
      EXPECT_TRUE(snap->within_limit);
    }
    switch (c.why) {
      case NoPreemption::kFitsNow:
        EXPECT_TRUE(core_.FitsWithReleased(j, {}));
        break;
      case NoPreemption::kOverLimit:
        EXPECT_FALSE(snap->within_limit);
        break;
      case NoPreemption::kNeverFits: {
        std::vector<JobId> all;
        for (const auto& [id, start] : start_) {
          if (facts_.at(id).job.priority <= waiting.job.priority) {
            all.push_back(id);
          }
        }
        EXPECT_FALSE(core_.FitsWithReleased(j, all));
        break;
      }
      case NoPreemption::kCoreRefused:
        ADD_FAILURE() << "the chooser's model and the core disagree";
        break;
      default:
        break;
    }
    if ((c.why != NoPreemption::kNone && c.why != NoPreemption::kNoVictims) ||
        eligible.size() > 10) {
      return;
    }
    // Brute force: the fewest eligible jobs that let it start, and the
    // least work lost among sets of that size.
    const std::vector<std::pair<JobId, PreemptionKind>> e(eligible.begin(),
                                                          eligible.end());
    int fewest = -1;
    TimeMs least = 0;
    for (uint32_t mask = 0; mask < (1u << e.size()); ++mask) {
      std::vector<JobId> set;
      TimeMs lost = 0;
      for (size_t i = 0; i < e.size(); ++i) {
        if (mask & (1u << i)) {
          set.push_back(e[i].first);
          lost += Lost(e[i].first);
        }
      }
      const int n = static_cast<int>(set.size());
      if (fewest >= 0 && n > fewest) continue;
      if (!core_.FitsWithReleased(j, set)) continue;
      if (fewest < 0 || n < fewest || lost < least) {
        fewest = n;
        least = lost;
      }
    }
    ++brute_checked_;
    if (c.why == NoPreemption::kNoVictims) {
      EXPECT_EQ(fewest, -1) << "a set of " << fewest << " would do for " << j;
      return;
    }
    EXPECT_TRUE(c.exact);
    EXPECT_EQ(static_cast<int>(c.victims.size()), fewest) << "job " << j;
    EXPECT_EQ(c.lost_ms, least) << "job " << j;
  }

  void Preempt() {
    Schedule();
    std::vector<JobId> queued;
    for (const auto& [id, f] : facts_) {
      if (core_.IsQueued(id)) queued.push_back(id);
    }
    if (queued.empty()) return;
    const JobFacts waiting =
        facts_.at(queued[Uniform(0, static_cast<int>(queued.size()) - 1)]);
    const PreemptionChoice c =
        ChooseVictims(core_, waiting.job.id, waiting.displaced, policy_, now_,
                      [this](JobId id) {
                        return RunningFacts{facts_.at(id).preemptible,
                                            facts_.at(id).checkpoint};
                      });
    Check(waiting, c);
    if (c.victims.empty()) return;
    for (const Victim& v : c.victims) {
      ASSERT_TRUE(core_.Finished(v.id, now_));
      start_.erase(v.id);
      facts_[v.id].displaced.push_back({waiting.job.id, v.kind});
      core_.Enqueue(facts_[v.id].job);  // requeued, its place kept
      edges_.emplace_back(waiting.job.id, v.id);
      reclaims_ += v.kind == PreemptionKind::kReclaim;
    }
    EXPECT_TRUE(core_.FitsWithReleased(waiting.job.id, {}))
        << "job " << waiting.job.id << " does not fit once its victims ended";
    ExpectNoCycle();
    Schedule();
  }

  // Preemptions form no cycle (A preempts B ... preempts A) over the run.
  void ExpectNoCycle() {
    std::map<JobId, std::set<JobId>> out;
    for (const auto& [a, b] : edges_) out[a].insert(b);
    std::map<JobId, int> state;  // 1: on the path, 2: done
    bool cycle = false;
    auto visit = [&](auto&& self, JobId v) -> void {
      state[v] = 1;
      for (JobId w : out[v]) {
        if (state[w] == 1) cycle = true;
        if (state[w] == 0) self(self, w);
      }
      state[v] = 2;
    };
    for (const auto& [v, next] : out) {
      if (state[v] == 0) visit(visit, v);
    }
    EXPECT_FALSE(cycle) << "preemptions formed a cycle";
  }

  std::mt19937 rng_;
  PreemptionPolicy policy_;
  PlacementCore core_;
  TimeMs now_ = 0;
  JobId next_ = 1;
  std::map<JobId, JobFacts> facts_;
  std::map<JobId, TimeMs> start_;               // running jobs' current start
  std::vector<std::pair<JobId, JobId>> edges_;  // preemptor, victim
  int reclaims_ = 0;
  int brute_checked_ = 0;
};

// Runs `seeds` random runs of `steps` events in `mode`; returns the
// preemptions, reclaims and brute-force checks over all of them.
struct RunTotals {
  int preemptions = 0;
  int reclaims = 0;
  int checked = 0;
};

RunTotals RunMany(PreemptionMode mode, int seeds, int steps) {
  RunTotals t;
  for (int seed = 1; seed <= seeds; ++seed) {
    RandomRun run(static_cast<unsigned>(seed * 7919), mode);
    for (int step = 0; step < steps; ++step) {
      run.Step();
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "seed " << seed << " step " << step;
        return t;
      }
    }
    t.preemptions += run.preemptions();
    t.reclaims += run.reclaims();
    t.checked += run.brute_checked();
  }
  std::printf(
      "%d preemptions (%d reclaims), %d choices checked by brute "
      "force\n",
      t.preemptions, t.reclaims, t.checked);
  return t;
}

constexpr int kSeeds = 10;
constexpr int kSteps = 5000;

TEST(PreemptionProperty, ModeOffNeverPreempts) {
  EXPECT_EQ(RunMany(PreemptionMode::kOff, kSeeds, kSteps).preemptions, 0);
}

TEST(PreemptionProperty, PriorityModeKeepsEveryRule) {
  const RunTotals t = RunMany(PreemptionMode::kPriority, kSeeds, kSteps);
  EXPECT_GT(t.preemptions, 200) << "too few preemptions to test anything";
  EXPECT_GT(t.checked, 1000);
  EXPECT_EQ(t.reclaims, 0);
}

TEST(PreemptionProperty, FairShareModeKeepsEveryRule) {
  const RunTotals t = RunMany(PreemptionMode::kFairShare, kSeeds, kSteps);
  EXPECT_GT(t.preemptions, 200) << "too few preemptions to test anything";
  EXPECT_GT(t.reclaims, 20);
  EXPECT_GT(t.checked, 1000);
}

}  // namespace
}  // namespace dlbatch::scheduler
