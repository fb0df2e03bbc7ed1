// WatchEvents without gRPC: the per-stream queue's coalescing and write
// discipline with a fake writer, the worker/job index, and a real Scheduler
// (SQLite in a temp dir, fake clock, fake worker session) feeding a watch.
#include "scheduler/event_hub.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "tests/common/fake_clock.h"
#include "tests/scheduler/fake_session.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Records what the queue writes. With `auto_complete`, each write completes
// at once (re-entering the queue, as a fast stream would); otherwise the
// test completes them.
class FakeWriter final : public EventWriter {
 public:
  explicit FakeWriter(bool auto_complete) : auto_complete_(auto_complete) {}
  void set_queue(WatchQueue* queue) { queue_ = queue; }

  void WriteEvents(Batch batch) override {
    {
      absl::MutexLock lock(&mu_);
      EXPECT_FALSE(in_flight_) << "two writes in flight";
      EXPECT_FALSE(batch.empty()) << "an empty write";
      in_flight_ = true;
      for (const auto& e : batch) events_.push_back(e->ToProto());
      batches_.push_back(std::move(batch));
    }
    if (auto_complete_) Complete(true);
  }
  void FinishStream() override {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(in_flight_) << "finished with a write in flight";
    ++finished_;
  }
  void Complete(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = false;
    }
    queue_->OnWritten(ok);
  }
  std::vector<v1::ClusterEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // The writes, each with the entries it took.
  std::vector<Batch> batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  int finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  // Waits (real time, bounded) until some event matches `pred`.
  bool WaitFor(const std::function<bool(const v1::ClusterEvent&)>& pred) const {
    for (int i = 0; i < 500; ++i) {
      for (const auto& e : events()) {
        if (pred(e)) return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

 private:
  const bool auto_complete_;
  WatchQueue* queue_ = nullptr;
  mutable absl::Mutex mu_;
  std::vector<v1::ClusterEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<Batch> batches_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<const v1::Job> JobIn(int64_t id, v1::JobState state) {
  auto job = std::make_shared<v1::Job>();
  job->set_id(id);
  job->set_state(state);
  return job;
}

std::vector<std::string> Describe(const std::vector<v1::ClusterEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    if (e.has_job()) {
      out.push_back("job " + std::to_string(e.job().id()) + " " +
                    v1::JobState_Name(e.job().state()));
    } else if (e.has_worker()) {
      out.push_back("worker " + std::to_string(e.worker().id()));
    } else if (e.snapshot_done()) {
      out.push_back("done");
    }
  }
  return out;
}

TEST(WatchQueue, CoalescesPerJobAndKeepsTheLatestState) {
  FakeWriter writer(/*auto_complete=*/false);
  WatchQueue queue(&writer);
  writer.set_queue(&queue);
  queue.PutJob(JobIn(1, v1::JOB_STATE_QUEUED), 1);
  queue.PutJob(JobIn(2, v1::JOB_STATE_QUEUED), 1);
  queue.PutSnapshotDone(1);
  queue.Pump();  // job 1 in flight
  for (int i = 0; i < 1000; ++i)
    queue.PutJob(JobIn(2, v1::JOB_STATE_RUNNING), 2);
  queue.PutJob(JobIn(1, v1::JOB_STATE_CANCELLED), 3);
  EXPECT_EQ(queue.pending(), 3u);  // 2, done, 1: one entry per job at most
  while (queue.pending() > 0) writer.Complete(true);
  writer.Complete(true);
  EXPECT_THAT(Describe(writer.events()),
              ElementsAre("job 1 JOB_STATE_QUEUED", "job 2 JOB_STATE_RUNNING",
                          "done", "job 1 JOB_STATE_CANCELLED"));
}

TEST(WatchQueue, AnIdleQueueAsksForAPumpOnce) {
  FakeWriter writer(/*auto_complete=*/true);
  WatchQueue queue(&writer);
  writer.set_queue(&queue);
  EXPECT_FALSE(
      queue.PutJob(JobIn(1, v1::JOB_STATE_QUEUED), 1));  // new: not idle yet
  queue.Pump();
  EXPECT_EQ(writer.events().size(), 1u);
  EXPECT_TRUE(queue.PutJob(JobIn(1, v1::JOB_STATE_RUNNING), 2));
  EXPECT_FALSE(queue.PutJob(JobIn(2, v1::JOB_STATE_QUEUED),
                            2));  // a wake is due already
  queue.Pump();
  EXPECT_EQ(writer.events().size(), 3u);
}

TEST(WatchQueue, StoreRowsNeverReplaceAPublishedState) {
  FakeWriter writer(/*auto_complete=*/true);
  WatchQueue queue(&writer);
  writer.set_queue(&queue);
  queue.PutJob(JobIn(7, v1::JOB_STATE_FINISHED), 2);
  queue.PutJobIfAbsent(JobIn(7, v1::JOB_STATE_RUNNING), 1);
  queue.PutJobIfAbsent(JobIn(6, v1::JOB_STATE_FAILED), 1);
  queue.Pump();
  EXPECT_THAT(Describe(writer.events()), ElementsAre("job 7 JOB_STATE_FINISHED",
                                                     "job 6 JOB_STATE_FAILED"));
}

TEST(WatchQueue, FinishesOnlyOnceTheWriteInFlightIsDone) {
  FakeWriter writer(/*auto_complete=*/false);
  WatchQueue queue(&writer);
  writer.set_queue(&queue);
  queue.PutJob(JobIn(1, v1::JOB_STATE_QUEUED), 1);
  queue.PutJob(JobIn(2, v1::JOB_STATE_QUEUED), 1);
  queue.Pump();
  queue.Close();
  EXPECT_EQ(writer.finished(), 0);
  writer.Complete(true);
  EXPECT_EQ(writer.finished(), 1);
  EXPECT_EQ(writer.events().size(), 1u);  // nothing more after Close
  EXPECT_FALSE(queue.PutJob(JobIn(3, v1::JOB_STATE_QUEUED), 1));
  queue.Detach();
  queue.Pump();
  EXPECT_EQ(writer.events().size(), 1u);
}

TEST(WatchQueue, AWriteTakesWhatIsPendingWithinItsBounds) {
  FakeWriter writer(/*auto_complete=*/false);
  WatchOptions options;
  options.max_batch = 3;
  WatchQueue queue(&writer, options);
  writer.set_queue(&queue);
  queue.PutJob(JobIn(1, v1::JOB_STATE_QUEUED), 1);
  queue.Pump();  // job 1 alone in flight
  for (int id = 2; id <= 6; ++id)
    queue.PutJob(JobIn(id, v1::JOB_STATE_QUEUED), 2);
  queue.PutJob(JobIn(3, v1::JOB_STATE_RUNNING), 3);  // still coalesced
  writer.Complete(true);                             // 2, 3, 4
  writer.Complete(true);                             // 5, 6
  writer.Complete(true);                             // nothing pending: idle
  auto batches = writer.batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].size(), 1u);
  EXPECT_EQ(batches[1].size(), 3u);
  EXPECT_EQ(batches[2].size(), 2u);
  EXPECT_THAT(Describe(writer.events()),
              ElementsAre("job 1 JOB_STATE_QUEUED", "job 2 JOB_STATE_QUEUED",
                          "job 3 JOB_STATE_RUNNING", "job 4 JOB_STATE_QUEUED",
                          "job 5 JOB_STATE_QUEUED", "job 6 JOB_STATE_QUEUED"));
  EXPECT_TRUE(queue.PutJob(JobIn(7, v1::JOB_STATE_QUEUED), 4));  // idle again
}

TEST(WatchQueue, ABatchStaysWithinItsBytesButTakesAtLeastOne) {
  FakeWriter writer(/*auto_complete=*/false);
  WatchOptions options;
  options.max_batch = 100;
  options.max_batch_bytes = 40;
  WatchQueue queue(&writer, options);
  writer.set_queue(&queue);
  auto big = std::make_shared<v1::Job>();
  big->set_id(1);
  big->set_wait_reason(std::string(100, 'x'));
  queue.PutJob(big, 1);
  for (int id = 2; id <= 5; ++id) {
    auto job = std::make_shared<v1::Job>();
    job->set_id(id);
    job->set_wait_reason(std::string(10, 'y'));  // about 14 bytes each
    queue.PutJob(job, 1);
  }
  queue.Pump();
  while (queue.pending() > 0) writer.Complete(true);
  writer.Complete(true);
  std::vector<size_t> sizes;
  for (const auto& b : writer.batches()) sizes.push_back(b.size());
  EXPECT_THAT(sizes, ElementsAre(1, 2, 2));
}

TEST(WatchQueue, AOneJobQueueDropsOtherJobsAndWorkersAsTheyArePut) {
  FakeWriter writer(/*auto_complete=*/true);
  WatchOptions options;
  options.only_job = 7;
  WatchQueue queue(&writer, options);
  writer.set_queue(&queue);
  queue.PutJob(JobIn(6, v1::JOB_STATE_QUEUED), 1);
  queue.PutJob(JobIn(7, v1::JOB_STATE_QUEUED), 1);
  auto worker = std::make_shared<v1::WorkerInfo>();
  worker->set_id(1);
  queue.PutWorker(worker, 1);
  queue.PutJobIfAbsent(JobIn(8, v1::JOB_STATE_FAILED), 1);
  queue.PutSnapshotDone(1);
  EXPECT_EQ(queue.pending(), 2u);
  queue.Pump();
  EXPECT_FALSE(queue.PutJob(JobIn(9, v1::JOB_STATE_RUNNING), 2));  // no wake
  EXPECT_TRUE(queue.PutJob(JobIn(7, v1::JOB_STATE_RUNNING), 2));
  queue.Pump();
  EXPECT_THAT(
      Describe(writer.events()),
      ElementsAre("job 7 JOB_STATE_QUEUED", "done", "job 7 JOB_STATE_RUNNING"));
}

TEST(WatchEvent, EachVariantIsMadeOnceForEveryThreadThatAsks) {
  auto job = std::make_shared<v1::Job>();
  job->set_id(3);
  WatchEvent event(job, nullptr, 1);
  std::atomic<int> made[2] = {0, 0};
  std::vector<std::thread> threads;
  std::vector<std::string> seen(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const int v = t % 2;
      seen[t] = event.Text(v, [&] {
        made[v]++;
        return "variant " + std::to_string(v);
      });
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(made[0], 1);
  EXPECT_EQ(made[1], 1);
  for (int t = 0; t < 8; ++t)
    EXPECT_EQ(seen[t], "variant " + std::to_string(t % 2));
}

TEST(EventHub, OnePublishedEntryIsSharedByEveryQueue) {
  EventHub hub;
  FakeWriter a(/*auto_complete=*/true), b(/*auto_complete=*/true);
  auto qa = std::make_shared<WatchQueue>(&a);
  auto qb = std::make_shared<WatchQueue>(&b);
  a.set_queue(qa.get());
  b.set_queue(qb.get());
  hub.Add(qa);
  hub.Add(qb);
  qa->Pump();  // idle: the hub wakes them
  qb->Pump();
  v1::Job job;
  job.set_id(5);
  hub.PublishJob(job, 1);
  ASSERT_TRUE(a.WaitFor([](const v1::ClusterEvent& e) { return e.has_job(); }));
  ASSERT_TRUE(b.WaitFor([](const v1::ClusterEvent& e) { return e.has_job(); }));
  // The same entry, so what one stream renders of it the other reuses.
  ASSERT_EQ(a.batches().size(), 1u);
  ASSERT_EQ(b.batches().size(), 1u);
  const auto ea = a.batches()[0][0];
  const auto eb = b.batches()[0][0];
  EXPECT_EQ(ea.get(), eb.get());
  int made = 0;
  auto make = [&] {
    ++made;
    return std::string("text");
  };
  ea->Text(0, make);
  eb->Text(0, make);
  EXPECT_EQ(made, 1);
  hub.Remove(qa.get());
  hub.Remove(qb.get());
  qa->Detach();
  qb->Detach();
}

TEST(EventHub, ALingeringQueueWritesWhatCameMeanwhileInOneWrite) {
  EventHub hub;
  FakeWriter writer(/*auto_complete=*/true);
  WatchOptions options;
  options.max_batch = 256;
  options.linger_ms = 200;
  auto queue = std::make_shared<WatchQueue>(&writer, options);
  writer.set_queue(queue.get());
  hub.Add(queue);
  queue->Pump();  // idle
  const absl::Time start = absl::Now();
  for (int id = 1; id <= 50; ++id) {
    v1::Job job;
    job.set_id(id);
    hub.PublishJob(job, 1);
  }
  ASSERT_TRUE(writer.WaitFor(
      [](const v1::ClusterEvent& e) { return e.job().id() == 50; }));
  // Published within far less than the linger (else the test says nothing).
  if (absl::Now() - start < absl::Milliseconds(150)) {
    ASSERT_EQ(writer.batches().size(), 1u);
    EXPECT_EQ(writer.batches()[0].size(), 50u);
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  hub.Remove(queue.get());
  queue->Detach();
}

TEST(WorkerJobsIndex, ReportsTheWorkersWhoseJobsChanged) {
  WorkerJobsIndex index;
  EXPECT_THAT(index.Set(10, {1, 2}), ElementsAre(1, 2));
  EXPECT_THAT(index.Set(11, {2}), ElementsAre(2));
  EXPECT_THAT(index.Jobs(2), ElementsAre(10, 11));
  EXPECT_THAT(index.Set(10, {2, 1}), IsEmpty());
  EXPECT_THAT(index.Set(10, {}), ElementsAre(1, 2));
  EXPECT_THAT(index.Jobs(1), IsEmpty());
  EXPECT_THAT(index.Jobs(2), ElementsAre(11));
}

// ---- through the Scheduler ----

class SchedulerWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dlbatch_watch_XXXXXX")
            .string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    auto store = Store::Open(dir_ + "/state.db", /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    reader_ = std::make_unique<StoreReader>(dir_ + "/state.db");
    auto blobs = BlobStore::Open(dir_ + "/blobs", 0);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = std::move(*blobs);
    SchedulerOptions options;
    options.heartbeat_interval_ms = 100;
    options.heartbeat_timeout_ms = 100000;
    scheduler_ = std::make_unique<Scheduler>(store_.get(), reader_.get(),
                                             blobs_.get(), &clock_, options);
    ASSERT_TRUE(scheduler_->Start().ok());
  }
  void TearDown() override {
    scheduler_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::shared_ptr<FakeSession> Connect(const std::string& name, int slots) {
    auto session = std::make_shared<FakeSession>();
    v1::WorkerMessage m;
    m.mutable_register_()->set_name(name);
    m.mutable_register_()->set_profile("local");
    for (int i = 0; i < slots; ++i) {
      auto* d = m.mutable_register_()->add_devices();
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

  int64_t Submit(int pool, const std::string& name) {
    v1::SubmitJobRequest request;
    request.set_user("alice");
    request.mutable_spec()->set_name(name);
    request.mutable_spec()->set_pool(pool);
    request.mutable_spec()->mutable_command()->add_argv("true");
    auto reply = scheduler_->Submit(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->job_id() : 0;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerWatchTest, SnapshotThenEveryChangeOfJobsAndWorkers) {
  auto session = Connect("w1", 2);
  int64_t running = Submit(2, "first");
  int64_t waiting = Submit(1, "second");

  FakeWriter writer(/*auto_complete=*/true);
  auto queue = scheduler_->watchers().Watch(v1::WatchEventsRequest(), &writer);
  ASSERT_TRUE(queue.ok()) << queue.status();
  writer.set_queue(queue->get());
  (*queue)->Pump();
  auto events = writer.events();
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().snapshot_done());
  EXPECT_THAT(
      Describe(events),
      ElementsAre("job " + std::to_string(running) + " JOB_STATE_RUNNING",
                  "job " + std::to_string(waiting) + " JOB_STATE_QUEUED",
                  "worker 1", "done"));
  EXPECT_EQ(events[0].job().placement(0).worker_name(), "w1");
  EXPECT_FALSE(events[0].job().spec().has_command());  // a summary only
  EXPECT_NE(events[1].job().wait_reason().find("waiting for 1 slot"),
            std::string::npos);
  EXPECT_THAT(events[2].worker().running_jobs(), ElementsAre(running));
  EXPECT_EQ(events[2].worker().free_slots(), 0);

  // A new job, and the worker losing its connection, reach the stream.
  int64_t third = Submit(1, "third");
  EXPECT_TRUE(writer.WaitFor([&](const v1::ClusterEvent& e) {
    return e.has_job() && e.job().id() == third &&
           e.job().spec().name() == "third";
  }));
  ASSERT_TRUE(scheduler_
                  ->Cancel([&] {
                    v1::CancelJobsRequest r;
                    r.add_job_ids(waiting);
                    return r;
                  }())
                  .ok());
  EXPECT_TRUE(writer.WaitFor([&](const v1::ClusterEvent& e) {
    return e.has_job() && e.job().id() == waiting &&
           e.job().state() == v1::JOB_STATE_CANCELLED;
  }));
  scheduler_->OnWorkerGone(session);
  EXPECT_TRUE(writer.WaitFor([](const v1::ClusterEvent& e) {
    return e.has_worker() && !e.worker().online();
  }));

  (*queue)->Close();
  scheduler_->watchers().Unwatch(queue->get());
  (*queue)->Detach();
  EXPECT_EQ(writer.finished(), 1);
}

TEST_F(SchedulerWatchTest, ARemovedWorkerReachesWatchersMarkedRemoved) {
  auto session = Connect("w1", 1);
  FakeWriter writer(/*auto_complete=*/true);
  auto queue = scheduler_->watchers().Watch(v1::WatchEventsRequest(), &writer);
  ASSERT_TRUE(queue.ok());
  writer.set_queue(queue->get());
  (*queue)->Pump();
  scheduler_->OnWorkerGone(session);
  EXPECT_TRUE(writer.WaitFor([](const v1::ClusterEvent& e) {
    return e.has_worker() && !e.worker().online() && !e.worker().removed();
  }));
  auto removed = scheduler_->control().RemoveWorker("w1");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(writer.WaitFor([](const v1::ClusterEvent& e) {
    return e.has_worker() && e.worker().name() == "w1" && e.worker().removed();
  }));
  (*queue)->Close();
  scheduler_->watchers().Unwatch(queue->get());
  (*queue)->Detach();
}

TEST_F(SchedulerWatchTest, SlotsFreedByAnEndedJobReachTheWorkerEntry) {
  auto session = Connect("w1", 1);
  FakeWriter writer(/*auto_complete=*/true);
  auto queue = scheduler_->watchers().Watch(v1::WatchEventsRequest(), &writer);
  ASSERT_TRUE(queue.ok());
  writer.set_queue(queue->get());
  (*queue)->Pump();
  int64_t id = Submit(1, "short");
  EXPECT_TRUE(writer.WaitFor([&](const v1::ClusterEvent& e) {
    return e.has_worker() && e.worker().running_jobs_size() == 1 &&
           e.worker().running_jobs(0) == id;
  }));
  v1::WorkerMessage ended;
  ended.mutable_ended()->set_job_id(id);
  ended.mutable_ended()->set_attempt(1);
  ended.mutable_ended()->set_state(v1::JOB_STATE_FINISHED);
  scheduler_->OnWorkerMessage(session, std::move(ended));
  EXPECT_TRUE(writer.WaitFor([&](const v1::ClusterEvent& e) {
    return e.has_job() && e.job().id() == id &&
           e.job().state() == v1::JOB_STATE_FINISHED;
  }));
  EXPECT_TRUE(writer.WaitFor([](const v1::ClusterEvent& e) {
    return e.has_worker() && e.worker().running_jobs_size() == 0 &&
           e.worker().free_slots() == 1;
  }));
  (*queue)->Close();
  scheduler_->watchers().Unwatch(queue->get());
  (*queue)->Detach();
}

}  // namespace
}  // namespace dlbatch::scheduler
