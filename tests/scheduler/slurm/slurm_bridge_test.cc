// Unit tests of the Slurm bridge on the host's paths (scheduler/slurm/
// bridge.h), through a fake host that records what the bridge asks of it:
// gangs and the starts they make, refusals, departures, records with their
// credentials, wait reasons. The Slurm thread is not started here; the
// scheduler's and real Slurm's tests drive it.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/bridge.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::scheduler::slurm {

// The fake host's mail: what would be sent to workers.
struct WorkerMail {
  std::vector<std::string> sent;
};

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A host of jobs and workers set by the test; each call the bridge makes
// is written down in order.
class FakeHost final : public SlurmHost {
 public:
  absl::Mutex& mutex() const override ABSL_LOCK_RETURNED(mu_) { return mu_; }
  std::optional<HostJob> FindJob(int64_t id) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs.find(id);
    if (it == jobs.end()) return std::nullopt;
    return it->second;
  }
  WorkerParts PartsOn(int64_t worker) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = parts.find(worker);
    return it == parts.end() ? WorkerParts{} : it->second;
  }
  void JobChanged(int64_t id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("changed ", id));
  }
  void Enqueue(int64_t id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("enqueue ", id));
  }
  void Refuse(int64_t worker, const std::string& why, WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mail.sent.push_back(absl::StrCat("refused ", worker, ": ", why));
  }
  void WithLock(const std::function<void(WorkerMail&)>& body) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    WorkerMail mail;
    body(mail);
  }
  absl::Status InTransaction(const std::function<absl::Status()>& body) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return body();
  }
  absl::Status CommitRecord(const SlurmJobRecord& record) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!writable) return absl::ResourceExhaustedError("the disk is full");
    calls.push_back(absl::StrCat("commit record ", record.job_id));
    return absl::OkStatus();
  }
  absl::Status CommitForget(int64_t job) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("forget record ", job));
    return absl::OkStatus();
  }
  absl::Status PutResubmits(int64_t job, int count) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("resubmits ", job, " ", count));
    return absl::OkStatus();
  }
  absl::Status Note(int64_t job, const std::string& text) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("note ", job, " ", text));
    return absl::OkStatus();
  }
  absl::Status EndQueued(int64_t job, v1::JobState state,
                         const std::string& note,
                         const std::string& reason) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("end ", job, " ", v1::JobState_Name(state),
                                 " note '", note, "' reason '", reason, "'"));
    jobs.erase(job);
    return absl::OkStatus();
  }
  absl::Status StartOnGang(int64_t job, const std::vector<Part>& on,
                           WorkerMail&) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> workers;
    for (const Part& p : on) {
      workers.push_back(absl::StrCat(p.worker, "[", p.devices.size(), "]"));
    }
    calls.push_back(
        absl::StrCat("start ", job, " on ", absl::StrJoin(workers, ",")));
    return absl::OkStatus();
  }
  absl::Status RequeueLost(int64_t job, const std::string& why,
                           WorkerMail&) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("requeue ", job, " ", why));
    return absl::OkStatus();
  }
  absl::Status RequeuePreempted(int64_t job, const std::string& why,
                                WorkerMail&) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("requeue preempted ", job, " ", why));
    return absl::OkStatus();
  }
  absl::Status FailRunning(int64_t job, const std::string& why,
                           WorkerMail&) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("fail ", job, " ", why));
    return absl::OkStatus();
  }
  absl::Status Preempt(const SlurmPreemptionView&, WorkerMail&) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::OkStatus();
  }
  absl::Status EndAsReported(int64_t job, WorkerMail&) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("end as reported ", job));
    return absl::OkStatus();
  }
  absl::Status ForgetWorker(int64_t worker, const std::string& why) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls.push_back(absl::StrCat("forget worker ", worker, " ", why));
    return absl::OkStatus();
  }

  mutable absl::Mutex mu_;
  std::map<int64_t, HostJob> jobs ABSL_GUARDED_BY(mu_);
  std::map<int64_t, WorkerParts> parts ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls ABSL_GUARDED_BY(mu_);
  bool writable ABSL_GUARDED_BY(mu_) = true;
};

std::vector<v1::Device> Gpus(int n) {
  std::vector<v1::Device> devices(n);
  for (v1::Device& d : devices) d.set_kind("gpu");
  return devices;
}

v1::SlurmJob Registration(int64_t job, int attempt, int nodes, int node) {
  v1::SlurmJob s;
  s.set_job_id(job);
  s.set_attempt(attempt);
  s.set_nodes(nodes);
  s.set_node_index(node);
  return s;
}

class SlurmBridgeTest : public ::testing::Test {
 protected:
  SlurmBridgeTest() : bridge_(&host_, &clock_, Options()) {
    absl::MutexLock lock(&host_.mu_);
    HostJob job;  // pool 4 on nodes of 2 GPUs: two nodes
    job.id = 7;
    job.state = v1::JOB_STATE_QUEUED;
    job.profile = "cluster";
    job.user = "root";
    job.shape.pool = 4;
    job.shape.max_nodes = 2;
    host_.jobs[7] = job;
  }
  static SlurmBridgeOptions Options() {
    SlurmProfile cluster;
    cluster.name = "cluster";
    cluster.partition = "gpu";
    cluster.gpus_per_node = 2;
    return SlurmBridgeOptions{{cluster}, 20, 3, {}};
  }
  // host_.mu_, held, is the bridge's host lock (as
  // SchedulerState::SlurmLockHeld asserts for the scheduler's).
  void Held() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_.mu_)
      ABSL_ASSERT_EXCLUSIVE_LOCK(bridge_.host_mutex()) {
    bridge_.host_mutex().AssertHeld();
  }
  // Job 7's wait reason, `attempt` attempts begun.
  std::string WaitReason(int attempt) ABSL_LOCKS_EXCLUDED(host_.mu_) {
    absl::MutexLock lock(&host_.mu_);
    Held();
    return bridge_.WaitReason(7, attempt);
  }
  // Worker `worker` registers as node `node` of job 7's first attempt.
  absl::Status Join(int64_t worker, int node, int gpus, WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_.mu_) {
    Held();
    return bridge_.Join(worker, absl::StrCat("n", node), Gpus(gpus),
                        Registration(7, 1, 2, node), mail);
  }

  FakeClock clock_;
  FakeHost host_;
  SlurmBridge bridge_;
};

TEST_F(SlurmBridgeTest, AJobStartsOnItsGangOnceEveryNodesWorkerIsIn) {
  absl::MutexLock lock(&host_.mu_);
  Held();
  WorkerMail mail;
  ASSERT_TRUE(Join(41, /*node=*/1, /*gpus=*/2, mail).ok());
  EXPECT_THAT(host_.calls, ElementsAre("changed 7"));
  EXPECT_EQ(bridge_.WaitReason(7, 0),
            "Slurm started its job; waiting for the worker of node 0 to "
            "register");
  ASSERT_TRUE(Join(40, /*node=*/0, /*gpus=*/2, mail).ok());
  // Rank 0 on node 0, each part the GPUs the job was given there.
  EXPECT_THAT(host_.calls,
              ElementsAre("changed 7", "changed 7", "start 7 on 40[2],41[2]"));
  EXPECT_THAT(mail.sent, IsEmpty());
}

TEST_F(SlurmBridgeTest, AHeldJobGathersItsGangWithoutStarting) {
  absl::MutexLock lock(&host_.mu_);
  Held();
  host_.jobs[7].held = true;
  WorkerMail mail;
  ASSERT_TRUE(Join(40, 0, 2, mail).ok());
  ASSERT_TRUE(Join(41, 1, 2, mail).ok());
  EXPECT_THAT(host_.calls, ElementsAre("changed 7", "changed 7"));
}

TEST_F(SlurmBridgeTest, AWorkerWithTooFewGpusIsRefusedAndFailsTheJob) {
  absl::MutexLock lock(&host_.mu_);
  Held();
  WorkerMail mail;
  ASSERT_TRUE(Join(40, 0, /*gpus=*/1, mail).ok());
  ASSERT_EQ(mail.sent.size(), 1u);
  EXPECT_THAT(
      mail.sent[0],
      HasSubstr(
          "refused 40: Slurm gave node 0 1 GPU; the job needs 2 on each node"));
  ASSERT_EQ(host_.calls.size(), 1u);
  EXPECT_THAT(host_.calls[0], HasSubstr("end 7 JOB_STATE_FAILED note "
                                        "'[dlbatch] Slurm gave node 0 1 GPU;"));
  EXPECT_THAT(host_.calls[0], HasSubstr("; job failed' reason 'Slurm gave"));
  // Gone from the host: a later registration for it changes nothing.
  ASSERT_TRUE(Join(41, 1, 2, mail).ok());
  EXPECT_EQ(host_.calls.size(), 1u);
}

TEST_F(SlurmBridgeTest, AWorkerOfAnotherAttemptOrJobOnlyCountsAsSlurms) {
  absl::MutexLock lock(&host_.mu_);
  Held();
  WorkerMail mail;
  ASSERT_TRUE(
      bridge_.Join(40, "n0", Gpus(2), Registration(7, 2, 2, 0), mail).ok());
  ASSERT_TRUE(
      bridge_.Join(41, "n0", Gpus(2), Registration(9, 1, 1, 0), mail).ok());
  EXPECT_THAT(host_.calls, IsEmpty());
  // Both are Slurm jobs' workers: holding nothing, they are forgotten as
  // they leave.
  EXPECT_TRUE(bridge_.WorkerLeft(40));
  EXPECT_TRUE(bridge_.WorkerLeft(41));
}

TEST_F(SlurmBridgeTest, ALeavingWorkerIsForgottenOrDepartsByWhatItHolds) {
  absl::MutexLock lock(&host_.mu_);
  Held();
  WorkerMail mail;
  for (int64_t worker : {40, 41, 42}) {
    ASSERT_TRUE(
        bridge_.Join(worker, "n", Gpus(2), Registration(99, 1, 1, 0), mail)
            .ok());
  }
  host_.parts[41] = WorkerParts{/*holds=*/true, /*all_ended=*/true};
  host_.parts[42] = WorkerParts{/*holds=*/true, /*all_ended=*/false};
  EXPECT_TRUE(bridge_.WorkerLeft(40));   // nothing held: forgotten now
  EXPECT_FALSE(bridge_.WorkerLeft(41));  // its part ended: it departed
  EXPECT_FALSE(bridge_.WorkerLeft(42));  // its part runs: it may be lost
  EXPECT_FALSE(bridge_.WorkerLeft(43));  // not a Slurm job's worker
  EXPECT_FALSE(bridge_.Departed(40));
  EXPECT_TRUE(bridge_.Departed(41));
  EXPECT_FALSE(bridge_.Departed(42));
  // Once more: it is no longer connected, so nothing changes.
  EXPECT_FALSE(bridge_.WorkerLeft(40));
  // A reload finds the departed again from the part ends.
  bridge_.Reset();
  EXPECT_FALSE(bridge_.Departed(41));
  bridge_.LoadEnds({}, {}, {41});
  EXPECT_TRUE(bridge_.Departed(41));
}

TEST_F(SlurmBridgeTest, RecordsGoToTheStoreWithTheirCredentials) {
  CredentialTable tokens;
  bridge_.set_credential_table(&tokens);
  SlurmJobRecord record;
  record.job_id = 7;
  record.attempt = 1;
  record.profile = "cluster";
  record.token_sha256 = TokenSha256("dlbj_seven");
  ASSERT_TRUE(bridge_.Put(record).ok());  // the intent
  record.slurm_id = 77;
  ASSERT_TRUE(bridge_.Put(record).ok());  // the id
  ASSERT_TRUE(tokens.FindByToken("dlbj_seven").has_value());
  EXPECT_EQ(tokens.FindByToken("dlbj_seven")->Key(), "job:7");
  ASSERT_TRUE(bridge_.Forget(7).ok());
  EXPECT_FALSE(tokens.FindByToken("dlbj_seven").has_value());
  absl::MutexLock lock(&host_.mu_);
  Held();
  EXPECT_THAT(host_.calls, ElementsAre("commit record 7", "commit record 7",
                                       "forget record 7"));
  EXPECT_FALSE(bridge_.RecordOf(7).has_value());
  EXPECT_THAT(bridge_.JobCredentials(), IsEmpty());
}

TEST_F(SlurmBridgeTest, AQueuedJobWaitsAsItsRecordSays) {
  SlurmJobRecord record;
  record.job_id = 7;
  record.attempt = 1;
  record.token_sha256 = TokenSha256("dlbj_seven");
  EXPECT_EQ(WaitReason(0),
            "waiting for the scheduler's Slurm launcher to start");
  ASSERT_TRUE(bridge_.Put(record).ok());
  EXPECT_EQ(WaitReason(0), "being submitted to Slurm");
  record.slurm_id = 77;
  ASSERT_TRUE(bridge_.Put(record).ok());
  EXPECT_EQ(WaitReason(0), "submitted to Slurm as job 77");
  // An attempt begun since: the record is an earlier attempt's.
  EXPECT_EQ(WaitReason(1),
            "waiting for the scheduler's Slurm launcher to start");
  absl::MutexLock lock(&host_.mu_);
  Held();
  EXPECT_EQ(bridge_.RecordOf(7)->slurm_id, 77);
  EXPECT_EQ(bridge_.JobCredentials().size(), 1u);
}

TEST_F(SlurmBridgeTest, ARecordTheStoreRefusesIsNotKept) {
  CredentialTable tokens;
  bridge_.set_credential_table(&tokens);
  {
    absl::MutexLock lock(&host_.mu_);
    host_.writable = false;
  }
  SlurmJobRecord record;
  record.job_id = 7;
  record.token_sha256 = TokenSha256("dlbj_seven");
  EXPECT_TRUE(absl::IsResourceExhausted(bridge_.Put(record)));
  EXPECT_FALSE(tokens.FindByToken("dlbj_seven").has_value());
  absl::MutexLock lock(&host_.mu_);
  Held();
  EXPECT_FALSE(bridge_.RecordOf(7).has_value());
}

TEST_F(SlurmBridgeTest, BeforeStartSubmitsAreRefusedAndProfilesKnown) {
  EXPECT_NE(bridge_.ProfileOf("cluster"), nullptr);
  EXPECT_EQ(bridge_.ProfileOf("local"), nullptr);
  v1::JobSpec spec;
  spec.set_profile("cluster");
  absl::Status refused = bridge_.CheckSubmit(spec, "root");
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("has not started its Slurm launcher yet"));
  spec.set_profile("local");  // not Slurm's to check
  EXPECT_TRUE(bridge_.CheckSubmit(spec, "root").ok());
  EXPECT_TRUE(absl::IsNotFound(bridge_.View("local").status()));
  EXPECT_TRUE(absl::IsUnavailable(bridge_.View("cluster").status()));
}

}  // namespace
}  // namespace dlbatch::scheduler::slurm
