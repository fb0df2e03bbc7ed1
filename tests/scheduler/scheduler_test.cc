// The scheduler's domain class without gRPC: a real SQLite store and blob
// store in a temp dir, a fake clock, and fake worker sessions that record
// what the scheduler sends.
//
// Worker messages are processed on the scheduler's loop thread, so a test
// posts a message and then waits (in real time, bounded) for its effect:
// an acknowledgement, a message to a session, or a state read back.
#include "scheduler/scheduler.h"

#include <sqlite3.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/jobspec_yaml.h"
#include "tests/common/fake_clock.h"
#include "tests/scheduler/fake_session.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Message = v1::SchedulerMessage;

constexpr int64_t kHeartbeatTimeoutMs = 1000;

SchedulerOptions TestOptions() {
  SchedulerOptions options;
  // The loop checks liveness every max(50, interval / 2) ms of fake time,
  // and otherwise sleeps at most that long in real time.
  options.heartbeat_interval_ms = 100;
  options.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
  options.max_attempts = 3;
  options.cancel_grace_ms = 2500;
  return options;
}

v1::SubmitJobRequest CommandJob(int pool, const std::string& request_id = "",
                                const std::string& profile = "local") {
  v1::SubmitJobRequest request;
  request.set_request_id(request_id);
  request.set_user("alice");
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("train");
  spec->set_profile(profile);
  spec->set_pool(pool);
  spec->mutable_command()->add_argv("python3");
  spec->mutable_command()->add_argv("train.py");
  return request;
}

v1::RunningJob Running(int64_t job_id, int attempt, int part = 0) {
  v1::RunningJob r;
  r.set_job_id(job_id);
  r.set_attempt(attempt);
  r.set_part(part);
  return r;
}

FakeSession::Predicate IsRegistered() {
  return [](const Message& m) { return m.has_registered(); };
}
FakeSession::Predicate IsStart(int64_t job_id, int attempt) {
  return [=](const Message& m) {
    return m.has_start() && m.start().job_id() == job_id &&
           m.start().attempt() == attempt;
  };
}
FakeSession::Predicate IsAnyStart(int64_t job_id) {
  return [=](const Message& m) {
    return m.has_start() && m.start().job_id() == job_id;
  };
}
FakeSession::Predicate IsCancel(int64_t job_id) {
  return [=](const Message& m) {
    return m.has_cancel() && m.cancel().job_id() == job_id;
  };
}
FakeSession::Predicate IsDiaryAck(int64_t job_id) {
  return [=](const Message& m) {
    return m.has_diary_ack() && m.diary_ack().job_id() == job_id;
  };
}
FakeSession::Predicate IsEndedAck(int64_t job_id, int attempt) {
  return [=](const Message& m) {
    return m.has_ended_ack() && m.ended_ack().job_id() == job_id &&
           m.ended_ack().attempt() == attempt;
  };
}

// Polls `done` every few ms of real time; false if it stays false.
bool WaitUntil(const std::function<bool()>& done,
               absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

std::vector<int> Devices(const Message& start) {
  return {start.start().devices().begin(), start.start().devices().end()};
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dlbatch_scheduler_XXXXXX")
            .string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }

  void TearDown() override {
    StopScheduler();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Opens the store, reader and blob store in the temp dir (again, after
  // StopScheduler: a restart) and starts a scheduler on them.
  void StartScheduler(SchedulerOptions options = TestOptions()) {
    const std::string db = dir_ + "/state.db";
    auto store = Store::Open(db, /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    reader_ = std::make_unique<StoreReader>(db);
    auto blobs = BlobStore::Open(dir_ + "/blobs", /*min_free_bytes=*/0);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = std::move(*blobs);
    disk_ = std::make_unique<DiskGuard>(
        "", kDiskReserve,
        [this]() -> absl::StatusOr<int64_t> { return free_bytes_.load(); });
    scheduler_ =
        std::make_unique<Scheduler>(store_.get(), reader_.get(), blobs_.get(),
                                    &clock_, options, disk_.get());
    absl::Status started = scheduler_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }

  void StopScheduler() {
    if (scheduler_) scheduler_->Stop();
    scheduler_.reset();
    disk_.reset();
    reader_.reset();
    blobs_.reset();
    store_.reset();
  }

  // A worker of `profile` with `slots` devices of `kind` (cpu or gpu)
  // connects on a new session and registers; returns once the scheduler
  // has answered.
  std::shared_ptr<FakeSession> Connect(
      const std::string& name, int slots,
      const std::vector<v1::RunningJob>& running = {},
      const std::string& profile = "local", const std::string& kind = "cpu") {
    auto session = std::make_shared<FakeSession>();
    v1::WorkerMessage m;
    v1::Register* reg = m.mutable_register_();
    reg->set_name(name);
    reg->set_host("host-" + name);
    reg->set_profile(profile);
    for (int i = 0; i < slots; ++i) {
      v1::Device* d = reg->add_devices();
      d->set_index(i);
      d->set_kind(kind);
      d->set_name(kind);
    }
    for (const auto& r : running) *reg->add_running() = r;
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(session->WaitFor(IsRegistered()).has_value())
        << "worker '" << name << "' got no answer to Register";
    return session;
  }

  // Returns once the loop thread has processed every message posted on
  // `session` before this call and delivered what they caused. `session`
  // must be registered: an empty diary batch is acknowledged in the next
  // batch, after the previous batch's messages went out.
  void Barrier(const std::shared_ptr<FakeSession>& session) {
    const int64_t marker = -(++barriers_);
    v1::WorkerMessage m;
    m.mutable_diary()->set_job_id(marker);
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(session->WaitFor(IsDiaryAck(marker)).has_value())
        << "the loop thread did not answer";
  }

  int64_t Submit(int pool, const std::string& request_id = "") {
    auto reply = scheduler_->Submit(CommandJob(pool, request_id));
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->job_id() : -1;
  }

  v1::Job GetJob(int64_t id) {
    auto job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  bool WaitForState(int64_t id, v1::JobState state) {
    return WaitUntil([&] {
      auto job = scheduler_->GetJob(id);
      return job.ok() && job->state() == state;
    });
  }

  // Reports the end of part 0 of an attempt and waits for its ack.
  void ReportEnded(const std::shared_ptr<FakeSession>& session, int64_t id,
                   int attempt, v1::JobState state, int exit_code,
                   const std::string& reason = "") {
    const size_t acks = session->Matching(IsEndedAck(id, attempt)).size();
    v1::WorkerMessage m;
    v1::JobEnded* ended = m.mutable_ended();
    ended->set_job_id(id);
    ended->set_attempt(attempt);
    ended->set_state(state);
    ended->set_exit_code(exit_code);
    ended->set_reason(reason);
    scheduler_->OnWorkerMessage(session, std::move(m));
    const bool acked = WaitUntil([&] {
      return session->Matching(IsEndedAck(id, attempt)).size() > acks;
    });
    EXPECT_TRUE(acked) << "no ended_ack for job " << id;
  }

  std::vector<v1::DiaryChunk> ReadDiaryChunks(int64_t id) {
    std::vector<v1::DiaryChunk> chunks;
    v1::ReadDiaryRequest request;
    request.set_job_id(id);
    absl::Status s = scheduler_->ReadDiary(
        request,
        [&](const v1::DiaryChunk& chunk) {
          chunks.push_back(chunk);
          return true;
        },
        [] { return false; });
    EXPECT_TRUE(s.ok()) << s;
    return chunks;
  }

  std::vector<std::string> DiaryTexts(int64_t id) {
    std::vector<std::string> texts;
    for (const auto& chunk : ReadDiaryChunks(id)) {
      for (const auto& line : chunk.lines()) texts.push_back(line.text());
    }
    return texts;
  }

  bool DiaryMentions(int64_t id, const std::string& text) {
    auto texts = DiaryTexts(id);
    return std::any_of(texts.begin(), texts.end(), [&](const std::string& t) {
      return t.find(text) != std::string::npos;
    });
  }

  // The reasons recorded in a job's history for entering `state`.
  std::vector<std::string> HistoryReasons(int64_t id, v1::JobState state) {
    std::vector<std::string> reasons;
    const v1::Job job = GetJob(id);
    for (const auto& change : job.history()) {
      if (change.state() == state) reasons.push_back(change.reason());
    }
    return reasons;
  }

  std::optional<v1::WorkerInfo> Worker(const std::string& name) {
    const v1::ListWorkersReply reply = scheduler_->ListWorkers();
    for (const auto& w : reply.workers()) {
      if (w.name() == name) return w;
    }
    return std::nullopt;
  }

  static constexpr int64_t kDiskReserve = 1000;
  // What the disk guard sees free; tests lower it to fill the disk.
  std::atomic<int64_t> free_bytes_{int64_t{1} << 40};
  std::unique_ptr<DiskGuard> disk_;
  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t barriers_ = 0;
};

// ---- 1: registration ----

TEST_F(SchedulerTest, RegisteredWorkerIsOnlineWithItsSlots) {
  StartScheduler();
  EXPECT_EQ(scheduler_->ListWorkers().workers().size(), 0);

  auto session = Connect("w1", 2);
  auto registered = session->WaitFor(IsRegistered());
  ASSERT_TRUE(registered.has_value());
  EXPECT_GT(registered->registered().worker_id(), 0);
  EXPECT_EQ(registered->registered().heartbeat_interval_ms(), 100);
  EXPECT_EQ(registered->registered().cancel().size(), 0);

  auto workers = scheduler_->ListWorkers();
  ASSERT_EQ(workers.workers_size(), 1);
  const v1::WorkerInfo& w = workers.workers(0);
  EXPECT_EQ(w.id(), registered->registered().worker_id());
  EXPECT_EQ(w.name(), "w1");
  EXPECT_EQ(w.host(), "host-w1");
  EXPECT_EQ(w.profile(), "local");
  EXPECT_TRUE(w.online());
  EXPECT_EQ(w.devices_size(), 2);
  EXPECT_EQ(w.free_slots(), 2);
  EXPECT_EQ(w.last_seen_ms(), FakeClock::kStartNowMs);

  auto profiles = scheduler_->ListProfiles();
  ASSERT_EQ(profiles.profiles_size(), 1);
  const v1::ProfileInfo& p = profiles.profiles(0);
  EXPECT_EQ(p.name(), "local");
  EXPECT_EQ(p.workers(), 1);
  EXPECT_EQ(p.workers_online(), 1);
  EXPECT_EQ(p.total_slots(), 2);
  EXPECT_EQ(p.free_slots(), 2);
  EXPECT_EQ(p.max_pool(), 2);
  EXPECT_EQ(p.slot_kind(), "cpu");
}

TEST_F(SchedulerTest, RegisterWithoutNameIsRefused) {
  StartScheduler();
  auto session = std::make_shared<FakeSession>();
  v1::WorkerMessage m;
  m.mutable_register_()->set_profile("local");
  scheduler_->OnWorkerMessage(session, std::move(m));
  auto refused = session->WaitFor(
      [](const Message& message) { return message.has_refused(); });
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(refused->refused(), HasSubstr("name"));
  EXPECT_EQ(scheduler_->ListWorkers().workers().size(), 0);
}

TEST_F(SchedulerTest, RegisterAsASlurmJobsWorkerIsRefused) {
  // No credential is good for one Slurm job yet: a worker claiming one,
  // under whatever credential, is never handed that job.
  StartScheduler();
  auto session = std::make_shared<FakeSession>();
  v1::WorkerMessage m;
  m.mutable_register_()->set_name("slurm-77-0");
  m.mutable_register_()->set_profile("local");
  m.mutable_register_()->mutable_slurm()->set_job_id(3);
  m.mutable_register_()->mutable_slurm()->set_attempt(1);
  m.mutable_register_()->mutable_slurm()->set_slurm_job_id(77);
  scheduler_->OnWorkerMessage(session, std::move(m));
  auto refused = session->WaitFor(
      [](const Message& message) { return message.has_refused(); });
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(refused->refused(),
              HasSubstr("serves Slurm job 77 for dlbatch job 3, which this "
                        "scheduler did not submit"));
  EXPECT_EQ(scheduler_->ListWorkers().workers().size(), 0);
}

TEST_F(SchedulerTest, AOneJobCredentialRegistersNoOrdinaryWorker) {
  // The token in a Slurm batch script is readable by the job: it must not
  // register a worker that would be handed other jobs.
  StartScheduler();
  auto session = std::make_shared<FakeSession>();
  session->set_owner("job:5");
  v1::WorkerMessage m;
  m.mutable_register_()->set_name("w-from-a-job");
  m.mutable_register_()->set_profile("local");
  scheduler_->OnWorkerMessage(session, std::move(m));
  auto refused = session->WaitFor(
      [](const Message& message) { return message.has_refused(); });
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(refused->refused(),
              HasSubstr("the credential of dlbatch job 5 registers only that "
                        "job's own workers"));
  EXPECT_EQ(scheduler_->ListWorkers().workers().size(), 0);
}

TEST_F(SchedulerTest, SlurmRecordsAreKeptWithTheirOneJobCredentials) {
  CredentialTable tokens;
  StartScheduler();
  scheduler_->slurm().set_credential_table(&tokens);
  SlurmLedger ledger(scheduler_.get());
  slurm::SlurmJobRecord record;
  record.job_id = 3;
  record.attempt = 1;
  record.profile = "cluster";
  record.token_sha256 = TokenSha256("dlbj_three");
  ASSERT_TRUE(ledger.Put(record).ok());  // the intent
  record.slurm_id = 77;
  ASSERT_TRUE(ledger.Put(record).ok());  // the id
  ASSERT_TRUE(tokens.FindByToken("dlbj_three").has_value());
  EXPECT_EQ(tokens.FindByToken("dlbj_three")->Key(), "job:3");

  // Its worker passes the credential check now (there is no job 3 to
  // start, so it is registered and given nothing).
  auto register_node = [&]() {
    auto session = std::make_shared<FakeSession>();
    session->set_owner("job:3");
    v1::WorkerMessage m;
    m.mutable_register_()->set_name("slurm-77-0");
    m.mutable_register_()->set_profile("cluster");
    auto* s = m.mutable_register_()->mutable_slurm();
    s->set_job_id(3);
    s->set_attempt(1);
    s->set_slurm_job_id(77);
    s->set_nodes(1);
    scheduler_->OnWorkerMessage(session, std::move(m));
    auto answer = session->WaitFor([](const Message& message) {
      return message.has_refused() || message.has_registered();
    });
    if (!answer) return std::string("(no answer)");
    return answer->has_refused() ? answer->refused()
                                 : std::string("registered");
  };
  EXPECT_EQ(register_node(), "registered");

  // After a restart the record and its credential are there again.
  StopScheduler();
  StartScheduler();
  auto loaded = scheduler_->slurm().JobCredentials();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].token_sha256, TokenSha256("dlbj_three"));
  EXPECT_EQ((*loaded)[0].job_id, 3);
  EXPECT_EQ(register_node(), "registered");

  // Forgotten: the credential goes, and the worker has nothing to run.
  scheduler_->slurm().set_credential_table(&tokens);
  SlurmLedger again(scheduler_.get());
  ASSERT_TRUE(again.Forget(3).ok());
  EXPECT_FALSE(tokens.FindByToken("dlbj_three").has_value());
  EXPECT_TRUE(scheduler_->slurm().JobCredentials()->empty());
  EXPECT_THAT(register_node(),
              HasSubstr("dlbatch job 3 has no Slurm job any more"));
}

// ---- 2: submit ----

// Slurm's tools as a cluster of two nodes with two GPUs each would answer:
// sinfo's limits, sbatch's id, squeue's rows as set (thread-safe: the
// scheduler's Slurm thread and submits call it).
class FakeSlurm final : public slurm::SlurmTool {
 public:
  absl::StatusOr<slurm::ToolResult> Run(const std::vector<std::string>& argv,
                                        const std::string& input) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(absl::StrJoin(argv, " "));
    slurm::ToolResult r;
    if (argv[0] == "sinfo") r.out = "2|gpu:2|infinite|8\n";
    if (argv[0] == "sbatch") {
      scripts_.push_back(input);
      r.out = absl::StrCat(next_id_++, "\n");
    }
    if (argv[0] == "squeue") r.out = squeue_;
    return r;
  }
  void SetQueue(std::string rows) {
    absl::MutexLock lock(&mu_);
    squeue_ = std::move(rows);
  }
  int Count(const std::string& prefix) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count_if(
        calls_.begin(), calls_.end(),
        [&](const std::string& c) { return c.rfind(prefix, 0) == 0; }));
  }
  std::vector<std::string> Calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> scripts_ ABSL_GUARDED_BY(mu_);
  std::string squeue_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 4242;
};

class SlurmSchedulerTest : public SchedulerTest {
 protected:
  void StartSlurmScheduler() {
    SchedulerOptions options = TestOptions();
    options.profiles.emplace_back("cluster", 0);
    slurm::SlurmProfile cluster;
    cluster.name = "cluster";
    cluster.partition = "gpu";
    cluster.gpus_per_node = 2;
    options.slurm_profiles.push_back(cluster);
    options.slurm_poll_ms = 20;
    StartScheduler(options);
    scheduler_->slurm().set_credential_table(&tokens_);
    ASSERT_TRUE(scheduler_->slurm()
                    .Start(&tool_, {{"cluster",
                                     slurm::WorkerLaunch{"head:7070", "", ""}}})
                    .ok());
  }
  // Job `id`'s Slurm job name, as this scheduler gives it.
  std::string Name(int64_t id) {
    return slurm::SlurmJobName(scheduler_->slurm().instance(), id);
  }
  v1::SubmitJobRequest SlurmJob(int pool, int max_nodes = 1) {
    v1::SubmitJobRequest r = CommandJob(pool, "", "cluster");
    r.set_user("root");  // the scheduler (root in tests) submits as itself
    r.mutable_spec()->set_max_nodes(max_nodes);
    return r;
  }
  // Node `node` of `nodes` of Slurm job `slurm_id` registers for attempt 1
  // of `job`, under the job's one-job credential, with `gpus` GPUs,
  // reporting `running` as its worker's (a worker back after a scheduler
  // restart).
  std::shared_ptr<FakeSession> RegisterNode(
      int64_t job, int64_t slurm_id, int node, int nodes,
      const std::vector<v1::RunningJob>& running = {}, int gpus = 2) {
    auto session = std::make_shared<FakeSession>();
    session->set_owner(absl::StrCat("job:", job));
    v1::WorkerMessage m;
    v1::Register* reg = m.mutable_register_();
    reg->set_name(absl::StrCat("slurm-", slurm_id, "-", node));
    reg->set_host(absl::StrCat("n", node + 1));
    reg->set_profile("cluster");
    for (int i = 0; i < gpus; ++i) {
      v1::Device* d = reg->add_devices();
      d->set_index(i);
      d->set_kind("gpu");
    }
    auto* s = reg->mutable_slurm();
    s->set_job_id(job);
    s->set_attempt(1);
    s->set_slurm_job_id(slurm_id);
    s->set_node_index(node);
    s->set_nodes(nodes);
    for (const v1::RunningJob& r : running) *reg->add_running() = r;
    scheduler_->OnWorkerMessage(session, std::move(m));
    return session;
  }
  // Waits (bounded) until job `id` waits on Slurm job `slurm_id`, as it
  // does once sbatch has answered with that id.
  ::testing::AssertionResult SubmittedToSlurmAs(int64_t id, int64_t slurm_id) {
    const std::string want =
        absl::StrCat("submitted to Slurm as job ", slurm_id);
    if (WaitUntil([&] { return GetJob(id).wait_reason() == want; })) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "job " << id << " waits: " << GetJob(id).wait_reason();
  }
  // Submits `request` and waits until sbatch has made it Slurm job
  // `slurm_id`; sets `id` to the dlbatch job's. Call it inside
  // ASSERT_NO_FATAL_FAILURE.
  void SubmitToSlurm(const v1::SubmitJobRequest& request, int64_t slurm_id,
                     int64_t* id) {
    auto submitted = scheduler_->Submit(request);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    *id = submitted->job_id();
    ASSERT_TRUE(SubmittedToSlurmAs(*id, slurm_id));
  }
  // A one-node job of two GPUs, submitted as Slurm job `slurm_id` and
  // started by its node's worker, `node`. Call it inside
  // ASSERT_NO_FATAL_FAILURE.
  void StartOneNodeJob(int64_t slurm_id, int64_t* id,
                       std::shared_ptr<FakeSession>* node) {
    ASSERT_NO_FATAL_FAILURE(SubmitToSlurm(SlurmJob(2), slurm_id, id));
    *node = RegisterNode(*id, slurm_id, 0, 1);
    ASSERT_TRUE((*node)->WaitFor(IsStart(*id, 1)).has_value());
  }

  CredentialTable tokens_;
  FakeSlurm tool_;
};

TEST_F(SlurmSchedulerTest, JobStartsOnceEveryNodesWorkerRegistered) {
  StartSlurmScheduler();
  int64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(SubmitToSlurm(SlurmJob(4, 2), 4242, &id));
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_QUEUED);
  // Slurm's pending reason, from one squeue read.
  tool_.SetQueue(absl::StrCat("4242|", Name(id), "|PENDING|root||Resources\n"));
  ASSERT_TRUE(WaitUntil([&] {
    return GetJob(id).wait_reason() ==
           "waiting in Slurm: Resources (partition gpu)";
  })) << GetJob(id).wait_reason();
  tool_.SetQueue(
      absl::StrCat("4242|", Name(id), "|RUNNING|root|n[1-2]|None\n"));
  // Node 1 first: the job waits for node 0's worker.
  auto second = RegisterNode(id, 4242, 1, 2);
  ASSERT_TRUE(second->WaitFor(IsRegistered()).has_value());
  ASSERT_TRUE(WaitUntil([&] {
    return absl::StrContains(GetJob(id).wait_reason(), "node 0 to register");
  })) << GetJob(id).wait_reason();
  auto first = RegisterNode(id, 4242, 0, 2);
  auto start0 = first->WaitFor(IsStart(id, 1));
  auto start1 = second->WaitFor(IsStart(id, 1));
  ASSERT_TRUE(start0.has_value() && start1.has_value());
  // Ranks follow the nodes: part 0 (rank 0) on node 0.
  EXPECT_EQ(start0->start().part(), 0);
  EXPECT_EQ(start0->start().first_rank(), 0);
  EXPECT_EQ(start1->start().part(), 1);
  EXPECT_EQ(start1->start().first_rank(), 2);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(tool_.Count("sbatch"), 1);
}

// A node's worker with fewer GPUs than the job was given there: the Slurm
// job can never hold it, so the job fails with the reason and its Slurm job
// is cancelled at once (not after the linger of an ended job's).
TEST_F(SlurmSchedulerTest, AWorkerShortOfItsNodesShareFailsTheJobAtOnce) {
  StartSlurmScheduler();
  int64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(SubmitToSlurm(SlurmJob(2), 4242, &id));
  // A core for each of the node's ranks.
  std::vector<std::string> calls = tool_.Calls();
  auto sbatch = std::find_if(calls.begin(), calls.end(), [](const auto& c) {
    return c.rfind("sbatch", 0) == 0;
  });
  ASSERT_NE(sbatch, calls.end());
  EXPECT_THAT(*sbatch, HasSubstr("--gres=gpu:2 --cpus-per-task=2"));
  tool_.SetQueue(absl::StrCat("4242|", Name(id), "|RUNNING|root|n1|None\n"));
  RegisterNode(id, 4242, 0, 1, {}, /*gpus=*/1);
  ASSERT_TRUE(WaitUntil([&] {
    return GetJob(id).state() == v1::JOB_STATE_FAILED;
  })) << GetJob(id).DebugString();
  EXPECT_THAT(GetJob(id).reason(),
              HasSubstr("Slurm gave node 0 1 GPU; the job needs 2 on each "
                        "node"));
  // The fake clock stands still: only a cancel without the linger comes.
  EXPECT_TRUE(WaitUntil([&] { return tool_.Count("scancel") >= 1; }))
      << absl::StrJoin(tool_.Calls(), "\n");
}

TEST_F(SlurmSchedulerTest, ImpossibleRequestsAreRefusedAtSubmit) {
  StartSlurmScheduler();
  auto too_many_nodes = scheduler_->Submit(SlurmJob(6, 3));
  ASSERT_FALSE(too_many_nodes.ok());
  EXPECT_THAT(too_many_nodes.status().message(),
              HasSubstr("the job asks for 3 nodes but Slurm partition 'gpu' "
                        "has 2"));
  auto one_node = scheduler_->Submit(SlurmJob(4, 1));
  ASSERT_FALSE(one_node.ok());
  EXPECT_THAT(one_node.status().message(), HasSubstr("set max_nodes: 2"));
  EXPECT_EQ(tool_.Count("sbatch"), 0);
  EXPECT_EQ(tool_.Count("sinfo"), 1);  // read once, then kept a while
}

TEST_F(SlurmSchedulerTest, VanishedSlurmJobIsRequeuedNeverTakenForASuccess) {
  StartSlurmScheduler();
  int64_t id = 0;
  std::shared_ptr<FakeSession> node;
  ASSERT_NO_FATAL_FAILURE(StartOneNodeJob(4242, &id, &node));
  tool_.SetQueue("");  // Slurm forgot it
  clock_.Advance(20000);
  ASSERT_TRUE(WaitUntil([&] {
    return GetJob(id).state() == v1::JOB_STATE_QUEUED ||
           GetJob(id).state() == v1::JOB_STATE_FAILED;
  })) << GetJob(id).DebugString();
  // Vanished is a machine's fault: requeued, and submitted again.
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(GetJob(id).attempt(), 1);
  EXPECT_TRUE(WaitUntil([&] { return tool_.Count("sbatch") == 2; }));
  EXPECT_TRUE(node->WaitFor(IsCancel(id)).has_value());
}

// scancel signals the job's command as well as its worker, whose report of
// the end (143: SIGTERM) can come while squeue still says COMPLETING: the
// job waits for Slurm's word, and fails with Slurm's reason.
TEST_F(SlurmSchedulerTest, EndBySignalTakesSlurmsReasonOnceSlurmSaysIt) {
  StartSlurmScheduler();
  int64_t id = 0;
  std::shared_ptr<FakeSession> node;
  ASSERT_NO_FATAL_FAILURE(StartOneNodeJob(4242, &id, &node));
  tool_.SetQueue(absl::StrCat("4242|", Name(id), "|COMPLETING|root|n1|None\n"));
  const int reads = tool_.Count("squeue");
  ReportEnded(node, id, 1, v1::JOB_STATE_FAILED, 143, "exit code 143");
  scheduler_->OnWorkerGone(node);
  // Read again at once, and while Slurm completes the job, it waits.
  ASSERT_TRUE(WaitUntil([&] { return tool_.Count("squeue") >= reads + 3; }));
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
  tool_.SetQueue(
      absl::StrCat("4242|", Name(id), "|CANCELLED by 0|root|n1|None\n"));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_FAILED))
      << GetJob(id).DebugString();
  EXPECT_THAT(GetJob(id).reason(),
              HasSubstr("Slurm job 4242 was cancelled in Slurm (by 0)"));
}

TEST_F(SlurmSchedulerTest, EndBySignalStandsWhereSlurmDidNotEndTheJob) {
  StartSlurmScheduler();
  int64_t ids[3];
  std::shared_ptr<FakeSession> nodes[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_NO_FATAL_FAILURE(StartOneNodeJob(4242 + i, &ids[i], &nodes[i]));
  }
  // 0: its own code failed (exit 1), which never waits. 1: killed by a
  // signal, and its Slurm job then completes: the report stands. 2: Slurm
  // still runs its job past the wait: the report stands.
  tool_.SetQueue(absl::StrCat("4242|", Name(ids[0]), "|RUNNING|root|n1|None\n",
                              "4243|", Name(ids[1]), "|RUNNING|root|n1|None\n",
                              "4244|", Name(ids[2]),
                              "|RUNNING|root|n1|None\n"));
  ReportEnded(nodes[0], ids[0], 1, v1::JOB_STATE_FAILED, 1, "exit code 1");
  EXPECT_EQ(GetJob(ids[0]).state(), v1::JOB_STATE_FAILED);
  ReportEnded(nodes[1], ids[1], 1, v1::JOB_STATE_FAILED, 139,
              "killed by signal 11 (Segmentation fault)");
  ReportEnded(nodes[2], ids[2], 1, v1::JOB_STATE_FAILED, 137,
              "killed by signal 9 (Killed)");
  // Acknowledged, their workers leave (never lost for it while they wait).
  scheduler_->OnWorkerGone(nodes[1]);
  scheduler_->OnWorkerGone(nodes[2]);
  const int reads = tool_.Count("squeue");
  ASSERT_TRUE(WaitUntil([&] { return tool_.Count("squeue") >= reads + 2; }));
  EXPECT_EQ(GetJob(ids[1]).state(), v1::JOB_STATE_RUNNING);
  tool_.SetQueue(absl::StrCat("4243|", Name(ids[1]),
                              "|COMPLETED|root|n1|None\n", "4244|",
                              Name(ids[2]), "|RUNNING|root|n1|None\n"));
  ASSERT_TRUE(WaitForState(ids[1], v1::JOB_STATE_FAILED));
  EXPECT_EQ(GetJob(ids[1]).reason(),
            "killed by signal 11 (Segmentation fault)");
  EXPECT_EQ(GetJob(ids[2]).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(60000);
  ASSERT_TRUE(WaitForState(ids[2], v1::JOB_STATE_FAILED));
  EXPECT_EQ(GetJob(ids[2]).reason(), "killed by signal 9 (Killed)");
}

// A two-node job's second node ends its part and its worker leaves (as a
// Slurm job's does); the scheduler restarts: the ended part is still known
// ended, its worker is never lost for being away, and the job finishes as
// its first node's part does.
TEST_F(SlurmSchedulerTest, PartEndedBeforeARestartStaysEndedWithoutItsWorker) {
  StartSlurmScheduler();
  int64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(SubmitToSlurm(SlurmJob(4, 2), 4242, &id));
  tool_.SetQueue(
      absl::StrCat("4242|", Name(id), "|RUNNING|root|n[1-2]|None\n"));
  auto first = RegisterNode(id, 4242, 0, 2);
  auto second = RegisterNode(id, 4242, 1, 2);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());
  ASSERT_TRUE(second->WaitFor(IsStart(id, 1)).has_value());
  v1::WorkerMessage end;
  end.mutable_ended()->set_job_id(id);
  end.mutable_ended()->set_attempt(1);
  end.mutable_ended()->set_part(1);
  end.mutable_ended()->set_state(v1::JOB_STATE_FINISHED);
  scheduler_->OnWorkerMessage(second, std::move(end));
  ASSERT_TRUE(second->WaitFor(IsEndedAck(id, 1)).has_value());
  scheduler_->OnWorkerGone(second);

  StopScheduler();
  StartSlurmScheduler();
  // Node 0's worker comes back with its part; node 1's never does.
  auto back = RegisterNode(id, 4242, 0, 2, {Running(id, 1, 0)});
  ASSERT_TRUE(back->WaitFor(IsRegistered()).has_value());
  // Past the restart's grace and the heartbeat timeout: node 1's worker
  // would be lost by now, and the job requeued, were its part not ended.
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(kHeartbeatTimeoutMs);
    v1::WorkerMessage beat;
    beat.mutable_heartbeat()->set_time_ms(clock_.NowMs());
    scheduler_->OnWorkerMessage(back, std::move(beat));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING)
      << GetJob(id).DebugString();
  EXPECT_EQ(GetJob(id).attempt(), 1);
  ReportEnded(back, id, 1, v1::JOB_STATE_FINISHED, 0);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_FINISHED))
      << GetJob(id).DebugString();
}

// A queued job's Slurm job that fails before it starts (NODE_FAIL) is
// submitted again within max_attempts (3) submissions in all, counted
// across a restart.
TEST_F(SlurmSchedulerTest, ResubmissionsAreCountedAcrossARestart) {
  StartSlurmScheduler();
  auto submitted = scheduler_->Submit(SlurmJob(2));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const int64_t id = submitted->job_id();
  auto fail_slurm_job = [&](int64_t slurm_id) {
    ASSERT_TRUE(SubmittedToSlurmAs(id, slurm_id));
    tool_.SetQueue(
        absl::StrCat(slurm_id, "|", Name(id), "|NODE_FAIL|root|n1|None\n"));
  };
  fail_slurm_job(4242);
  ASSERT_TRUE(WaitUntil([&] { return tool_.Count("sbatch") == 2; }));
  fail_slurm_job(4243);
  ASSERT_TRUE(WaitUntil([&] { return tool_.Count("sbatch") == 3; }));
  ASSERT_TRUE(SubmittedToSlurmAs(id, 4244));
  StopScheduler();
  StartSlurmScheduler();
  fail_slurm_job(4244);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_FAILED))
      << GetJob(id).DebugString();
  EXPECT_THAT(GetJob(id).reason(), HasSubstr("Slurm job 4244 lost a node"));
  EXPECT_EQ(tool_.Count("sbatch"), 3);
}

// Schedulers sharing a Slurm cluster: each cancels only the unknown Slurm
// jobs of its own instance, never another's, nor one named as before
// instance ids that its store does not hold.
TEST_F(SlurmSchedulerTest, OnlyThisInstancesUnknownSlurmJobsAreCancelled) {
  StartSlurmScheduler();
  const std::string mine = scheduler_->slurm().instance();
  ASSERT_TRUE(slurm::IsInstanceId(mine)) << mine;
  // The instance id is the store's: a restart keeps it, and reconciles
  // with squeue at once.
  StopScheduler();
  const std::string other = mine == "0000000a" ? "0000000b" : "0000000a";
  tool_.SetQueue(absl::StrCat(
      "999|", slurm::SlurmJobName(mine, 77), "|RUNNING|root|n1|None\n", "997|",
      slurm::SlurmJobName(other, 77), "|RUNNING|root|n1|None\n",
      "996|dlbatch-78|RUNNING|root|n1|None\n",
      "998|someone-else|RUNNING|bob|n2|None\n"));
  StartSlurmScheduler();
  EXPECT_EQ(scheduler_->slurm().instance(), mine);
  EXPECT_TRUE(WaitUntil([&] { return tool_.Count("scancel") >= 1; }));
  StopScheduler();  // the read's decisions are all carried out
  for (const std::string& call : tool_.Calls()) {
    if (call.rfind("scancel", 0) == 0) {
      EXPECT_THAT(call, HasSubstr("999"));
    }
  }
  EXPECT_EQ(tool_.Count("scancel"), 1);
}

TEST_F(SchedulerTest, SubmitStartsJobAndDeduplicatesRequest) {
  StartScheduler();
  auto session = Connect("w1", 2);
  const int64_t worker_id =
      session->WaitFor(IsRegistered())->registered().worker_id();

  auto first = scheduler_->Submit(CommandJob(1, "req-1"));
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t id = first->job_id();
  EXPECT_GT(id, 0);
  EXPECT_FALSE(first->duplicate());

  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.user(), "alice");
  EXPECT_EQ(job.submit_time_ms(), FakeClock::kStartNowMs);
  ASSERT_EQ(job.placement_size(), 1);
  EXPECT_EQ(job.placement(0).worker_id(), worker_id);
  EXPECT_EQ(job.placement(0).worker_name(), "w1");
  EXPECT_THAT(job.placement(0).devices(), ElementsAre(0));

  auto start = session->WaitFor(IsAnyStart(id));
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->start().attempt(), 1);
  EXPECT_THAT(Devices(*start), ElementsAre(0));
  EXPECT_EQ(start->start().pool(), 1);
  EXPECT_EQ(start->start().part(), 0);
  EXPECT_EQ(start->start().parts(), 1);
  EXPECT_EQ(start->start().user(), "alice");
  EXPECT_THAT(start->start().spec().command().argv(),
              ElementsAre("python3", "train.py"));

  auto again = scheduler_->Submit(CommandJob(1, "req-1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job_id(), id);
  EXPECT_TRUE(again->duplicate());

  // Submit delivers its starts before returning: none came for a copy.
  EXPECT_EQ(
      session->Matching([](const Message& m) { return m.has_start(); }).size(),
      1u);
  auto jobs = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs_size(), 1);
}

// ---- 3: submit errors ----

TEST_F(SchedulerTest, SubmitRejectsJobsThatCannotRun) {
  StartScheduler();
  auto session = Connect("w1", 2);

  auto too_big = scheduler_->Submit(CommandJob(3));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(), HasSubstr("exceeds profile 'local'"));

  auto unknown = scheduler_->Submit(CommandJob(1, "", "big-gpus"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'big-gpus'"));

  const std::string data = "weights";
  const std::string sha = Sha256Hex(data);
  v1::SubmitJobRequest with_attachment = CommandJob(1);
  v1::Attachment* a = with_attachment.mutable_spec()->add_attach();
  a->set_path("data/weights.bin");
  a->set_sha256(sha);
  a->set_size(static_cast<int64_t>(data.size()));
  auto missing = scheduler_->Submit(with_attachment);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("data/weights.bin"));

  auto jobs = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs_size(), 0) << "a refused job was stored";

  // Once uploaded, the same attachment is accepted.
  auto writer = blobs_->NewWriter(sha, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(data).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  auto accepted = scheduler_->Submit(with_attachment);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(session->WaitFor(IsStart(accepted->job_id(), 1)).has_value());
}

// A train job of `profile` whose options say execution_environment: `env`
// (empty: not said).
v1::SubmitJobRequest TrainJob(const std::string& profile,
                              const std::string& env) {
  const std::string yaml = absl::StrCat(
      R"(name: net
train:
  network:
    input: [28, 28, 1]
    layers:
      - {type: fc, units: 10}
      - {type: softmax}
  data:
    train: {format: idx, images: i.gz, labels: l.gz}
  options:
    max_iterations: 1
)",
      env.empty() ? ""
                  : absl::StrCat("    execution_environment: ", env, "\n"));
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(yaml, "job.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  v1::SubmitJobRequest request;
  request.set_user("alice");
  if (parsed.ok()) *request.mutable_spec() = parsed->spec;
  request.mutable_spec()->set_profile(profile);
  return request;
}

TEST_F(SchedulerTest, SubmitRefusesGpuTrainJobsWhereTheWorkersOfferCpuSlots) {
  StartScheduler();
  auto cpus = Connect("cpus", 2);
  auto gpus = Connect("gpus", 1, {}, "gpu-box", "gpu");

  for (const char* env : {"gpu", "multi-gpu"}) {
    auto refused = scheduler_->Submit(TrainJob("local", env));
    ASSERT_FALSE(refused.ok()) << env;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(),
                HasSubstr(absl::StrCat(
                    "execution_environment: ", env,
                    " asks for GPUs, but the workers of profile 'local' "
                    "offer CPU slots only; use cpu or auto, or a profile "
                    "with GPUs (--profile gpu-box)")));
  }
  auto jobs = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs_size(), 0) << "a refused job was stored";

  // cpu, auto and the unsaid default run on CPU slots; gpu runs on GPUs.
  for (const char* env : {"cpu", "auto", ""}) {
    auto accepted = scheduler_->Submit(TrainJob("local", env));
    EXPECT_TRUE(accepted.ok()) << env << ": " << accepted.status();
  }
  auto on_gpus = scheduler_->Submit(TrainJob("gpu-box", "gpu"));
  ASSERT_TRUE(on_gpus.ok()) << on_gpus.status();
  EXPECT_TRUE(gpus->WaitFor(IsStart(on_gpus->job_id(), 1)).has_value());
}

// ---- 4: diary and end ----

TEST_F(SchedulerTest, DiaryAndEndAreStoredOnceAndAcknowledged) {
  StartScheduler();
  auto session = Connect("w1", 2);
  const int64_t id = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());

  v1::WorkerMessage diary;
  v1::DiaryBatch* batch = diary.mutable_diary();
  batch->set_job_id(id);
  batch->set_attempt(1);
  const std::vector<std::string> texts = {"epoch 1", "epoch 2", "done"};
  for (size_t i = 0; i < texts.size(); ++i) {
    v1::DiaryLine* line = batch->add_lines();
    line->set_seq(static_cast<int64_t>(i) + 1);
    line->set_time_ms(FakeClock::kStartNowMs + static_cast<int64_t>(i));
    line->set_stream(1);
    line->set_text(texts[i]);
  }
  scheduler_->OnWorkerMessage(session, diary);
  auto ack = session->WaitFor(IsDiaryAck(id));
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->diary_ack().attempt(), 1);
  EXPECT_EQ(ack->diary_ack().part(), 0);
  EXPECT_EQ(ack->diary_ack().seq(), 3);

  // A worker that missed the ack sends the batch again.
  scheduler_->OnWorkerMessage(session, diary);
  ASSERT_TRUE(
      WaitUntil([&] { return session->Matching(IsDiaryAck(id)).size() == 2; }));
  EXPECT_EQ(session->Matching(IsDiaryAck(id)).back().diary_ack().seq(), 3);

  ReportEnded(session, id, 1, v1::JOB_STATE_FINISHED, 0);
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(job.exit_code(), 0);
  EXPECT_EQ(job.end_time_ms(), FakeClock::kStartNowMs);
  EXPECT_EQ(job.diary_lines(), 3);

  std::vector<v1::DiaryChunk> chunks = ReadDiaryChunks(id);
  ASSERT_FALSE(chunks.empty());
  EXPECT_TRUE(chunks.back().end());
  EXPECT_EQ(chunks.back().state(), v1::JOB_STATE_FINISHED);
  std::vector<std::string> read;
  std::vector<int64_t> seqs;
  for (const auto& chunk : chunks) {
    for (const auto& line : chunk.lines()) {
      read.push_back(line.text());
      seqs.push_back(line.seq());
      EXPECT_EQ(line.attempt(), 1);
      EXPECT_EQ(line.stream(), 1);
    }
  }
  EXPECT_EQ(read, texts);
  EXPECT_THAT(seqs, ElementsAre(1, 2, 3));

  // A resend after the end is acknowledged and still stored once.
  scheduler_->OnWorkerMessage(session, diary);
  ASSERT_TRUE(
      WaitUntil([&] { return session->Matching(IsDiaryAck(id)).size() == 3; }));
  EXPECT_EQ(DiaryTexts(id), texts);

  auto w = Worker("w1");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->free_slots(), 2);
  EXPECT_THAT(w->running_jobs(), IsEmpty());
}

TEST_F(SchedulerTest, FailedPartMakesTheJobFailWithItsReason) {
  StartScheduler();
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());

  // A report for another attempt is stale and changes nothing.
  ReportEnded(session, id, 7, v1::JOB_STATE_FINISHED, 0);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);

  ReportEnded(session, id, 1, v1::JOB_STATE_FAILED, 3, "exit status 3");
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.exit_code(), 3);
  EXPECT_EQ(job.reason(), "exit status 3");
}

// ---- 5: liveness ----

TEST_F(SchedulerTest, SilentWorkerIsLostAndItsJobRestartsElsewhere) {
  StartScheduler();
  auto first = Connect("w1", 2);
  const int64_t id = Submit(1);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());

  clock_.Advance(kHeartbeatTimeoutMs / 2);
  EXPECT_FALSE(
      WaitUntil([&] { return first->closed(); }, absl::Milliseconds(150)))
      << "worker lost before its timeout";

  clock_.Advance(kHeartbeatTimeoutMs);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_QUEUED));
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.attempt(), 1);
  // The profile's only worker is gone: the job waits for it by name.
  EXPECT_THAT(job.wait_reason(),
              HasSubstr("waiting: worker 'w1' is offline since "));
  EXPECT_TRUE(DiaryMentions(id, "lost"));
  EXPECT_TRUE(DiaryMentions(id, "requeued"));
  EXPECT_THAT(HistoryReasons(id, v1::JOB_STATE_QUEUED),
              ElementsAre("", HasSubstr("lost")));
  EXPECT_TRUE(first->closed());
  EXPECT_THAT(first->close_reason(), HasSubstr("lost"));
  auto w1 = Worker("w1");
  ASSERT_TRUE(w1.has_value());
  EXPECT_FALSE(w1->online());

  auto second = Connect("w2", 2);
  auto start = second->WaitFor(IsAnyStart(id));
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->start().attempt(), 2);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_RUNNING));
  job = GetJob(id);
  EXPECT_EQ(job.attempt(), 2);
  ASSERT_EQ(job.placement_size(), 1);
  EXPECT_EQ(job.placement(0).worker_name(), "w2");

  // The lost worker's old session is no longer heard.
  v1::WorkerMessage late;
  late.mutable_ended()->set_job_id(id);
  late.mutable_ended()->set_attempt(2);
  late.mutable_ended()->set_state(v1::JOB_STATE_FINISHED);
  scheduler_->OnWorkerMessage(first, std::move(late));
  Barrier(second);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerTest, LostWorkerFailsTheJobAtMaxAttempts) {
  SchedulerOptions options = TestOptions();
  options.max_attempts = 1;
  StartScheduler(options);
  auto first = Connect("w1", 2);
  const int64_t id = Submit(1);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());

  clock_.Advance(kHeartbeatTimeoutMs + 500);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_FAILED));
  v1::Job job = GetJob(id);
  EXPECT_THAT(job.reason(), HasSubstr("attempt 1 of 1"));
  EXPECT_THAT(job.reason(), HasSubstr("lost"));
  EXPECT_EQ(job.exit_code(), -1);
  EXPECT_NE(job.end_time_ms(), 0);
  EXPECT_TRUE(DiaryMentions(id, "job failed"));

  auto second = Connect("w2", 2);
  Barrier(second);
  EXPECT_EQ(second->Matching(IsAnyStart(id)).size(), 0u);
}

// ---- 6: reconnects ----

TEST_F(SchedulerTest, ReconnectReportingTheJobKeepsItRunning) {
  StartScheduler();
  auto first = Connect("w1", 2);
  const int64_t id = Submit(1);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());

  scheduler_->OnWorkerGone(first);
  ASSERT_TRUE(WaitUntil([&] {
    auto w = Worker("w1");
    return w && !w->online();
  }));
  EXPECT_EQ(Worker("w1")->free_slots(), 0);
  clock_.Advance(kHeartbeatTimeoutMs / 2);  // within the timeout

  // It also reports a job the scheduler never gave it.
  auto second = Connect("w1", 2, {Running(id, 1), Running(id + 100, 1)});
  auto registered = second->WaitFor(IsRegistered());
  ASSERT_TRUE(registered.has_value());
  ASSERT_EQ(registered->registered().cancel_size(), 1);
  EXPECT_EQ(registered->registered().cancel(0).job_id(), id + 100);
  Barrier(second);
  EXPECT_EQ(second->Matching(IsAnyStart(id)).size(), 0u);

  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.diary_lines(), 0);
  auto w = Worker("w1");
  ASSERT_TRUE(w.has_value());
  EXPECT_TRUE(w->online());
  EXPECT_THAT(w->running_jobs(), ElementsAre(id));
  EXPECT_EQ(w->free_slots(), 1);

  // The job goes on: its end is accepted on the new session.
  ReportEnded(second, id, 1, v1::JOB_STATE_FINISHED, 0);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_FINISHED);
}

TEST_F(SchedulerTest, ReconnectWithoutTheJobRequeuesIt) {
  StartScheduler();
  auto first = Connect("w1", 2);
  const int64_t id = Submit(1);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());

  scheduler_->OnWorkerGone(first);
  auto second = Connect("w1", 2);
  // Requeued, then placed again at once on the same worker.
  auto start = second->WaitFor(IsAnyStart(id));
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->start().attempt(), 2);
  EXPECT_TRUE(DiaryMentions(id, "restarted without the job"));
  EXPECT_THAT(HistoryReasons(id, v1::JOB_STATE_QUEUED),
              ElementsAre("", HasSubstr("restarted without the job")));
  EXPECT_EQ(GetJob(id).attempt(), 2);
}

TEST_F(SchedulerTest, NewConnectionReplacesTheOldOne) {
  StartScheduler();
  auto first = Connect("w1", 2);
  const int64_t id = Submit(1);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());

  auto second = Connect("w1", 2, {Running(id, 1)});
  EXPECT_TRUE(first->closed());
  EXPECT_THAT(first->close_reason(), HasSubstr("replaced"));
  // The old stream's end arrives late: the worker stays online.
  scheduler_->OnWorkerGone(first);
  Barrier(second);
  auto w = Worker("w1");
  ASSERT_TRUE(w.has_value());
  EXPECT_TRUE(w->online());
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
}

// ---- 7: cancel ----

TEST_F(SchedulerTest, CancelQueuedAtOnceAndRunningThroughTheWorker) {
  StartScheduler();
  auto session = Connect("w1", 2);
  const int64_t running = Submit(2);
  const int64_t queued = Submit(1);
  const int64_t next = Submit(2);
  ASSERT_TRUE(session->WaitFor(IsStart(running, 1)).has_value());
  ASSERT_EQ(GetJob(queued).state(), v1::JOB_STATE_QUEUED);

  v1::CancelJobsRequest cancel_queued;
  cancel_queued.add_job_ids(queued);
  auto reply = scheduler_->Cancel(cancel_queued);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->results_size(), 1);
  EXPECT_EQ(reply->results(0).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(reply->results(0).error(), "");
  v1::Job job = GetJob(queued);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.reason(), "cancelled by request");
  EXPECT_EQ(job.attempt(), 0);
  EXPECT_EQ(session->Matching(IsCancel(queued)).size(), 0u);

  v1::CancelJobsRequest cancel_running;
  cancel_running.add_job_ids(running);
  reply = scheduler_->Cancel(cancel_running);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->results(0).state(), v1::JOB_STATE_CANCELLING);
  EXPECT_EQ(GetJob(running).state(), v1::JOB_STATE_CANCELLING);
  auto cancel = session->WaitFor(IsCancel(running));
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->cancel().attempt(), 1);
  EXPECT_EQ(cancel->cancel().part(), 0);
  EXPECT_EQ(cancel->cancel().grace_ms(), 2500);
  EXPECT_THAT(cancel->cancel().reason(), HasSubstr("cancelled"));

  // Asking again sends nothing new; unknown and ended jobs are errors.
  cancel_running.add_job_ids(queued);
  cancel_running.add_job_ids(9999);
  reply = scheduler_->Cancel(cancel_running);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->results_size(), 3);
  EXPECT_EQ(reply->results(0).state(), v1::JOB_STATE_CANCELLING);
  EXPECT_THAT(reply->results(1).error(), HasSubstr("already cancelled"));
  EXPECT_THAT(reply->results(2).error(), HasSubstr("no job 9999"));
  EXPECT_EQ(session->Matching(IsCancel(running)).size(), 1u);

  // The slots stay held until the worker says the job stopped.
  EXPECT_EQ(GetJob(next).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(session->Matching(IsAnyStart(next)).size(), 0u);

  ReportEnded(session, running, 1, v1::JOB_STATE_CANCELLED, -15, "terminated");
  job = GetJob(running);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.reason(), "cancelled by request");
  auto start = session->WaitFor(IsStart(next, 1));
  ASSERT_TRUE(start.has_value());
  EXPECT_THAT(Devices(*start), ElementsAre(0, 1));
  EXPECT_EQ(GetJob(next).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerTest, CancelWhileDisconnectedReachesTheWorkerOnReconnect) {
  StartScheduler();
  auto first = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(first->WaitFor(IsStart(id, 1)).has_value());
  scheduler_->OnWorkerGone(first);
  ASSERT_TRUE(WaitUntil([&] {
    auto w = Worker("w1");
    return w && !w->online();
  }));

  v1::CancelJobsRequest request;
  request.add_job_ids(id);
  auto reply = scheduler_->Cancel(request);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->results(0).state(), v1::JOB_STATE_CANCELLING);

  // The job is still running there; the request must not be forgotten.
  auto second = Connect("w1", 1, {Running(id, 1)});
  auto cancel = second->WaitFor(IsCancel(id));
  ASSERT_TRUE(cancel.has_value()) << "the cancel never reached the worker";
  EXPECT_EQ(cancel->cancel().attempt(), 1);
  EXPECT_THAT(cancel->cancel().reason(), HasSubstr("cancelled"));

  ReportEnded(second, id, 1, v1::JOB_STATE_CANCELLED, -15);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_CANCELLED);
}

// ---- 8: restart ----

TEST_F(SchedulerTest, RestartKeepsJobsAndReconcilesWithTheWorker) {
  StartScheduler();
  auto before = Connect("w1", 2);
  const int64_t kept = Submit(1);
  const int64_t dropped = Submit(1);
  const int64_t queued = Submit(2);
  auto kept_start = before->WaitFor(IsStart(kept, 1));
  auto dropped_start = before->WaitFor(IsStart(dropped, 1));
  ASSERT_TRUE(kept_start.has_value());
  ASSERT_TRUE(dropped_start.has_value());
  ASSERT_EQ(GetJob(queued).state(), v1::JOB_STATE_QUEUED);

  StopScheduler();
  StartScheduler();

  EXPECT_EQ(GetJob(kept).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(GetJob(dropped).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(GetJob(queued).state(), v1::JOB_STATE_QUEUED);
  auto w = Worker("w1");
  ASSERT_TRUE(w.has_value());
  EXPECT_FALSE(w->online());
  EXPECT_THAT(w->running_jobs(), UnorderedElementsAre(kept, dropped));

  const size_t old_messages = before->Messages().size();
  auto after = Connect("w1", 2, {Running(kept, 1)});
  auto registered = after->WaitFor(IsRegistered());
  ASSERT_TRUE(registered.has_value());
  EXPECT_EQ(registered->registered().cancel().size(), 0);
  // The unreported job restarts on the slot it held; the others wait.
  auto restart = after->WaitFor(IsAnyStart(dropped));
  ASSERT_TRUE(restart.has_value());
  EXPECT_EQ(restart->start().attempt(), 2);
  EXPECT_THAT(Devices(*restart), ElementsAre(1));
  Barrier(after);
  EXPECT_EQ(after->Matching(IsAnyStart(kept)).size(), 0u);
  EXPECT_EQ(after->Matching(IsAnyStart(queued)).size(), 0u);
  EXPECT_EQ(before->Messages().size(), old_messages);

  v1::Job job = GetJob(kept);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_TRUE(DiaryMentions(dropped, "restarted without the job"));
  EXPECT_EQ(GetJob(dropped).attempt(), 2);
  EXPECT_EQ(GetJob(queued).state(), v1::JOB_STATE_QUEUED);

  ReportEnded(after, kept, 1, v1::JOB_STATE_FINISHED, 0);
  EXPECT_EQ(GetJob(kept).state(), v1::JOB_STATE_FINISHED);
  ReportEnded(after, dropped, 2, v1::JOB_STATE_FINISHED, 0);
  EXPECT_TRUE(after->WaitFor(IsStart(queued, 1)).has_value());
}

TEST_F(SchedulerTest, RestartLosesWorkersThatNeverReturn) {
  StartScheduler();
  auto before = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(before->WaitFor(IsStart(id, 1)).has_value());

  StopScheduler();
  StartScheduler();
  // The new loop thread may read the clock for its first liveness check
  // after a single jump, so time moves on as it would for real.
  ASSERT_TRUE(WaitUntil([&] {
    clock_.Advance(50);
    auto job = scheduler_->GetJob(id);
    return job.ok() && job->state() == v1::JOB_STATE_QUEUED;
  }));
  // Not before the grace a restart gives: twice the heartbeat timeout.
  EXPECT_GE(clock_.MonotonicMs() - FakeClock::kStartMonotonicMs,
            2 * kHeartbeatTimeoutMs);
  EXPECT_TRUE(DiaryMentions(id, "lost"));
  auto other = Connect("w2", 1);
  EXPECT_TRUE(other->WaitFor(IsStart(id, 2)).has_value());
}

TEST_F(SchedulerTest, RestartResendsCancelOfAJobTheWorkerStillRuns) {
  StartScheduler();
  auto before = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(before->WaitFor(IsStart(id, 1)).has_value());
  v1::CancelJobsRequest request;
  request.add_job_ids(id);
  ASSERT_TRUE(scheduler_->Cancel(request).ok());
  ASSERT_EQ(before->Matching(IsCancel(id)).size(), 1u);

  // The cancel was sent, but the stream broke with the restart.
  StopScheduler();
  StartScheduler();
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_CANCELLING);
  auto after = Connect("w1", 1, {Running(id, 1)});
  auto cancel = after->WaitFor(IsCancel(id));
  ASSERT_TRUE(cancel.has_value()) << "the cancel was not sent again";
  EXPECT_EQ(cancel->cancel().reason(), "cancelled by request");
  ReportEnded(after, id, 1, v1::JOB_STATE_CANCELLED, -15);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_CANCELLED);
}

// ---- 9: wait ----

TEST_F(SchedulerTest, WaitReturnsOnceEveryJobHasEnded) {
  StartScheduler();
  auto session = Connect("w1", 2);
  const int64_t a = Submit(1);
  const int64_t b = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(b, 1)).has_value());

  std::atomic<bool> abandon{false};
  v1::WaitJobsRequest request;
  request.add_job_ids(a);
  request.add_job_ids(b);
  auto waiting = std::async(std::launch::async, [&] {
    return scheduler_->Wait(request, [&] { return abandon.load(); });
  });

  ReportEnded(session, a, 1, v1::JOB_STATE_FINISHED, 0);
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout)
      << "Wait returned with a job still running";
  ReportEnded(session, b, 1, v1::JOB_STATE_FAILED, 1, "exit status 1");
  if (waiting.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    abandon = true;
    FAIL() << "Wait did not return after the jobs ended";
  }
  auto reply = waiting.get();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->timed_out());
  ASSERT_EQ(reply->jobs_size(), 2);
  EXPECT_EQ(reply->jobs(0).id(), a);
  EXPECT_EQ(reply->jobs(0).state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(reply->jobs(1).state(), v1::JOB_STATE_FAILED);
}

TEST_F(SchedulerTest, WaitTimesOutOnTheSchedulerClock) {
  SchedulerOptions options = TestOptions();
  options.heartbeat_timeout_ms = 3'600'000;  // the clock moves a lot here
  StartScheduler(options);
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());

  std::atomic<bool> abandon{false};
  v1::WaitJobsRequest request;
  request.add_job_ids(id);
  request.set_timeout_ms(500);
  auto waiting = std::async(std::launch::async, [&] {
    return scheduler_->Wait(request, [&] { return abandon.load(); });
  });
  // Real time alone never ends the wait.
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(300)),
            std::future_status::timeout);
  // Wait reads its deadline when it starts; move the clock until it passes.
  const bool returned = WaitUntil([&] {
    clock_.Advance(100);
    return waiting.wait_for(std::chrono::milliseconds(20)) ==
           std::future_status::ready;
  });
  if (!returned) {
    abandon = true;
    FAIL() << "Wait did not time out";
  }
  auto reply = waiting.get();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->timed_out());
  ASSERT_EQ(reply->jobs_size(), 1);
  EXPECT_EQ(reply->jobs(0).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerTest, WaitStopsWhenTheClientLeavesAndRejectsUnknownJobs) {
  StartScheduler();
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);

  v1::WaitJobsRequest request;
  request.add_job_ids(id);
  auto left = scheduler_->Wait(request, [] { return true; });
  EXPECT_EQ(left.status().code(), absl::StatusCode::kCancelled);

  request.add_job_ids(4242);
  auto unknown = scheduler_->Wait(request, [] { return true; });
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("4242"));
}

// ---- 10: placement order ----

TEST_F(SchedulerTest, LargeJobHoldsTheSlotsUntilItEnds) {
  StartScheduler();
  auto session = Connect("w1", 4);
  const int64_t big = Submit(4);
  const int64_t second = Submit(2);
  const int64_t third = Submit(2);
  auto big_start = session->WaitFor(IsStart(big, 1));
  ASSERT_TRUE(big_start.has_value());
  EXPECT_THAT(Devices(*big_start), ElementsAre(0, 1, 2, 3));

  v1::Job job = GetJob(second);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(job.wait_reason(),
              HasSubstr("waiting for 2 slots on 'local': 0 free"));
  job = GetJob(third);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(job.wait_reason(), HasSubstr("waiting for 2 slots on 'local'"));
  EXPECT_THAT(job.wait_reason(),
              HasSubstr(absl::StrCat("1 job ahead (#", second)));
  EXPECT_EQ(session->Matching(IsAnyStart(second)).size(), 0u);
  EXPECT_EQ(session->Matching(IsAnyStart(third)).size(), 0u);

  ReportEnded(session, big, 1, v1::JOB_STATE_FINISHED, 0);
  auto second_start = session->WaitFor(IsStart(second, 1));
  auto third_start = session->WaitFor(IsStart(third, 1));
  ASSERT_TRUE(second_start.has_value());
  ASSERT_TRUE(third_start.has_value());
  std::vector<int> devices = Devices(*second_start);
  for (int d : Devices(*third_start)) devices.push_back(d);
  EXPECT_THAT(devices, UnorderedElementsAre(0, 1, 2, 3));
  EXPECT_EQ(GetJob(second).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(GetJob(third).state(), v1::JOB_STATE_RUNNING);
}

}  // namespace
}  // namespace dlbatch::scheduler

// ---- faults: refused messages, restart grace, full disk, caps ----

namespace dlbatch::scheduler {
namespace {

v1::WorkerMessage DiaryMessage(int64_t job_id, int attempt,
                               const std::vector<std::string>& texts,
                               int64_t first_seq = 1) {
  v1::WorkerMessage m;
  v1::DiaryBatch* batch = m.mutable_diary();
  batch->set_job_id(job_id);
  batch->set_attempt(attempt);
  for (size_t i = 0; i < texts.size(); ++i) {
    v1::DiaryLine* line = batch->add_lines();
    line->set_seq(first_seq + static_cast<int64_t>(i));
    line->set_stream(1);
    line->set_text(texts[i]);
  }
  return m;
}

TEST_F(SchedulerTest, DiaryOfAnyBytesIsStoredExactly) {
  StartScheduler();
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());
  const std::string raw("\377\000x", 3);
  scheduler_->OnWorkerMessage(session, DiaryMessage(id, 1, {raw, "ok"}));
  ASSERT_TRUE(session->WaitFor(IsDiaryAck(id)).has_value());
  EXPECT_THAT(DiaryTexts(id), ElementsAre(raw, "ok"));
}

TEST_F(SchedulerTest, MessageTheStoreCannotTakeIsRefusedOnceNotResent) {
  StartScheduler();
  auto session = Connect("w1", 2);
  const int64_t bad = Submit(1);
  const int64_t good = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(bad, 1)).has_value());
  ASSERT_TRUE(session->WaitFor(IsStart(good, 1)).has_value());
  // Values longer than this are "too big" for the store: a failure tied to
  // the one message, not to the store.
  sqlite3_limit(store_->db()->raw(), SQLITE_LIMIT_LENGTH, 4096);
  scheduler_->OnWorkerMessage(
      session, DiaryMessage(bad, 1, {"kept?", std::string(10000, 'x')}));
  scheduler_->OnWorkerMessage(session, DiaryMessage(good, 1, {"fine"}));
  auto ack = session->WaitFor(IsDiaryAck(bad));
  ASSERT_TRUE(ack.has_value()) << "a refused batch must still be acknowledged";
  EXPECT_EQ(ack->diary_ack().seq(), 2);
  ASSERT_TRUE(session->WaitFor(IsDiaryAck(good)).has_value());
  // The refused batch is undone whole and said in the job's diary; the
  // other job's batch in the same transaction is stored.
  EXPECT_TRUE(DiaryMentions(bad, "could not be stored and were refused"));
  EXPECT_FALSE(DiaryMentions(bad, "kept?"));
  EXPECT_THAT(DiaryTexts(good), ElementsAre("fine"));
  EXPECT_FALSE(session->closed());
  // The link still works: the job ends normally.
  ReportEnded(session, bad, 1, v1::JOB_STATE_FINISHED, 0);
  EXPECT_EQ(GetJob(bad).state(), v1::JOB_STATE_FINISHED);
}

TEST_F(SchedulerTest, RestartGivesKnownWorkersTwiceTheTimeoutToReturn) {
  StartScheduler();
  auto before = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(before->WaitFor(IsStart(id, 1)).has_value());
  StopScheduler();
  StartScheduler();
  // Silent for 1.5 timeouts after the restart: still not lost.
  for (int i = 0; i < 30; ++i) {
    clock_.Advance(kHeartbeatTimeoutMs / 20);
    absl::SleepFor(absl::Milliseconds(3));
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_RUNNING);
  auto after = Connect("w1", 1, {Running(id, 1)});
  Barrier(after);
  EXPECT_EQ(after->Matching(IsAnyStart(id)).size(), 0u);
  ReportEnded(after, id, 1, v1::JOB_STATE_FINISHED, 0);
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(job.attempt(), 1);
}

TEST_F(SchedulerTest, DiaryPastTheCapKeepsFirstAndLastLinesAndSaysWhatWent) {
  SchedulerOptions options = TestOptions();
  options.max_diary_bytes = 100;  // 50 for the first lines, 50 for the last
  StartScheduler(options);
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());
  std::vector<std::string> texts;
  for (int i = 0; i < 40; ++i) texts.push_back(absl::StrFormat("line %03d", i));
  // In three batches, with a resend of the first in between.
  scheduler_->OnWorkerMessage(
      session, DiaryMessage(id, 1, {texts.begin(), texts.begin() + 15}));
  scheduler_->OnWorkerMessage(
      session,
      DiaryMessage(id, 1, {texts.begin() + 15, texts.begin() + 30}, 16));
  scheduler_->OnWorkerMessage(
      session, DiaryMessage(id, 1, {texts.begin(), texts.begin() + 15}));
  scheduler_->OnWorkerMessage(
      session, DiaryMessage(id, 1, {texts.begin() + 30, texts.end()}, 31));
  ASSERT_TRUE(
      WaitUntil([&] { return session->Matching(IsDiaryAck(id)).size() == 4; }));
  ReportEnded(session, id, 1, v1::JOB_STATE_FINISHED, 0);
  std::vector<std::string> read = DiaryTexts(id);
  // 8-byte lines: six fit the first half, six the last.
  ASSERT_EQ(read.size(), 13u) << absl::StrJoin(read, "\n");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(read[i], texts[i]);
  EXPECT_THAT(read[6], HasSubstr("28 lines (224 B, 224 bytes) of this diary "
                                 "were dropped here"));
  EXPECT_THAT(read[6], HasSubstr("--max-diary-bytes"));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(read[7 + i], texts[34 + i]);
}

TEST_F(SchedulerTest, FullDiskRefusesSubmitsDropsDiaryAndRecovers) {
  StartScheduler();
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());
  free_bytes_ = 10;     // under half the reserve
  clock_.Advance(100);  // past the loop's next check, within the timeout
  ASSERT_TRUE(WaitUntil([&] {
    auto reply = scheduler_->Submit(CommandJob(1));
    return !reply.ok() &&
           reply.status().code() == absl::StatusCode::kResourceExhausted;
  }));
  auto refused = scheduler_->Submit(CommandJob(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("the scheduler's disk is full"));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("resumes by itself"));
  // Diary lines are acknowledged (the link never blocks) but not kept.
  scheduler_->OnWorkerMessage(session, DiaryMessage(id, 1, {"a", "bb"}));
  ASSERT_TRUE(session->WaitFor(IsDiaryAck(id)).has_value());
  // Reads and the job's end still work.
  ReportEnded(session, id, 1, v1::JOB_STATE_FINISHED, 0);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_FINISHED);
  EXPECT_TRUE(DiaryMentions(id,
                            "2 diary lines (3 B) of this job were "
                            "dropped: the scheduler's disk was full"));
  EXPECT_FALSE(DiaryMentions(id, "bb"));

  free_bytes_ = 1 << 20;
  clock_.Advance(100);
  ASSERT_TRUE(
      WaitUntil([&] { return scheduler_->Submit(CommandJob(1)).ok(); }));
}

TEST_F(SchedulerTest, OutputsOverTheQuotaFailTheJobWithTheirSize) {
  SchedulerOptions options = TestOptions();
  options.max_output_bytes = 1000;
  StartScheduler(options);
  auto session = Connect("w1", 1);
  const int64_t id = Submit(1);
  auto start = session->WaitFor(IsStart(id, 1));
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->start().max_output_bytes(), 1000);
  v1::WorkerMessage m;
  v1::JobEnded* ended = m.mutable_ended();
  ended->set_job_id(id);
  ended->set_attempt(1);
  ended->set_state(v1::JOB_STATE_FINISHED);
  v1::OutputFile* f = ended->add_outputs();
  f->set_path("model.bin");
  f->set_size(4096);
  f->set_sha256(std::string(64, 'b'));
  scheduler_->OnWorkerMessage(session, std::move(m));
  ASSERT_TRUE(session->WaitFor(IsEndedAck(id, 1)).has_value());
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("4096 bytes"));
  EXPECT_THAT(job.reason(), HasSubstr("--max-output-bytes"));
}

TEST_F(SchedulerTest, PurgeDeletesEndedJobsOnlyAndRetentionByAge) {
  SchedulerOptions options = TestOptions();
  options.keep_ended_ms = 60'000;
  options.retention_interval_ms = 50;
  StartScheduler(options);
  auto session = Connect("w1", 1);
  const int64_t ended = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(ended, 1)).has_value());
  ReportEnded(session, ended, 1, v1::JOB_STATE_FINISHED, 0);
  const int64_t running = Submit(1);
  ASSERT_TRUE(session->WaitFor(IsStart(running, 1)).has_value());

  v1::PurgeJobsRequest request;
  request.add_job_ids(running);
  request.add_job_ids(12345);
  auto reply = scheduler_->admin().Purge(request);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->purged(), 0);
  ASSERT_EQ(reply->results_size(), 2);
  EXPECT_THAT(reply->results(0).error(), HasSubstr("cancel it first"));
  EXPECT_THAT(reply->results(1).error(), HasSubstr("no job 12345"));

  // The background task purges the ended job once it is old enough.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(scheduler_->GetJob(ended).ok());
  clock_.SetNowMs(clock_.NowMs() + 61'000);
  ASSERT_TRUE(WaitUntil([&] { return !scheduler_->GetJob(ended).ok(); }));
  EXPECT_TRUE(scheduler_->GetJob(running).ok());
}

// ---- fair share ----

// After alice has used the worker, bob's job submitted later starts before
// her next one: among equal priorities the user with less usage goes first.
TEST_F(SchedulerTest, FairShareStartsTheLessUsedUsersJobFirst) {
  StartScheduler();
  auto session = Connect("w1", 1);
  const int64_t first = Submit(1);  // alice's
  ASSERT_TRUE(session->WaitFor(IsStart(first, 1)).has_value());
  const int64_t alice_next = Submit(1);
  v1::SubmitJobRequest bob = CommandJob(1);
  bob.set_user("bob");
  auto bob_reply = scheduler_->Submit(bob);
  ASSERT_TRUE(bob_reply.ok()) << bob_reply.status();
  const int64_t bob_job = bob_reply->job_id();
  ASSERT_GT(bob_job, alice_next);
  clock_.Advance(60 * 1000);
  ReportEnded(session, first, 1, v1::JOB_STATE_FINISHED, 0);
  ASSERT_TRUE(session->WaitFor(IsStart(bob_job, 1)).has_value());
  EXPECT_TRUE(session->Matching(IsAnyStart(alice_next)).empty());
  EXPECT_EQ(GetJob(alice_next).state(), v1::JOB_STATE_QUEUED);
}

// A user at their slot limit waits, saying so, while others start; a submit
// past the queued limit is refused naming it; raising the limit starts the
// job.
TEST_F(SchedulerTest, UserLimitsHoldJobsBackAndSayWhy) {
  StartScheduler();
  auto session = Connect("w1", 4);
  UserLimit limit;
  limit.max_slots = 2;
  limit.max_queued = 1;
  ASSERT_TRUE(scheduler_->users().SetUserLimit("alice", "local", limit).ok());
  const int64_t first = Submit(2);
  ASSERT_TRUE(session->WaitFor(IsStart(first, 1)).has_value());
  const int64_t second = Submit(1);
  v1::Job waiting = GetJob(second);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.wait_reason(),
            "waiting: alice holds 2 of their 2 slots on 'local'");
  auto refused = scheduler_->Submit(CommandJob(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("alice has 1 of their 1 queued jobs on 'local'"));
  v1::SubmitJobRequest bob = CommandJob(1);
  bob.set_user("bob");
  auto bob_reply = scheduler_->Submit(bob);
  ASSERT_TRUE(bob_reply.ok()) << bob_reply.status();
  ASSERT_TRUE(session->WaitFor(IsStart(bob_reply->job_id(), 1)).has_value());
  ASSERT_EQ(scheduler_->users().UserLimits().size(), 1u);
  limit.max_slots = 3;
  ASSERT_TRUE(scheduler_->users().SetUserLimit("alice", "local", limit).ok());
  ASSERT_TRUE(session->WaitFor(IsStart(second, 1)).has_value());
}

// A worker started as root: the scheduler asks it about each user.
std::shared_ptr<FakeSession> ConnectRootWorker(Scheduler* scheduler,
                                               const std::string& name) {
  auto session = std::make_shared<FakeSession>();
  v1::WorkerMessage m;
  v1::Register* reg = m.mutable_register_();
  reg->set_name(name);
  reg->set_host("host-" + name);
  reg->set_profile("local");
  reg->add_devices()->set_kind("cpu");
  reg->set_runs_as_any_user(true);
  reg->set_user("root");
  scheduler->OnWorkerMessage(session, std::move(m));
  EXPECT_TRUE(session->WaitFor(IsRegistered()).has_value());
  return session;
}

void Answer(Scheduler* scheduler, const std::shared_ptr<FakeSession>& session,
            const std::string& user, bool known) {
  v1::WorkerMessage m;
  m.mutable_user_answer()->set_user(user);
  m.mutable_user_answer()->set_known(known);
  scheduler->OnWorkerMessage(session, std::move(m));
}

FakeSession::Predicate IsQuery(const std::string& user) {
  return [=](const Message& m) {
    return m.has_user_query() && m.user_query().user() == user;
  };
}

// The worker's machine knows alice only: her job runs there, a job of a
// user it does not know is refused at submit, naming the worker.
TEST_F(SchedulerTest, ARootWorkerIsAskedAboutEachUser) {
  StartScheduler();
  auto session = ConnectRootWorker(scheduler_.get(), "w1");
  std::atomic<bool> done{false};
  std::thread answers([&] {
    std::set<std::string> answered;
    while (!done) {
      for (const Message& m : session->Matching(
               [](const Message& m) { return m.has_user_query(); })) {
        const std::string& user = m.user_query().user();
        if (answered.insert(user).second) {
          Answer(scheduler_.get(), session, user, user == "alice");
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  const int64_t id = Submit(1);
  EXPECT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());
  v1::SubmitJobRequest ghost = CommandJob(1);
  ghost.set_user("ghost");
  auto refused = scheduler_->Submit(ghost);
  done = true;
  answers.join();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("no worker of profile 'local' runs ghost's jobs: 'w1' "
                        "has no user ghost"));
  // Each user is asked once per session.
  EXPECT_EQ(session->Matching(IsQuery("alice")).size(), 1u);
}

// A worker that does not answer holds a submit back briefly, never for
// good: the job is queued, says what it waits for, and starts once the
// answer comes.
TEST_F(SchedulerTest, AWorkerThatDoesNotAnswerDelaysASubmitOnlyBriefly) {
  StartScheduler();
  auto session = ConnectRootWorker(scheduler_.get(), "w1");
  const absl::Time before = absl::Now();
  const int64_t id = Submit(1);
  EXPECT_LT(absl::Now() - before, absl::Seconds(30));  // bounded, not hung
  ASSERT_TRUE(session->WaitFor(IsQuery("alice")).has_value());
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(job.wait_reason(),
              HasSubstr("no online worker runs alice's jobs ('w1' has not "
                        "said yet whether it knows alice)"));
  Answer(scheduler_.get(), session, "alice", true);
  EXPECT_TRUE(session->WaitFor(IsStart(id, 1)).has_value());
}

// A "no such user" is trusted for unknown_user_recheck_ms: a submit after
// it asks again, and finds an account added meanwhile.
TEST_F(SchedulerTest, AnUnknownUserIsAskedAgainLater) {
  SchedulerOptions options = TestOptions();
  options.heartbeat_timeout_ms = 3'600'000;  // the clock moves a lot here
  options.unknown_user_recheck_ms = 60'000;
  StartScheduler(options);
  auto session = ConnectRootWorker(scheduler_.get(), "w1");
  std::atomic<bool> known{false};
  std::atomic<bool> done{false};
  std::thread answers([&] {
    size_t handled = 0;
    while (!done) {
      auto queries = session->Matching(IsQuery("alice"));
      for (; handled < queries.size(); ++handled) {
        Answer(scheduler_.get(), session, "alice", known);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  auto refused = scheduler_->Submit(CommandJob(1));
  EXPECT_FALSE(refused.ok());
  refused = scheduler_->Submit(CommandJob(1));  // the answer still holds
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(session->Matching(IsQuery("alice")).size(), 1u);
  known = true;  // the account is added
  clock_.Advance(61'000);
  auto accepted = scheduler_->Submit(CommandJob(1));
  done = true;
  answers.join();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(session->Matching(IsQuery("alice")).size(), 2u);
  EXPECT_TRUE(session->WaitFor(IsStart(accepted->job_id(), 1)).has_value());
}

}  // namespace
}  // namespace dlbatch::scheduler
