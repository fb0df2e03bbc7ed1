// The worker's shell driven with fakes: a fake clock, a runner the test
// drives by hand, transfers that succeed or wait, and a transport the test
// answers as the scheduler. What the job table and the outbox decide is
// tested on them alone (job_table_test.cc, outbox_test.cc); these tests are
// of what only the shell does: carrying the decisions out, its threads,
// the link's connections, the files of a job's folder.
#include "worker/worker.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/worker/worker_fakes.h"
#include "worker/transfer_pool.h"

namespace dlbatch::worker {
namespace {

using Written = FakeTransport::Written;

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-worker-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    WorkerOptions o;
    o.name = "w1";
    o.host = "h";
    o.profile = "local";
    o.work_dir = dir_;
    o.tick_ms = 0;  // the test calls Tick()
    o.channel.endpoint.original = "unix:fake";
    o.channel.endpoint.is_unix = true;
    o.channel.endpoint.path = "fake";
    v1::Device d;
    d.set_kind("cpu");
    o.devices.push_back(d);
    Customize(&o);
    worker_ = std::make_unique<Worker>(o, &clock_, &runner_, &transfers_,
                                       &transport_);
    run_ = std::thread([this] {
      run_status_ = worker_->Run();
      run_returned_ = true;
    });
    ASSERT_TRUE(Eventually([&] { return worker_->connected(); }));
  }
  // A fixture's own changes to the worker's options.
  virtual void Customize(WorkerOptions*) {}
  void TearDown() override {
    worker_->Shutdown();
    run_.join();
    worker_.reset();
    std::filesystem::remove_all(dir_);
  }

  static v1::StartJob Start(int64_t id, int64_t time_limit_s = 0) {
    v1::StartJob s;
    s.set_job_id(id);
    s.set_attempt(1);
    s.set_pool(1);
    s.add_devices(0);
    s.mutable_spec()->mutable_command()->add_argv("true");
    s.mutable_spec()->set_time_limit_s(time_limit_s);
    return s;
  }
  // A train job: its channel is the trainer's (a command job's is
  // $DLBATCH_PROGRESS, read differently).
  static v1::StartJob TrainStart(int64_t id) {
    v1::StartJob s = Start(id);
    s.mutable_spec()->clear_command();
    s.mutable_spec()->mutable_train();
    return s;
  }
  void Send(const v1::StartJob& s) {
    v1::SchedulerMessage m;
    *m.mutable_start() = s;
    transport_.Send(m);
  }
  void Cancel(int64_t id, const std::string& reason = "asked") {
    v1::SchedulerMessage m;
    m.mutable_cancel()->set_job_id(id);
    m.mutable_cancel()->set_attempt(1);
    m.mutable_cancel()->set_grace_ms(3000);
    m.mutable_cancel()->set_reason(reason);
    transport_.Send(m);
  }
  void AckDiary(int64_t id, int64_t seq) {
    v1::SchedulerMessage m;
    m.mutable_diary_ack()->set_job_id(id);
    m.mutable_diary_ack()->set_attempt(1);
    m.mutable_diary_ack()->set_seq(seq);
    transport_.Send(m);
  }
  void AckEnded(int64_t id) {
    v1::SchedulerMessage m;
    m.mutable_ended_ack()->set_job_id(id);
    m.mutable_ended_ack()->set_attempt(1);
    transport_.Send(m);
  }
  // The end report of job `id`, waiting for it.
  std::optional<v1::JobEnded> Ended(int64_t id) {
    auto w = transport_.WaitFor([&](const Written& w) {
      return w.message.has_ended() && w.message.ended().job_id() == id;
    });
    if (!w) return std::nullopt;
    return w->message.ended();
  }
  // Diary lines of `id` written so far, in order (with repeats).
  std::vector<v1::DiaryLine> Lines(int64_t id, int connection = 0) {
    std::vector<v1::DiaryLine> out;
    for (const auto& w : transport_.written()) {
      if (!w.message.has_diary() || w.message.diary().job_id() != id) continue;
      if (connection != 0 && w.connection != connection) continue;
      for (const auto& l : w.message.diary().lines()) out.push_back(l);
    }
    return out;
  }
  bool HasLine(int64_t id, const std::string& part) {
    for (const auto& l : Lines(id)) {
      if (l.text().find(part) != std::string::npos) return true;
    }
    return false;
  }
  std::optional<JobPhase> Phase(int64_t id) {
    return worker_->Phase(JobRef{id, 1, 0});
  }
  // The trainer's argv for a train job (an empty train: section) that the
  // worker starts as job `id`; empty if it starts none.
  std::vector<std::string> TrainerArgv(int64_t id) {
    v1::StartJob s = Start(id);
    s.mutable_spec()->mutable_train();
    Send(s);
    std::optional<int64_t> key = runner_.WaitStart(id);
    if (!key.has_value()) return {};
    return runner_.Options(*key).argv;
  }

  std::string dir_;
  FakeClock clock_;
  FakeRunner runner_;
  FakeTransfers transfers_;
  FakeTransport transport_;
  std::unique_ptr<Worker> worker_;
  std::thread run_;
  absl::Status run_status_;
  std::atomic<bool> run_returned_{false};
};

TEST_F(WorkerTest, StartLinesExitUploadEndedAck) {
  Send(Start(7));
  std::optional<int64_t> key = runner_.WaitStart(7);
  ASSERT_TRUE(key.has_value());
  SubprocessOptions o = runner_.Options(*key);
  EXPECT_EQ(o.argv, std::vector<std::string>{"true"});
  EXPECT_EQ(o.cwd, dir_ + "/jobs/7-1-0");
  EXPECT_TRUE(std::filesystem::is_directory(o.cwd + "/output"));
  EXPECT_EQ(Phase(7), JobPhase::kPreparing);

  runner_.Started(*key);
  EXPECT_EQ(Phase(7), JobPhase::kRunning);
  runner_.Line(*key, 1, "hello");
  runner_.Line(*key, 2, "world");
  runner_.Exit(*key, 0);

  std::optional<v1::JobEnded> ended = Ended(7);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(ended->exit_code(), 0);
  EXPECT_EQ(ended->last_seq(), 2);
  ASSERT_EQ(ended->outputs_size(), 1);
  EXPECT_EQ(ended->outputs(0).path(), "result.txt");
  EXPECT_EQ(Phase(7), JobPhase::kEnded);

  // The lines came before the report, in order, with their streams.
  std::vector<Written> all = transport_.written();
  size_t ended_at = 0, lines_at = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].message.has_ended()) ended_at = i;
    if (all[i].message.has_diary()) lines_at = i;
  }
  EXPECT_LT(lines_at, ended_at);
  std::vector<v1::DiaryLine> lines = Lines(7);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].seq(), 1);
  EXPECT_EQ(lines[0].text(), "hello");
  EXPECT_EQ(lines[1].stream(), 2);

  AckDiary(7, 2);
  AckEnded(7);
  EXPECT_TRUE(Eventually([&] { return !Phase(7).has_value(); }));
  EXPECT_TRUE(Eventually(
      [&] { return !std::filesystem::exists(dir_ + "/jobs/7-1-0"); }));
  EXPECT_EQ(worker_->Unacked(JobRef{7, 1, 0}), 0u);
}

TEST_F(WorkerTest, CancelWhilePreparingEndsWithoutAProcess) {
  transfers_.SetFetchOpen(false);
  v1::StartJob s = Start(10);
  auto* a = s.mutable_spec()->add_attach();
  a->set_path("data.bin");
  a->set_sha256("ff");
  Send(s);
  ASSERT_TRUE(Eventually([&] { return Phase(10).has_value(); }));
  Cancel(10, "user asked");
  ASSERT_TRUE(Eventually([&] { return HasLine(10, "user asked"); }));
  EXPECT_EQ(Phase(10), JobPhase::kPreparing);
  transfers_.SetFetchOpen(true);
  std::optional<v1::JobEnded> ended = Ended(10);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "user asked");
  EXPECT_EQ(ended->exit_code(), -1);
  EXPECT_EQ(runner_.starts(), 0u);
}

TEST_F(WorkerTest, CancelWhileRunningTerminatesAndReportsCancelled) {
  Send(Start(12));
  std::optional<int64_t> key = runner_.WaitStart(12);
  ASSERT_TRUE(key.has_value());
  runner_.Started(*key);
  Cancel(12, "enough");
  ASSERT_TRUE(Eventually([&] { return !runner_.terminates().empty(); }));
  EXPECT_EQ(runner_.terminates()[0], (std::pair<int64_t, int64_t>{*key, 3000}));
  // A second cancel changes nothing.
  Cancel(12, "again");
  runner_.Killed(*key, 15);
  std::optional<v1::JobEnded> ended = Ended(12);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "enough");
  EXPECT_EQ(ended->exit_code(), 128 + 15);
  EXPECT_EQ(runner_.terminates().size(), 1u);
  EXPECT_FALSE(HasLine(12, "again"));
}

TEST_F(WorkerTest, ReconnectReplaysUnackedLinesAndTheReport) {
  Send(Start(20));
  std::optional<int64_t> key = runner_.WaitStart(20);
  ASSERT_TRUE(key.has_value());
  runner_.Started(*key);
  for (int i = 1; i <= 3; ++i)
    runner_.Line(*key, 1, "line " + std::to_string(i));
  ASSERT_TRUE(Eventually([&] { return Lines(20, 1).size() == 3; }));
  AckDiary(20, 1);
  ASSERT_TRUE(Eventually([&] {
    return worker_->Unacked(JobRef{20, 1, 0}) == 2;
  }));

  // The scheduler goes away; lines and the end come meanwhile.
  transport_.Break(/*reachable=*/false);
  ASSERT_TRUE(Eventually([&] { return !worker_->connected(); }));
  runner_.Line(*key, 1, "line 4");
  runner_.Exit(*key, 0);
  ASSERT_TRUE(Eventually([&] { return Phase(20) == JobPhase::kEnded; }));
  transport_.SetReachable(true);

  // The new registration names the job; lines 2-4 and the report follow.
  auto reg = transport_.WaitFor([](const Written& w) {
    return w.connection == 2 && w.message.has_register_();
  });
  ASSERT_TRUE(reg.has_value());
  ASSERT_EQ(reg->message.register_().running_size(), 1);
  EXPECT_EQ(reg->message.register_().running(0).job_id(), 20);
  auto ended = transport_.WaitFor([](const Written& w) {
    return w.connection == 2 && w.message.has_ended();
  });
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->message.ended().last_seq(), 4);
  std::vector<v1::DiaryLine> again = Lines(20, 2);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(again[0].seq(), 2);
  EXPECT_EQ(again[2].text(), "line 4");

  // Acknowledged, the job is forgotten and not registered again.
  AckDiary(20, 4);
  AckEnded(20);
  ASSERT_TRUE(Eventually([&] { return !Phase(20).has_value(); }));
  transport_.Break(/*reachable=*/true);
  auto reg3 = transport_.WaitFor([](const Written& w) {
    return w.connection == 3 && w.message.has_register_();
  });
  ASSERT_TRUE(reg3.has_value());
  EXPECT_EQ(reg3->message.register_().running_size(), 0);
}

TEST_F(WorkerTest, TimeLimitStopsTheJobAndFailsIt) {
  Send(Start(30, /*time_limit_s=*/5));
  std::optional<int64_t> key = runner_.WaitStart(30);
  ASSERT_TRUE(key.has_value());
  runner_.Started(*key);
  clock_.Advance(4999);
  worker_->Tick();
  EXPECT_TRUE(runner_.terminates().empty());
  clock_.Advance(1);
  worker_->Tick();
  ASSERT_EQ(runner_.terminates().size(), 1u);
  EXPECT_EQ(runner_.terminates()[0].second, JobTable::kTimeLimitGraceMs);
  worker_->Tick();  // once only
  EXPECT_EQ(runner_.terminates().size(), 1u);
  ASSERT_TRUE(Eventually([&] { return HasLine(30, "time limit 5s reached"); }));
  runner_.Killed(*key, 15);
  std::optional<v1::JobEnded> ended = Ended(30);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "time limit 5s reached");
}

// A job whose outputs take long to upload delays no other job's end.
TEST_F(WorkerTest, OneJobsSlowUploadDoesNotDelayAnothersEnd) {
  transfers_.HoldUploadsOf("/jobs/50-");
  Send(Start(50));
  Send(Start(51));
  std::optional<int64_t> slow = runner_.WaitStart(50);
  std::optional<int64_t> quick = runner_.WaitStart(51);
  ASSERT_TRUE(slow && quick);
  runner_.Started(*slow);
  runner_.Started(*quick);
  runner_.Exit(*slow, 0);
  ASSERT_TRUE(Eventually([&] { return transfers_.uploads() == 1; }));
  runner_.Line(*quick, 1, "ok");
  runner_.Exit(*quick, 0);
  std::optional<v1::JobEnded> ended = Ended(51);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(Phase(50), JobPhase::kFinishing);
  transfers_.HoldUploadsOf("");
  ASSERT_TRUE(Ended(50).has_value());
}

// The trainer's channel: progress goes to the scheduler, a checkpoint is
// stored (its files linked and uploaded) and announced.
TEST_F(WorkerTest, ChannelProgressAndCheckpointReachTheScheduler) {
  Send(TrainStart(60));
  std::optional<int64_t> key = runner_.WaitStart(60);
  ASSERT_TRUE(key.has_value());
  const std::string out = runner_.Options(*key).cwd + "/output/";
  std::ofstream(out + "checkpoint.dlbc") << "weights";
  std::ofstream(out + "training_history.csv") << "iteration,loss\n";
  runner_.Started(*key);
  runner_.Line(*key, JobTable::kChannelStream,
               R"({"iteration":"100","checkpoint_iteration":"100"})");
  auto stored = transport_.WaitFor(
      [](const Written& w) { return w.message.has_checkpoint(); });
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->message.checkpoint().iteration(), 100);
  ASSERT_EQ(stored->message.checkpoint().files_size(), 2);
  EXPECT_EQ(stored->message.checkpoint().files(0).path(), "checkpoint.dlbc");
  runner_.Line(*key, JobTable::kChannelStream,
               R"({"iteration":"100","checkpoint_iteration":"100",)"
               R"("done":true})");
  auto progress = transport_.WaitFor(
      [](const Written& w) { return w.message.has_progress(); });
  ASSERT_TRUE(progress.has_value());
  EXPECT_TRUE(progress->message.progress().progress().done());
  // Channel lines are not diary lines.
  EXPECT_TRUE(Lines(60).empty());
}

// A checkpoint file the job's side replaced by a symlink (a process of the
// same user may write the output folder) is not followed with the
// worker's powers: the checkpoint is not stored, and the diary says why.
TEST_F(WorkerTest, ACheckpointFileThatIsALinkIsNotFollowed) {
  Send(TrainStart(62));
  std::optional<int64_t> key = runner_.WaitStart(62);
  ASSERT_TRUE(key.has_value());
  const std::string out = runner_.Options(*key).cwd + "/output/";
  const std::string secret = dir_ + "/secret";
  std::ofstream(secret) << "not the job's";
  ASSERT_EQ(::symlink(secret.c_str(), (out + "checkpoint.dlbc").c_str()), 0);
  std::ofstream(out + "training_history.csv") << "iteration,loss\n";
  runner_.Started(*key);
  runner_.Line(*key, JobTable::kChannelStream,
               R"({"iteration":"100","checkpoint_iteration":"100"})");
  ASSERT_TRUE(Eventually([&] {
    return HasLine(62, "could not store the checkpoint of iteration 100") &&
           HasLine(62, "checkpoint.dlbc is not a regular file");
  }));
  for (const auto& w : transport_.written())
    EXPECT_FALSE(w.message.has_checkpoint());
}

// A preempting CancelJob reaches the runner with its signal and grace; the
// end report waits for the checkpoint announced before the exit to be
// stored, and the scheduler gets the checkpoint first.
TEST_F(WorkerTest, APreemptedJobIsSignalledAndEndsAfterItsCheckpoint) {
  Send(TrainStart(61));
  std::optional<int64_t> key = runner_.WaitStart(61);
  ASSERT_TRUE(key.has_value());
  const std::string out = runner_.Options(*key).cwd + "/output/";
  std::ofstream(out + "checkpoint.dlbc") << "weights";
  std::ofstream(out + "training_history.csv") << "iteration,loss\n";
  runner_.Started(*key);
  v1::SchedulerMessage m;
  v1::CancelJob* c = m.mutable_cancel();
  c->set_job_id(61);
  c->set_attempt(1);
  c->set_grace_ms(120000);
  c->set_reason("preempted by job 7 (priority 10)");
  c->set_preempt(true);
  c->set_signal(SIGUSR2);
  transport_.Send(m);
  ASSERT_TRUE(Eventually([&] { return !runner_.terminates().empty(); }));
  EXPECT_EQ(runner_.terminates()[0],
            (std::pair<int64_t, int64_t>{*key, 120000}));
  // A trainer gets its own stop signal whatever the cancel names.
  EXPECT_EQ(runner_.terminate_signals(), std::vector<int>{SIGUSR1});
  ASSERT_TRUE(Eventually([&] {
    return HasLine(61,
                   "[dlbatch] preempted by job 7 (priority 10): checkpointing "
                   "and stopping (SIGUSR1; killed in 2m00s if still running)");
  }));

  // Two checkpoints while the first is being stored: the second is stored
  // after the outputs are uploaded (one transfer of a job at a time), and
  // the end waits for it.
  transfers_.SetFileOpen(false);
  runner_.Line(*key, JobTable::kChannelStream,
               R"({"iteration":"1000","checkpoint_iteration":"1000"})");
  runner_.Line(*key, JobTable::kChannelStream,
               R"({"iteration":"1400","checkpoint_iteration":"1400"})");
  runner_.Exit(*key, 0);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Phase(61), JobPhase::kFinishing);
  transfers_.SetFileOpen(true);

  std::optional<v1::JobEnded> ended = Ended(61);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "preempted by job 7 (priority 10)");
  std::vector<Written> all = transport_.written();
  size_t newest_at = all.size(), ended_at = all.size();
  for (size_t i = 0; i < all.size(); ++i) {
    const v1::WorkerMessage& w = all[i].message;
    if (w.has_checkpoint() && w.checkpoint().iteration() == 1400 &&
        newest_at == all.size())
      newest_at = i;
    if (w.has_ended() && ended_at == all.size()) ended_at = i;
  }
  ASSERT_LT(newest_at, all.size()) << "the newest checkpoint was not stored";
  EXPECT_LT(newest_at, ended_at) << "the end came before the checkpoint";
}

// The signal thread and Run() both stop the worker. Whichever comes second
// must not return while the first is still stopping the runner: main()
// destroys the runner next (once, a second join of its thread hung a
// worker on SIGTERM for good).
TEST_F(WorkerTest, RunReturnsOnlyOnceAShutdownUnderWayHasStoppedTheRunner) {
  runner_.SetShutdownOpen(false);
  std::thread stopper([&] { worker_->Shutdown(); });
  ASSERT_TRUE(Eventually([&] { return runner_.shutdowns() == 1; }));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(run_returned_.load());
  runner_.SetShutdownOpen(true);
  stopper.join();
  ASSERT_TRUE(Eventually([&] { return run_returned_.load(); }));
  EXPECT_EQ(runner_.shutdowns(), 1);
}

// A Slurm profile's ephemeral worker, serving job 5 attempt 1.
class SlurmWorkerTest : public WorkerTest {
 protected:
  void Customize(WorkerOptions* o) override {
    v1::SlurmJob job;
    job.set_job_id(5);
    job.set_attempt(1);
    job.set_slurm_job_id(900);
    job.set_node_index(1);
    job.set_nodes(2);
    o->slurm_job = job;
  }
};

TEST_F(SlurmWorkerTest, SaysWhichJobItServesAndLeavesOnceItsEndIsAcked) {
  auto reg = transport_.WaitFor(
      [](const Written& w) { return w.message.has_register_(); });
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->message.register_().slurm().job_id(), 5);
  EXPECT_EQ(reg->message.register_().slurm().slurm_job_id(), 900);
  EXPECT_EQ(reg->message.register_().slurm().node_index(), 1);

  Send(Start(5));
  std::optional<int64_t> key = runner_.WaitStart(5);
  ASSERT_TRUE(key.has_value());
  runner_.Started(*key);
  runner_.Line(*key, 1, "on node 2");
  runner_.Exit(*key, 0);
  ASSERT_TRUE(Ended(5).has_value());
  // Still there until the scheduler has the end for sure.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(run_returned_.load());
  AckDiary(5, 1);
  AckEnded(5);
  EXPECT_TRUE(Eventually([&] { return run_returned_.load(); }));
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  EXPECT_GE(runner_.shutdowns(), 1);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/jobs/5-1-0"));
}

bool Has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

// Slurm signals a Slurm job's processes as well as its worker (its own
// preemption, scancel, the time limit): the trainer there takes SIGTERM as
// a checkpoint-and-stop, as it takes the worker's own request.
TEST_F(SlurmWorkerTest, StartsTrainersThatTakeSigtermAsAStopRequest) {
  const std::vector<std::string> argv = TrainerArgv(5);
  ASSERT_FALSE(argv.empty());
  EXPECT_TRUE(Has(argv, "--stop-on-term")) << absl::StrJoin(argv, " ");
}

// Elsewhere SIGTERM stops a trainer at once (the worker asks for a
// checkpoint with kTrainerStopSignal).
TEST_F(WorkerTest, StartsTrainersThatStopAtOnceOnSigtermOutsideSlurm) {
  const std::vector<std::string> argv = TrainerArgv(8);
  ASSERT_FALSE(argv.empty());
  EXPECT_TRUE(Has(argv, "--spec-binary")) << absl::StrJoin(argv, " ");
  EXPECT_FALSE(Has(argv, "--stop-on-term")) << absl::StrJoin(argv, " ");
}

// A worker whose GPUs are read (NVML in the daemon; a counter here).
class GpuWorkerTest : public WorkerTest {
 protected:
  void Customize(WorkerOptions* o) override {
    o->read_gpus = [this] {
      v1::GpuReading g;
      g.set_index(0);
      g.set_uuid("GPU-x");
      g.set_utilization_percent(++reads_);
      g.set_memory_used_bytes(1 << 20);
      g.set_memory_total_bytes(int64_t{16} << 30);
      return std::vector<v1::GpuReading>{g};
    };
  }
  std::atomic<int> reads_{0};
};

TEST_F(GpuWorkerTest, SendsItsGpusOnAHeartbeatAtOnceAndThenEveryFewSeconds) {
  auto gpus = [](const Written& w) {
    return w.message.has_heartbeat() && w.message.heartbeat().gpus_size() == 1;
  };
  auto first = transport_.WaitFor(gpus);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->message.heartbeat().gpus(0).uuid(), "GPU-x");
  EXPECT_EQ(first->message.heartbeat().gpus(0).memory_total_bytes(),
            int64_t{16} << 30);
  // The fake clock stands still: not read again, however long it waits.
  absl::SleepFor(absl::Milliseconds(50));
  const int reads = reads_;
  EXPECT_EQ(reads, 1);
  clock_.Advance(1000);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(reads_, 1) << "read again before LinkOptions::gpu_report_ms";
  clock_.Advance(2000);
  ASSERT_TRUE(Eventually([&] { return reads_ >= 2; }));
  ASSERT_TRUE(Eventually([&] {
    for (const Written& w : transport_.written()) {
      if (gpus(w) && w.message.heartbeat().gpus(0).utilization_percent() == 2)
        return true;
    }
    return false;
  }));
}

TEST(TransferPoolTest, AJobsLongTransferDoesNotDelayAnother) {
  TransferPool pool(4);
  absl::Mutex mu;
  bool release = false;
  bool other_ran = false;
  pool.Post(1, [&] {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&release));
  });
  pool.Post(1, [] {});  // behind job 1's first: waits for it
  pool.Post(2, [&] {
    absl::MutexLock lock(&mu);
    other_ran = true;
  });
  EXPECT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return other_ran;
  }));
  EXPECT_EQ(pool.pending(), 2u);  // job 1's two
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  EXPECT_TRUE(Eventually([&] { return pool.pending() == 0; }));
}

}  // namespace
}  // namespace dlbatch::worker
