// The stored checkpoints a job keeps, in the scheduler: the newest few of
// each part, shown by GetJob, counted against the output quota, and given
// back to a later attempt (with `checkpoint: per-part` each part its own of
// the newest step every part stored). A real store and blob store in a
// temp dir, a fake clock and fake worker sessions, as scheduler_test.cc.
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "tests/common/fake_clock.h"
#include "tests/scheduler/fake_session.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Message = v1::SchedulerMessage;

constexpr int64_t kHeartbeatTimeoutMs = 1000;

bool WaitUntil(const std::function<bool()>& ready) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!ready()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

FakeSession::Predicate IsStart(int64_t job_id, int attempt) {
  return [=](const Message& m) {
    return m.has_start() && m.start().job_id() == job_id &&
           m.start().attempt() == attempt;
  };
}

// "part/iteration" of each kept checkpoint GetJob lists, "*" after the
// ones a resume uses.
std::vector<std::string> Listed(const v1::Job& job) {
  std::vector<std::string> out;
  for (const auto& k : job.checkpoints()) {
    out.push_back(
        absl::StrCat(k.part(), "/", k.iteration(), k.resume() ? "*" : ""));
  }
  return out;
}

class CheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dlbatch_ckpt_XXXXXX")
            .string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    Stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Start(int64_t max_output_bytes = 0) {
    const std::string db = dir_ + "/state.db";
    auto store = Store::Open(db, /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    reader_ = std::make_unique<StoreReader>(db);
    auto blobs = BlobStore::Open(dir_ + "/blobs", /*min_free_bytes=*/0);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = std::move(*blobs);
    SchedulerOptions options;
    options.heartbeat_interval_ms = 100;
    options.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
    options.max_attempts = 5;
    options.max_output_bytes = max_output_bytes;
    scheduler_ = std::make_unique<Scheduler>(store_.get(), reader_.get(),
                                             blobs_.get(), &clock_, options);
    ASSERT_TRUE(scheduler_->Start().ok());
  }
  void Stop() {
    if (scheduler_) scheduler_->Stop();
    scheduler_.reset();
    reader_.reset();
    blobs_.reset();
    store_.reset();
  }

  std::shared_ptr<FakeSession> Connect(const std::string& name) {
    auto session = std::make_shared<FakeSession>();
    v1::WorkerMessage m;
    v1::Register* reg = m.mutable_register_();
    reg->set_name(name);
    reg->set_host("host-" + name);
    reg->set_profile("local");
    v1::Device* d = reg->add_devices();
    d->set_index(0);
    d->set_kind("cpu");
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(
        session->WaitFor([](const Message& r) { return r.has_registered(); })
            .has_value());
    return session;
  }

  // A command job of `pool` slots over as many workers (one slot each).
  int64_t Submit(int pool, const std::string& checkpoint) {
    v1::SubmitJobRequest request;
    request.set_user("alice");
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name("ckpt");
    spec->set_profile("local");
    spec->set_pool(pool);
    spec->set_max_nodes(pool);
    spec->set_checkpoint(checkpoint);
    spec->mutable_command()->add_argv("true");
    auto reply = scheduler_->Submit(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->job_id() : -1;
  }

  // `bytes` stored as a blob, as a worker's upload leaves it.
  v1::OutputFile Blob(const std::string& path, const std::string& bytes) {
    auto writer = blobs_->NewWriter("", static_cast<int64_t>(bytes.size()));
    EXPECT_TRUE(writer.ok()) << writer.status();
    EXPECT_TRUE((*writer)->Append(bytes).ok());
    EXPECT_TRUE((*writer)->Commit().ok());
    v1::OutputFile f;
    f.set_path(path);
    f.set_size(static_cast<int64_t>(bytes.size()));
    f.set_sha256((*writer)->sha256());
    f.set_mode(0644);
    return f;
  }

  // Part `part` of attempt `attempt` reports its checkpoint of `step`: one
  // file naming both, stored first. Returns once the scheduler handled it.
  void Report(const std::shared_ptr<FakeSession>& session, int64_t id,
              int attempt, int part, int64_t step,
              const std::string& bytes = "") {
    v1::WorkerMessage m;
    v1::CheckpointStored* c = m.mutable_checkpoint();
    c->set_job_id(id);
    c->set_attempt(attempt);
    c->set_part(part);
    c->set_iteration(step);
    *c->add_files() = Blob(
        absl::StrCat("part", part, ".txt"),
        bytes.empty() ? absl::StrCat("part ", part, " step ", step) : bytes);
    scheduler_->OnWorkerMessage(session, std::move(m));
    Barrier(session);
  }

  // Every message posted on `session` before it has been handled.
  void Barrier(const std::shared_ptr<FakeSession>& session) {
    const int64_t marker = -(++barriers_);
    v1::WorkerMessage m;
    m.mutable_diary()->set_job_id(marker);
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(session
                    ->WaitFor([&](const Message& r) {
                      return r.has_diary_ack() &&
                             r.diary_ack().job_id() == marker;
                    })
                    .has_value());
  }

  v1::Job GetJob(int64_t id) {
    auto job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  bool DiaryMentions(int64_t id, const std::string& text) {
    bool found = false;
    v1::ReadDiaryRequest request;
    request.set_job_id(id);
    absl::Status s = scheduler_->ReadDiary(
        request,
        [&](const v1::DiaryChunk& chunk) {
          for (const auto& line : chunk.lines())
            found = found || line.text().find(text) != std::string::npos;
          return true;
        },
        [] { return false; });
    EXPECT_TRUE(s.ok()) << s;
    return found;
  }

  // Both workers fall silent and are lost; the job is queued again.
  void LoseWorkers(int64_t id) {
    clock_.Advance(kHeartbeatTimeoutMs + 500);
    ASSERT_TRUE(WaitUntil([&] {
      auto job = scheduler_->GetJob(id);
      return job.ok() && job->state() == v1::JOB_STATE_QUEUED;
    }));
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t barriers_ = 0;
};

// Part 0 speaks for the job: its newest three are kept, the newest is the
// one resumed from, and `show` lists them (after a restart too).
TEST_F(CheckpointsTest, TheNewestThreeAreKeptAndShown) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto w1 = Connect("w1");
  auto w2 = Connect("w2");
  const int64_t id = Submit(2, "");
  auto s1 = w1->WaitFor(IsStart(id, 1));
  ASSERT_TRUE(s1.has_value());
  ASSERT_TRUE(w2->WaitFor(IsStart(id, 1)).has_value());
  auto part0 = s1->start().part() == 0 ? w1 : w2;
  auto part1 = s1->start().part() == 0 ? w2 : w1;
  for (int64_t step : {10, 20, 30, 40, 50})
    ASSERT_NO_FATAL_FAILURE(Report(part0, id, 1, 0, step));
  // Another part's, and an older resend, change nothing.
  ASSERT_NO_FATAL_FAILURE(Report(part1, id, 1, 1, 60));
  ASSERT_NO_FATAL_FAILURE(Report(part0, id, 1, 0, 20));
  v1::Job job = GetJob(id);
  EXPECT_THAT(Listed(job), ElementsAre("0/30", "0/40", "0/50*"));
  ASSERT_EQ(job.checkpoint_size(), 1);
  EXPECT_EQ(job.checkpoint(0).path(), "part0.txt");
  EXPECT_EQ(job.checkpoints(2).files(0).sha256(), job.checkpoint(0).sha256());
  EXPECT_EQ(job.checkpoints(2).attempt(), 1);
  EXPECT_EQ(job.progress().checkpoint_iteration(), 50);
  // Kept across a restart, from the store alone.
  Stop();
  ASSERT_NO_FATAL_FAILURE(Start());
  EXPECT_THAT(Listed(GetJob(id)), ElementsAre("0/30", "0/40", "0/50*"));
}

// Each part stores its own; a resume takes the newest step all stored, and
// each part's start carries its own files of it.
TEST_F(CheckpointsTest, PerPartResumesEachPartFromItsOwnOfTheNewestCommonStep) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto w1 = Connect("w1");
  auto w2 = Connect("w2");
  const int64_t id = Submit(2, "per-part");
  auto s1 = w1->WaitFor(IsStart(id, 1));
  ASSERT_TRUE(s1.has_value());
  auto part0 = s1->start().part() == 0 ? w1 : w2;
  auto part1 = s1->start().part() == 0 ? w2 : w1;
  // Part 0 races ahead to 40 while part 1 reaches 10: 10 is what a resume
  // needs, so part 0 keeps it beside its newest two.
  ASSERT_NO_FATAL_FAILURE(Report(part1, id, 1, 1, 10));
  for (int64_t step : {10, 20, 30, 40})
    ASSERT_NO_FATAL_FAILURE(Report(part0, id, 1, 0, step));
  EXPECT_THAT(Listed(GetJob(id)),
              ElementsAre("0/10*", "0/30", "0/40", "1/10*"));
  EXPECT_EQ(GetJob(id).progress().checkpoint_iteration(), 10);
  // Part 1 catches up to 30: the common step moves, 10 may go.
  ASSERT_NO_FATAL_FAILURE(Report(part1, id, 1, 1, 20));
  ASSERT_NO_FATAL_FAILURE(Report(part1, id, 1, 1, 30));
  v1::Job job = GetJob(id);
  EXPECT_THAT(Listed(job),
              ElementsAre("0/10", "0/30*", "0/40", "1/10", "1/20", "1/30*"));
  EXPECT_EQ(job.progress().checkpoint_iteration(), 30);
  ASSERT_EQ(job.checkpoint_size(), 1);
  EXPECT_EQ(job.checkpoint(0).path(), "part0.txt");

  ASSERT_NO_FATAL_FAILURE(LoseWorkers(id));
  auto w3 = Connect("w3");
  auto w4 = Connect("w4");
  auto a = w3->WaitFor(IsStart(id, 2));
  auto b = w4->WaitFor(IsStart(id, 2));
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(b.has_value());
  for (const auto& start : {a->start(), b->start()}) {
    EXPECT_EQ(start.checkpoint_iteration(), 30) << start.part();
    ASSERT_EQ(start.checkpoint_size(), 1) << start.part();
    EXPECT_EQ(start.checkpoint(0).path(),
              absl::StrCat("part", start.part(), ".txt"));
  }
  // Their own bytes: the blobs of "part N step 30".
  const v1::Job now = GetJob(id);
  for (const auto& start : {a->start(), b->start()}) {
    for (const auto& k : now.checkpoints()) {
      if (k.part() == start.part() && k.iteration() == 30) {
        EXPECT_EQ(k.files(0).sha256(), start.checkpoint(0).sha256());
      }
    }
  }
  // Part 0's 40 belongs to a run no attempt continues: gone.
  EXPECT_THAT(Listed(now),
              ElementsAre("0/10", "0/30*", "1/10", "1/20", "1/30*"));
  EXPECT_TRUE(DiaryMentions(
      id,
      "resumes from the checkpoint stored at step 30 (by attempt 1), "
      "each part from its own"));
}

// A per-part job whose parts never stored one step in common starts
// afresh, saying why, and leaves the stored ones behind.
TEST_F(CheckpointsTest, PerPartWithoutACommonStepStartsAfresh) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto w1 = Connect("w1");
  auto w2 = Connect("w2");
  const int64_t id = Submit(2, "per-part");
  auto s1 = w1->WaitFor(IsStart(id, 1));
  ASSERT_TRUE(s1.has_value());
  auto part0 = s1->start().part() == 0 ? w1 : w2;
  ASSERT_NO_FATAL_FAILURE(Report(part0, id, 1, 0, 10));
  EXPECT_EQ(GetJob(id).checkpoint_size(), 0);
  EXPECT_THAT(Listed(GetJob(id)), ElementsAre("0/10"));
  ASSERT_NO_FATAL_FAILURE(LoseWorkers(id));
  auto w3 = Connect("w3");
  auto w4 = Connect("w4");
  auto a = w3->WaitFor(IsStart(id, 2));
  auto b = w4->WaitFor(IsStart(id, 2));
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->start().checkpoint_size(), 0);
  EXPECT_EQ(b->start().checkpoint_size(), 0);
  EXPECT_TRUE(Listed(GetJob(id)).empty());
  EXPECT_TRUE(DiaryMentions(id,
                            "attempt 2 starts afresh: no step has a "
                            "stored checkpoint of each of its 2 part(s)"));
}

// The kept checkpoints' bytes count against --max-output-bytes: one that
// would pass it is refused with a note, and the job goes on.
TEST_F(CheckpointsTest, ACheckpointPastTheOutputQuotaIsRefusedWithANote) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_output_bytes=*/100));
  auto w1 = Connect("w1");
  const int64_t id = Submit(1, "");
  ASSERT_TRUE(w1->WaitFor(IsStart(id, 1)).has_value());
  ASSERT_NO_FATAL_FAILURE(Report(w1, id, 1, 0, 10, std::string(40, 'a')));
  ASSERT_NO_FATAL_FAILURE(Report(w1, id, 1, 0, 20, std::string(40, 'b')));
  // 40 + 40 + 40 > 100.
  ASSERT_NO_FATAL_FAILURE(Report(w1, id, 1, 0, 30, std::string(40, 'c')));
  v1::Job job = GetJob(id);
  EXPECT_THAT(Listed(job), ElementsAre("0/10", "0/20*"));
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.progress().checkpoint_iteration(), 20);
  EXPECT_TRUE(DiaryMentions(
      id,
      "[dlbatch] the checkpoint of step 30 is not kept: with it the "
      "job's stored checkpoints would hold 120 B (120 bytes), more than "
      "the 100 B (100 bytes) a job may keep (the scheduler's "
      "--max-output-bytes); the job goes on, and a later attempt resumes "
      "from step 20"))
      << "see the diary";
  // Bytes the kept ones share count once: 'b' again fits.
  ASSERT_NO_FATAL_FAILURE(Report(w1, id, 1, 0, 40, std::string(40, 'b')));
  EXPECT_THAT(Listed(GetJob(id)), ElementsAre("0/10", "0/20", "0/40*"));
}

// A checkpoint folder may hold links (kept as links, no blob): the
// checkpoint is kept all the same.
TEST_F(CheckpointsTest, ACheckpointWithALinkIsKept) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto w1 = Connect("w1");
  const int64_t id = Submit(1, "");
  ASSERT_TRUE(w1->WaitFor(IsStart(id, 1)).has_value());
  v1::WorkerMessage m;
  v1::CheckpointStored* c = m.mutable_checkpoint();
  c->set_job_id(id);
  c->set_attempt(1);
  c->set_iteration(10);
  *c->add_files() = Blob("state.pt", "state");
  v1::OutputFile* link = c->add_files();
  link->set_path("latest.pt");
  link->set_symlink("state.pt");
  scheduler_->OnWorkerMessage(w1, std::move(m));
  Barrier(w1);
  v1::Job job = GetJob(id);
  EXPECT_THAT(Listed(job), ElementsAre("0/10*"));
  EXPECT_EQ(job.checkpoint_size(), 2);
}

}  // namespace
}  // namespace dlbatch::scheduler
