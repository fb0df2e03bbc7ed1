// Sweeps in the scheduler: one submit makes every job of the sweep in one
// transaction under a new sweep id, a retried submit returns the same
// sweep, and ListJobs filters by it. A real store in a temp dir, a fake
// clock and fake worker sessions, as scheduler_test.cc.
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/jobspec_yaml.h"
#include "scheduler/scheduler.h"
#include "tests/common/fake_clock.h"
#include "tests/scheduler/fake_session.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

// A train job with `sweep` (YAML lines under `sweep:`) and pool 1.
v1::SubmitJobRequest SweepRequest(const std::string& sweep,
                                  const std::string& request_id = "") {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(
      "name: net\n"
      "train:\n"
      "  network:\n"
      "    input: [28, 28, 1]\n"
      "    layers: [{type: fc, units: 10}, softmax]\n"
      "  data:\n"
      "    train: {format: idx, images: a.gz, labels: b.gz}\n"
      "  options: {max_iterations: 10}\n"
      "sweep:\n" +
          sweep,
      "job.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  v1::SubmitJobRequest request;
  request.set_request_id(request_id);
  request.set_user("alice");
  if (parsed.ok()) *request.mutable_spec() = parsed->spec;
  return request;
}

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dlbatch_sweep_XXXXXX")
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

  // A worker of profile 'local' with `slots` CPU slots, registered.
  std::shared_ptr<FakeSession> Connect(int slots) {
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
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(session
                    ->WaitFor([](const v1::SchedulerMessage& r) {
                      return r.has_registered();
                    })
                    .has_value());
    return session;
  }

  std::vector<int64_t> Listed(int64_t sweep_id) {
    v1::ListJobsRequest request;
    request.set_sweep_id(sweep_id);
    auto reply = scheduler_->ListJobs(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    std::vector<int64_t> ids;
    if (reply.ok()) {
      for (const v1::Job& job : reply->jobs()) ids.push_back(job.id());
    }
    return ids;
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SweepTest, SubmitMakesOneQueuedJobPerCombination) {
  auto session = Connect(2);
  auto reply = scheduler_->Submit(
      SweepRequest("  initial_learn_rate: [0.1, 0.01, 0.001]\n"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->sweep_id(), 1);
  ASSERT_EQ(reply->job_ids_size(), 3);
  EXPECT_EQ(reply->job_id(), reply->job_ids(0));
  EXPECT_FALSE(reply->duplicate());

  const std::vector<int64_t> ids(reply->job_ids().begin(),
                                 reply->job_ids().end());
  const char* rates[] = {"0.1", "0.01", "0.001"};
  for (int i = 0; i < 3; ++i) {
    auto job = scheduler_->GetJob(ids[i]);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->sweep_id(), 1);
    EXPECT_EQ(job->spec().name(),
              std::string("net[initial_learn_rate=") + rates[i] + "]");
    EXPECT_THAT(job->spec().sweep_point(),
                ElementsAre(Pair("initial_learn_rate", rates[i])));
    EXPECT_FALSE(job->spec().has_sweep());
    EXPECT_DOUBLE_EQ(job->spec().train().options().initial_learn_rate(),
                     std::stod(rates[i]));
  }
  // Two slots: the first two start, the third waits its turn.
  EXPECT_TRUE(session
                  ->WaitFor([&](const v1::SchedulerMessage& m) {
                    return m.has_start() && m.start().job_id() == ids[1];
                  })
                  .has_value());
  EXPECT_EQ(scheduler_->GetJob(ids[2])->state(), v1::JOB_STATE_QUEUED);

  EXPECT_THAT(Listed(1), ElementsAreArray(ids));
  v1::ListJobsRequest listing;
  listing.set_sweep_id(1);
  auto listed = scheduler_->ListJobs(listing);
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(listed->jobs(2).spec().sweep_point(),
              ElementsAre(Pair("initial_learn_rate", "0.001")));

  // A second sweep gets the next id; a plain job none.
  auto second =
      scheduler_->Submit(SweepRequest("  mini_batch_size: [16, 32]\n"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->sweep_id(), 2);
  EXPECT_EQ(Listed(2).size(), 2u);
  v1::SubmitJobRequest plain = SweepRequest("  mini_batch_size: [16]\n");
  plain.mutable_spec()->clear_sweep();
  auto single = scheduler_->Submit(plain);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->sweep_id(), 0);
  EXPECT_THAT(single->job_ids(), ElementsAre(single->job_id()));
  EXPECT_EQ(scheduler_->GetJob(single->job_id())->sweep_id(), 0);
}

TEST_F(SweepTest, UnknownSweepIsNotFoundAndAStateFilterMayMatchNone) {
  auto session = Connect(2);
  auto reply = scheduler_->Submit(SweepRequest("  momentum: [0.5, 0.9]\n"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  v1::ListJobsRequest request;
  request.set_sweep_id(7);
  auto unknown = scheduler_->ListJobs(request);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no sweep 7"));

  request.set_sweep_id(reply->sweep_id());
  request.add_states(v1::JOB_STATE_FINISHED);
  auto none = scheduler_->ListJobs(request);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(none->jobs(), IsEmpty());
}

TEST_F(SweepTest, RetriedSubmitReturnsTheSameSweep) {
  auto session = Connect(2);
  auto first =
      scheduler_->Submit(SweepRequest("  momentum: [0.5, 0.9]\n", "req-s"));
  ASSERT_TRUE(first.ok()) << first.status();
  auto again =
      scheduler_->Submit(SweepRequest("  momentum: [0.5, 0.9]\n", "req-s"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(again->sweep_id(), first->sweep_id());
  EXPECT_EQ(again->job_id(), first->job_id());
  EXPECT_THAT(again->job_ids(), ElementsAreArray(first->job_ids()));
  auto all = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs_size(), 2) << "a retried sweep made more jobs";
}

TEST_F(SweepTest, AnInvalidSweepIsRefusedWhole) {
  // A value that makes an invalid job, from a client that did not check.
  v1::SubmitJobRequest bad = SweepRequest("  mini_batch_size: [16, 32]\n");
  bad.mutable_spec()->mutable_sweep()->mutable_axes(0)->set_values(1, "0");
  auto refused = scheduler_->Submit(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sweep.mini_batch_size[1]: '0' makes an invalid job"));

  // Every job too big for the profile: none is stored.
  Connect(1);
  v1::SubmitJobRequest big = SweepRequest("  momentum: [0.5, 0.9]\n");
  big.mutable_spec()->set_pool(2);
  EXPECT_FALSE(scheduler_->Submit(big).ok());
  auto all = scheduler_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(all->jobs(), IsEmpty());
}

TEST_F(SweepTest, SweepIdsSurviveARestart) {
  auto session = Connect(2);
  auto first = scheduler_->Submit(SweepRequest("  momentum: [0.5, 0.9]\n"));
  ASSERT_TRUE(first.ok()) << first.status();
  Stop();
  Start();
  auto job = scheduler_->GetJob(first->job_ids(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->sweep_id(), first->sweep_id());
  EXPECT_EQ(Listed(first->sweep_id()).size(), 2u);
  auto second = scheduler_->Submit(SweepRequest("  momentum: [0.1]\n"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->sweep_id(), first->sweep_id() + 1);
}

}  // namespace
}  // namespace dlbatch::scheduler
