// Job arrays in the scheduler: one submit makes a job per index in one
// transaction under a new id (a sweep id), each told its index and array;
// the %N limit holds what starts, is explained in the wait reason, and
// holds again after a restart, from the store alone. A real store in a
// temp dir, a fake clock and fake worker sessions, as sweep_test.cc.
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

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
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::SubmitJobRequest ArrayRequest(const std::string& array,
                                  const std::string& request_id = "") {
  v1::SubmitJobRequest request;
  request.set_request_id(request_id);
  request.set_user("alice");
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("sim");
  spec->mutable_command()->add_argv("true");
  spec->set_array(array);
  return request;
}

bool WaitUntil(const std::function<bool()>& ready) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!ready()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

class ArrayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dlbatch_array_XXXXXX")
            .string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    Start();
  }

  void TearDown() override {
    Stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Start() {
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
    options.heartbeat_timeout_ms = 60000;
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

  // Worker "w1" of profile 'local' with `slots` CPU slots, reporting the
  // jobs it still runs.
  std::shared_ptr<FakeSession> Connect(
      int slots, const std::vector<v1::RunningJob>& running = {}) {
    auto session = std::make_shared<FakeSession>();
    v1::WorkerMessage m;
    v1::Register* reg = m.mutable_register_();
    reg->set_name("w1");
    reg->set_host("host");
    reg->set_profile("local");
    for (int i = 0; i < slots; ++i) {
      v1::Device* d = reg->add_devices();
      d->set_index(i);
      d->set_kind("cpu");
    }
    for (const v1::RunningJob& r : running) *reg->add_running() = r;
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(session
                    ->WaitFor([](const v1::SchedulerMessage& r) {
                      return r.has_registered();
                    })
                    .has_value());
    return session;
  }

  // The jobs the scheduler has sent a start for, in order.
  static std::vector<int64_t> Started(const FakeSession& session) {
    std::vector<int64_t> ids;
    for (const v1::SchedulerMessage& m : session.Matching(
             [](const v1::SchedulerMessage& m) { return m.has_start(); })) {
      ids.push_back(m.start().job_id());
    }
    return ids;
  }

  void ReportFinished(const std::shared_ptr<FakeSession>& session, int64_t id) {
    v1::WorkerMessage m;
    v1::JobEnded* ended = m.mutable_ended();
    ended->set_job_id(id);
    ended->set_attempt(1);
    ended->set_state(v1::JOB_STATE_FINISHED);
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(WaitUntil([&] {
      auto job = scheduler_->GetJob(id);
      return job.ok() && job->state() == v1::JOB_STATE_FINISHED;
    }));
  }

  std::string WaitReason(int64_t id) {
    auto job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->wait_reason() : "";
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(ArrayTest, OneJobPerIndexEachToldItsIndexAndArray) {
  auto session = Connect(4);
  auto reply = scheduler_->Submit(ArrayRequest("1,5-9:2%2"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->sweep_id(), 1);
  ASSERT_EQ(reply->job_ids_size(), 4);
  const int64_t indexes[] = {1, 5, 7, 9};
  for (int i = 0; i < 4; ++i) {
    auto job = scheduler_->GetJob(reply->job_ids(i));
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->spec().name(), "sim[" + std::to_string(indexes[i]) + "]");
    EXPECT_EQ(job->array_id(), 1);
    EXPECT_EQ(job->sweep_id(), 1);
    EXPECT_EQ(job->array_index(), indexes[i]);
    EXPECT_EQ(job->array_limit(), 2);
    EXPECT_TRUE(job->spec().array().empty());
    EXPECT_EQ(job->spec().array_task().id(), 1);
    EXPECT_EQ(job->spec().array_task().count(), 4);
  }
  // The workers get the task in the spec they start (for the env).
  ASSERT_TRUE(session
                  ->WaitFor([&](const v1::SchedulerMessage& m) {
                    return m.has_start() &&
                           m.start().job_id() == reply->job_ids(1);
                  })
                  .has_value());
  auto start = session->WaitFor([&](const v1::SchedulerMessage& m) {
    return m.has_start() && m.start().job_id() == reply->job_ids(1);
  });
  EXPECT_EQ(start->start().spec().array_task().index(), 5);
  EXPECT_EQ(start->start().spec().array_task().id(), 1);

  // Listed by its id, with each job's array fields.
  v1::ListJobsRequest listing;
  listing.set_sweep_id(1);
  auto listed = scheduler_->ListJobs(listing);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 4);
  EXPECT_EQ(listed->jobs(3).array_index(), 9);
  EXPECT_EQ(listed->jobs(3).array_id(), 1);
  // And in a page of every job (the dashboard's), so an array's jobs are
  // told from a sweep's; a listing of every job without a limit stays lean.
  v1::ListJobsRequest page;
  page.set_limit(100);
  listed = scheduler_->ListJobs(page);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 4);
  EXPECT_EQ(listed->jobs(3).array_id(), 1);
  EXPECT_EQ(listed->jobs(3).array_index(), 9);
  listed = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->jobs(3).array_id(), 0);

  // A retried submit returns the same array; a second array the next id.
  auto retried = scheduler_->Submit(ArrayRequest("0-2", "req-a"));
  ASSERT_TRUE(retried.ok());
  auto again = scheduler_->Submit(ArrayRequest("0-2", "req-a"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(again->sweep_id(), 2);
  EXPECT_THAT(again->job_ids(), ElementsAreArray(retried->job_ids()));
}

TEST_F(ArrayTest, TheLimitHoldsAndSaysWhyTheOthersWait) {
  auto session = Connect(8);
  auto reply = scheduler_->Submit(ArrayRequest("0-9%3"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  const std::vector<int64_t> ids(reply->job_ids().begin(),
                                 reply->job_ids().end());
  ASSERT_TRUE(WaitUntil([&] { return Started(*session).size() == 3; }));
  // A plain job behind the array is not held back by it.
  auto plain = scheduler_->Submit([] {
    v1::SubmitJobRequest r = ArrayRequest("");
    r.mutable_spec()->clear_array();
    return r;
  }());
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(WaitUntil([&] { return Started(*session).size() == 4; }));
  EXPECT_THAT(Started(*session),
              ElementsAre(ids[0], ids[1], ids[2], plain->job_id()));
  EXPECT_EQ(WaitReason(ids[3]), "array 1 has 3 of 3 running (%3)");

  ReportFinished(session, ids[1]);
  ASSERT_TRUE(WaitUntil([&] { return Started(*session).size() == 5; }));
  EXPECT_EQ(Started(*session).back(), ids[3]);
  EXPECT_EQ(WaitReason(ids[4]), "array 1 has 3 of 3 running (%3)");
}

TEST_F(ArrayTest, TheLimitHoldsAfterARestartFromTheStoreAlone) {
  std::vector<int64_t> ids;
  {
    auto session = Connect(8);
    auto reply = scheduler_->Submit(ArrayRequest("0-5%2"));
    ASSERT_TRUE(reply.ok()) << reply.status();
    ids.assign(reply->job_ids().begin(), reply->job_ids().end());
    ASSERT_TRUE(WaitUntil([&] { return Started(*session).size() == 2; }));
  }
  Stop();
  Start();
  // The worker comes back still running the first two; nothing more starts
  // while they run, though six slots are free.
  auto session = Connect(8, {[&] {
                               v1::RunningJob r;
                               r.set_job_id(ids[0]);
                               r.set_attempt(1);
                               return r;
                             }(),
                             [&] {
                               v1::RunningJob r;
                               r.set_job_id(ids[1]);
                               r.set_attempt(1);
                               return r;
                             }()});
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT(Started(*session), testing::IsEmpty());
  EXPECT_EQ(WaitReason(ids[2]), "array 1 has 2 of 2 running (%2)");
  ReportFinished(session, ids[0]);
  ASSERT_TRUE(WaitUntil([&] { return Started(*session).size() == 1; }));
  EXPECT_THAT(Started(*session), ElementsAre(ids[2]));
}

TEST_F(ArrayTest, BadArraysAreRefusedWholeWithWhatToChange) {
  Connect(2);
  auto refused = scheduler_->Submit(ArrayRequest("5-1"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("array: '5-1' ends before it starts"));
  refused = scheduler_->Submit(ArrayRequest("0-10000"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("makes 10001 jobs; an array makes at most 10000"));
  // A client that sets a job's task itself.
  v1::SubmitJobRequest forged = ArrayRequest("");
  forged.mutable_spec()->clear_array();
  forged.mutable_spec()->mutable_array_task()->set_count(1);
  forged.mutable_spec()->mutable_array_task()->set_limit(1);
  refused = scheduler_->Submit(forged);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("array_task: is set by the scheduler"));
  // Too big for the profile: none of its jobs is stored.
  v1::SubmitJobRequest big = ArrayRequest("0-3");
  big.mutable_spec()->set_pool(3);
  EXPECT_FALSE(scheduler_->Submit(big).ok());
  auto all = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs_size(), 0);
}

TEST_F(ArrayTest, TheLargestArrayIsOneQuickSubmit) {
  auto session = Connect(16);
  const absl::Time began = absl::Now();
  auto reply = scheduler_->Submit(ArrayRequest("0-9999%10"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->job_ids_size(), 10000);
  ASSERT_TRUE(WaitUntil([&] { return Started(*session).size() == 10; }));
  const absl::Duration took = absl::Now() - began;
  std::cout << "10,000-job array submitted and its first 10 started in " << took
            << "\n";
  EXPECT_LT(took, absl::Seconds(30));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Started(*session).size(), 10u);
  EXPECT_EQ(WaitReason(reply->job_ids(9999)),
            "array 1 has 10 of 10 running (%10)");
}

}  // namespace
}  // namespace dlbatch::scheduler
