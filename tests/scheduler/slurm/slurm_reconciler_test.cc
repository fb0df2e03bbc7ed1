// Unit tests of the Slurm reconciler's pure core
// (scheduler/slurm_reconciler.h): one squeue read against the store's
// records and dlbatch's view of its jobs, in Slurm 22.05's own states.
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/reconciler.h"

namespace dlbatch::scheduler::slurm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr int64_t kNow = 1'000'000;
constexpr char kInstance[] = "0a1b2c3d";
constexpr char kOtherInstance[] = "feedbeef";

SlurmJobRecord Record(int64_t job_id, int64_t slurm_id,
                      int64_t submitted_ms = kNow - 60'000) {
  SlurmJobRecord r;
  r.job_id = job_id;
  r.attempt = 1;
  r.slurm_id = slurm_id;
  r.profile = "cluster";
  r.submitted_ms = submitted_ms;
  return r;
}

SqueueRow Row(int64_t slurm_id, int64_t job_id, std::string state,
              std::string reason = "None") {
  SqueueRow row;
  row.slurm_id = slurm_id;
  row.name = SlurmJobName(kInstance, job_id);
  row.state = std::move(state);
  row.user = "alice";
  row.nodes = "n1";
  row.reason = std::move(reason);
  return row;
}

ReconcileInput Input() {
  ReconcileInput in;
  in.instance = kInstance;
  in.partitions = {{"cluster", "gpu"}};
  in.now_ms = kNow;
  return in;
}

TEST(SlurmReconcilerTest, PendingGivesSlurmsReasonRunningNeedsNothing) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102)};
  in.jobs = {{1, JobPhase::kWaiting}, {2, JobPhase::kRunning}};
  in.rows = {Row(101, 1, "PENDING", "Resources"), Row(102, 2, "RUNNING")};
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.waiting,
              ElementsAre(Pair(1,
                               "waiting in Slurm: Resources (partition "
                               "gpu)")));
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.cancel, IsEmpty());
  EXPECT_THAT(d.forget, IsEmpty());
}

TEST(SlurmReconcilerTest, AnEndNoWorkerReportedIsNeverASuccess) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103), Record(4, 104)};
  in.jobs = {{1, JobPhase::kRunning},
             {2, JobPhase::kRunning},
             {3, JobPhase::kWaiting},
             {4, JobPhase::kRunning}};
  in.rows = {Row(101, 1, "COMPLETED"), Row(102, 2, "CANCELLED by 1000"),
             Row(103, 3, "NODE_FAIL")};
  // 104 vanished from squeue altogether.
  ReconcileDecisions d = Reconcile(in);
  ASSERT_EQ(d.lost.size(), 4u);
  EXPECT_EQ(d.lost[0].job_id, 1);
  EXPECT_THAT(d.lost[0].reason, HasSubstr("Slurm job 101 completed"));
  EXPECT_FALSE(d.lost[0].machine_fault);
  EXPECT_THAT(d.lost[1].reason,
              HasSubstr("Slurm job 102 was cancelled in Slurm (by 1000)"));
  EXPECT_FALSE(d.lost[1].machine_fault);
  EXPECT_THAT(d.lost[2].reason, HasSubstr("lost a node"));
  EXPECT_TRUE(d.lost[2].machine_fault);
  EXPECT_THAT(d.lost[3].reason,
              HasSubstr("Slurm job 104 vanished from Slurm before its "
                        "workers reported the job's end"));
  EXPECT_TRUE(d.lost[3].machine_fault);
  EXPECT_THAT(d.forget, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(d.cancel, IsEmpty());
}

TEST(SlurmReconcilerTest,
     AnEndedJobsSlurmJobIsForgottenOnceGoneCancelledIfNot) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103)};
  in.jobs = {{1, JobPhase::kEnded}, {2, JobPhase::kEnded}};  // 3 purged
  in.rows = {Row(101, 1, "COMPLETED"), Row(102, 2, "RUNNING")};
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.forget, ElementsAre(1, 3));
  ASSERT_EQ(d.cancel.size(), 1u);
  EXPECT_EQ(d.cancel[0].slurm_id, 102);
  EXPECT_THAT(d.cancel[0].why, HasSubstr("dlbatch job 2 has ended"));
}

TEST(SlurmReconcilerTest, AFreshSubmissionSqueueDoesNotShowYetIsLeftAlone) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101, kNow - 2'000), Record(2, 0, kNow - 2'000)};
  in.jobs = {{1, JobPhase::kWaiting}, {2, JobPhase::kWaiting}};
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.forget, IsEmpty());
  EXPECT_THAT(d.relaunch, IsEmpty());
}

TEST(SlurmReconcilerTest, AnIntentAdoptsTheSlurmJobOfItsNameOrIsRelaunched) {
  ReconcileInput in = Input();
  in.records = {Record(1, 0), Record(2, 0), Record(3, 0)};
  in.jobs = {
      {1, JobPhase::kWaiting}, {2, JobPhase::kWaiting}, {3, JobPhase::kEnded}};
  // Job 1's: an old ended attempt and the live one sbatch made; job 2's
  // sbatch made nothing; job 3 ended (cancelled) meanwhile.
  in.rows = {Row(90, 1, "FAILED"), Row(101, 1, "PENDING", "Priority"),
             Row(103, 3, "PENDING")};
  ReconcileDecisions d = Reconcile(in);
  ASSERT_EQ(d.adopt.size(), 1u);
  EXPECT_EQ(d.adopt[0].job_id, 1);
  EXPECT_EQ(d.adopt[0].slurm_id, 101);
  EXPECT_THAT(d.waiting, ElementsAre(Pair(1, HasSubstr("Priority"))));
  EXPECT_THAT(d.relaunch, ElementsAre(2));
  ASSERT_EQ(d.cancel.size(), 1u);
  EXPECT_EQ(d.cancel[0].slurm_id, 103);
  EXPECT_THAT(d.forget, ElementsAre(3));
}

TEST(SlurmReconcilerTest, DlbatchsSlurmJobsItDoesNotKnowAreCancelled) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101)};
  in.jobs = {{1, JobPhase::kRunning}};
  SqueueRow foreign = Row(300, 0, "RUNNING");
  foreign.name = "train-resnet";  // not dlbatch's
  in.rows = {Row(101, 1, "RUNNING"), Row(200, 7, "RUNNING"),
             Row(201, 8, "PENDING"), Row(202, 9, "COMPLETED"), foreign};
  ReconcileDecisions d = Reconcile(in);
  ASSERT_EQ(d.cancel.size(), 2u);
  EXPECT_EQ(d.cancel[0].slurm_id, 200);
  EXPECT_THAT(d.cancel[0].why, HasSubstr("dlbatch does not know Slurm job 200 "
                                         "(dlbatch-0a1b2c3d-7)"));
  EXPECT_EQ(d.cancel[1].slurm_id, 201);
  EXPECT_THAT(d.lost, IsEmpty());
}

// Two schedulers share the cluster: the other's Slurm jobs, its intents'
// names included, are never adopted, cancelled or taken as this one's.
TEST(SlurmReconcilerTest, AnotherInstancesSlurmJobsAreNeverTouched) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 0)};
  in.jobs = {{1, JobPhase::kRunning}, {2, JobPhase::kWaiting}};
  auto theirs = [](int64_t slurm_id, int64_t job_id, std::string state) {
    SqueueRow row = Row(slurm_id, job_id, std::move(state));
    row.name = SlurmJobName(kOtherInstance, job_id);
    return row;
  };
  // Their jobs 1 and 2 (not our intent's), and 7, which we do not know.
  in.rows = {Row(101, 1, "RUNNING"), theirs(201, 1, "RUNNING"),
             theirs(202, 2, "PENDING"), theirs(207, 7, "RUNNING")};
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.cancel, IsEmpty());
  EXPECT_THAT(d.adopt, IsEmpty());
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.left_alone, IsEmpty());
  EXPECT_THAT(d.relaunch, ElementsAre(2));  // squeue holds nothing of ours

  // A Slurm id the store holds under another name (Slurm's ids began
  // again) is not the job's: it vanished, and the other's job stays.
  in.records = {Record(3, 207)};
  in.jobs = {{3, JobPhase::kRunning}};
  in.rows.erase(in.rows.begin());  // only theirs
  d = Reconcile(in);
  EXPECT_THAT(d.cancel, IsEmpty());
  ASSERT_EQ(d.lost.size(), 1u);
  EXPECT_EQ(d.lost[0].job_id, 3);
  EXPECT_THAT(d.lost[0].reason, HasSubstr("vanished"));
}

// Slurm jobs named as before instance ids ("dlbatch-<id>"): this
// scheduler's only where its store holds that Slurm id for that job.
TEST(SlurmReconcilerTest, OldNamesAreAdoptedOnlyByTheirRecordedSlurmId) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 0), Record(4, 104)};
  in.jobs = {
      {1, JobPhase::kRunning}, {2, JobPhase::kWaiting}, {4, JobPhase::kEnded}};
  auto old_row = [](int64_t slurm_id, int64_t job_id, std::string state) {
    SqueueRow row = Row(slurm_id, job_id, std::move(state), "Resources");
    row.name = absl::StrCat("dlbatch-", job_id);
    return row;
  };
  in.rows = {old_row(101, 1, "RUNNING"),    // recorded: job 1's
             old_row(102, 2, "PENDING"),    // an intent's name, not its id
             old_row(104, 4, "RUNNING"),    // recorded, its job ended
             old_row(105, 5, "RUNNING"),    // unknown
             old_row(106, 6, "COMPLETED"),  // over: nothing to say
             old_row(107, 1, "PENDING")};   // job 1's name, not its id
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.adopt, IsEmpty());
  EXPECT_THAT(d.relaunch, ElementsAre(2));
  // Job 4's own Slurm job goes with it; no other old-named one is touched.
  ASSERT_EQ(d.cancel.size(), 1u);
  EXPECT_EQ(d.cancel[0].slurm_id, 104);
  ASSERT_EQ(d.left_alone.size(), 3u);
  EXPECT_EQ(d.left_alone[0].slurm_id, 102);
  EXPECT_EQ(d.left_alone[1].slurm_id, 105);
  EXPECT_EQ(d.left_alone[2].slurm_id, 107);
  EXPECT_THAT(d.left_alone[1].why,
              HasSubstr("Slurm job 105 (dlbatch-5) is named as before "
                        "scheduler instances"));
}

TEST(SlurmReconcilerTest, AStateThisVersionDoesNotKnowLeavesTheJobBe) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101)};
  in.jobs = {{1, JobPhase::kRunning}};
  in.rows = {Row(101, 1, "SPECIAL_EXIT")};
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.forget, IsEmpty());
  EXPECT_THAT(d.cancel, IsEmpty());
}

TEST(SlurmReconcilerTest, OnlyAnEndBySignalMayBeSlurmsDoing) {
  EXPECT_TRUE(EndedBySignal(false, 128 + 15));  // SIGTERM: scancel
  EXPECT_TRUE(EndedBySignal(false, 128 + 9));   // SIGKILL: KillWait passed
  EXPECT_TRUE(EndedBySignal(false, 128 + 64));
  EXPECT_FALSE(EndedBySignal(true, 128 + 15));  // finished is finished
  EXPECT_FALSE(EndedBySignal(false, 0));
  EXPECT_FALSE(EndedBySignal(false, 1));
  EXPECT_FALSE(EndedBySignal(false, 128));
  EXPECT_FALSE(EndedBySignal(false, 128 + 65));
  EXPECT_FALSE(EndedBySignal(false, -1));  // no exit status at all
}

// Jobs whose workers reported an end by a signal, settled by Slurm's word:
// 1 scancelled by hand, 2 past its Slurm time limit, 3 on a node that
// failed, 4 killed by its own code (Slurm's job then completes), 5 whose
// Slurm job squeue no longer shows.
TEST(SlurmReconcilerTest, AnEndBySignalTakesSlurmsReasonWhereSlurmEndedIt) {
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103), Record(4, 104),
                Record(5, 105)};
  for (int64_t id = 1; id <= 5; ++id) {
    in.jobs[id] = JobPhase::kSettling;
    in.settling_since[id] = kNow - 1000;
  }
  in.rows = {Row(101, 1, "CANCELLED by 0"), Row(102, 2, "TIMEOUT"),
             Row(103, 3, "NODE_FAIL"), Row(104, 4, "COMPLETED")};
  ReconcileDecisions d = Reconcile(in);
  ASSERT_EQ(d.lost.size(), 3u);
  EXPECT_EQ(d.lost[0].job_id, 1);
  EXPECT_THAT(d.lost[0].reason, HasSubstr("cancelled in Slurm (by 0)"));
  EXPECT_FALSE(d.lost[0].machine_fault);
  EXPECT_EQ(d.lost[1].job_id, 2);
  EXPECT_THAT(d.lost[1].reason, HasSubstr("time limit"));
  EXPECT_EQ(d.lost[2].job_id, 3);
  EXPECT_TRUE(d.lost[2].machine_fault);  // requeued within its attempts
  EXPECT_THAT(d.reported, ElementsAre(4, 5));
  EXPECT_THAT(d.forget, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(d.cancel, IsEmpty());
}

TEST(SlurmReconcilerTest, APreemptionBySlurmIsLostAsPreemptedHoweverItIsSeen) {
  // Job 1's workers reported its end by Slurm's signal (settling); job 2's
  // Slurm job was seen PREEMPTED before they did; job 3 was cancelled.
  ReconcileInput in = Input();
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103)};
  in.jobs[1] = JobPhase::kSettling;
  in.settling_since[1] = kNow - 1000;
  in.jobs[2] = JobPhase::kRunning;
  in.jobs[3] = JobPhase::kRunning;
  in.rows = {Row(101, 1, "PREEMPTED"), Row(102, 2, "PREEMPTED"),
             Row(103, 3, "CANCELLED by 0")};
  ReconcileDecisions d = Reconcile(in);
  ASSERT_EQ(d.lost.size(), 3u);
  EXPECT_TRUE(d.lost[0].preempted);
  EXPECT_TRUE(d.lost[1].preempted);
  EXPECT_FALSE(d.lost[2].preempted);
  EXPECT_THAT(d.lost[0].reason, HasSubstr("Slurm job 101 was preempted"));
  EXPECT_THAT(d.forget, ElementsAre(1, 2, 3));
}

TEST(SlurmReconcilerTest, AnEndBySignalWaitsWhileSlurmStillRunsTheJob) {
  ReconcileInput in = Input();
  in.settling_wait_ms = 45'000;
  in.records = {Record(1, 101), Record(2, 102), Record(3, 103)};
  in.jobs = {{1, JobPhase::kSettling},
             {2, JobPhase::kSettling},
             {3, JobPhase::kSettling}};
  // 1 and 2 just reported: scancel's COMPLETING, or not yet seen by Slurm.
  // 3 reported long ago: Slurm still runs its job, so the report stands.
  in.settling_since = {{1, kNow - 100}, {2, kNow - 100}, {3, kNow - 45'000}};
  in.rows = {Row(101, 1, "COMPLETING"), Row(102, 2, "RUNNING"),
             Row(103, 3, "RUNNING")};
  ReconcileDecisions d = Reconcile(in);
  EXPECT_THAT(d.lost, IsEmpty());
  EXPECT_THAT(d.reported, ElementsAre(3));
  EXPECT_THAT(d.forget, IsEmpty());
  // Its Slurm job is the linger's to end, once the job has ended.
  EXPECT_THAT(d.cancel, IsEmpty());

  // The next read, after scancel's processes were reaped.
  in.rows[0].state = "CANCELLED by 1000";
  in.jobs.erase(3);
  in.records.pop_back();
  d = Reconcile(in);
  ASSERT_EQ(d.lost.size(), 1u);
  EXPECT_EQ(d.lost[0].job_id, 1);
  EXPECT_THAT(d.lost[0].reason,
              HasSubstr("Slurm job 101 was cancelled in Slurm (by 1000)"));
  EXPECT_THAT(d.reported, IsEmpty());
}

}  // namespace
}  // namespace dlbatch::scheduler::slurm
