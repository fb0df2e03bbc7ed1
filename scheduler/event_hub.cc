#include "scheduler/event_hub.h"

#include <algorithm>

namespace dlbatch::scheduler {

// ---- WatchQueue ----

bool WatchQueue::PutLocked(Key key, Entry entry, bool replace) {
  mu_.AssertHeld();
  if (finished_ || closing_) return false;
  auto [it, inserted] = entries_.try_emplace(key, std::move(entry));
  if (!inserted) {
    if (replace) it->second = std::move(entry);
    return false;  // already pending: a wake is already due or in progress
  }
  order_.push_back(key);
  bool wake = idle_;
  idle_ = false;
  return wake;
}

bool WatchQueue::PutJob(std::shared_ptr<const v1::Job> job, int64_t time_ms) {
  absl::MutexLock lock(&mu_);
  Key key{0, job->id()};
  return PutLocked(key, Entry{std::move(job), nullptr, time_ms},
                   /*replace=*/true);
}

bool WatchQueue::PutJobIfAbsent(std::shared_ptr<const v1::Job> job,
                                int64_t time_ms) {
  absl::MutexLock lock(&mu_);
  Key key{0, job->id()};
  return PutLocked(key, Entry{std::move(job), nullptr, time_ms},
                   /*replace=*/false);
}

bool WatchQueue::PutWorker(std::shared_ptr<const v1::WorkerInfo> worker,
                           int64_t time_ms) {
  absl::MutexLock lock(&mu_);
  Key key{1, worker->id()};
  return PutLocked(key, Entry{nullptr, std::move(worker), time_ms},
                   /*replace=*/true);
}

bool WatchQueue::PutSnapshotDone(int64_t time_ms) {
  absl::MutexLock lock(&mu_);
  return PutLocked(Key{2, 0}, Entry{nullptr, nullptr, time_ms},
                   /*replace=*/false);
}

void WatchQueue::Pump() {
  mu_.Lock();
  if (writing_ || writer_ == nullptr || closing_ || finished_) {
    mu_.Unlock();
    return;
  }
  if (order_.empty()) {
    idle_ = true;
    mu_.Unlock();
    return;
  }
  Key key = order_.front();
  order_.pop_front();
  auto node = entries_.extract(key);
  writing_ = true;
  EventWriter* writer = writer_;
  mu_.Unlock();
  // Unlocked: FinishStream waits while writing_, so the writer lives on.
  v1::ClusterEvent event;
  event.set_time_ms(node.mapped().time_ms);
  if (node.mapped().job) {
    *event.mutable_job() = *node.mapped().job;
  } else if (node.mapped().worker) {
    *event.mutable_worker() = *node.mapped().worker;
  } else {
    event.set_snapshot_done(true);
  }
  writer->WriteEvent(std::move(event));
}

void WatchQueue::OnWritten(bool ok) {
  mu_.Lock();
  writing_ = false;
  if (!ok) closing_ = true;
  if (closing_) {
    MaybeFinish();
    return;
  }
  mu_.Unlock();
  Pump();
}

void WatchQueue::Close() {
  mu_.Lock();
  closing_ = true;
  MaybeFinish();
}

void WatchQueue::MaybeFinish() {
  if (writing_ || finished_ || writer_ == nullptr) {
    mu_.Unlock();
    return;
  }
  finished_ = true;
  order_.clear();
  entries_.clear();
  EventWriter* writer = writer_;
  mu_.Unlock();
  writer->FinishStream();
}

void WatchQueue::Detach() {
  absl::MutexLock lock(&mu_);
  writer_ = nullptr;
  order_.clear();
  entries_.clear();
}

size_t WatchQueue::pending() const {
  absl::MutexLock lock(&mu_);
  return order_.size();
}

bool WatchQueue::closed() const {
  absl::MutexLock lock(&mu_);
  return closing_ || finished_ || writer_ == nullptr;
}

// ---- WorkerJobsIndex ----

std::vector<int64_t> WorkerJobsIndex::Set(int64_t job,
                                          std::vector<int64_t> workers) {
  std::sort(workers.begin(), workers.end());
  workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
  std::vector<int64_t> before;
  if (auto it = job_workers_.find(job); it != job_workers_.end())
    before = it->second;
  if (before == workers) return {};
  for (int64_t w : before) {
    auto it = worker_jobs_.find(w);
    if (it == worker_jobs_.end()) continue;
    it->second.erase(job);
    if (it->second.empty()) worker_jobs_.erase(it);
  }
  for (int64_t w : workers) worker_jobs_[w][job] = 1;
  std::vector<int64_t> changed;
  std::set_symmetric_difference(before.begin(), before.end(), workers.begin(),
                                workers.end(), std::back_inserter(changed));
  if (workers.empty()) {
    job_workers_.erase(job);
  } else {
    job_workers_[job] = std::move(workers);
  }
  return changed;
}

std::vector<int64_t> WorkerJobsIndex::Jobs(int64_t worker) const {
  std::vector<int64_t> jobs;
  auto it = worker_jobs_.find(worker);
  if (it == worker_jobs_.end()) return jobs;
  for (const auto& [job, unused] : it->second) jobs.push_back(job);
  return jobs;
}

void WorkerJobsIndex::Clear() {
  job_workers_.clear();
  worker_jobs_.clear();
}

// ---- EventHub ----

EventHub::EventHub() : waker_([this] { WakeLoop(); }) {}

EventHub::~EventHub() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  waker_.join();
}

void EventHub::Add(std::shared_ptr<WatchQueue> queue) {
  absl::MutexLock lock(&mu_);
  queues_.push_back(std::move(queue));
  watchers_.store(static_cast<int>(queues_.size()), std::memory_order_relaxed);
}

void EventHub::Remove(const WatchQueue* queue) {
  absl::MutexLock lock(&mu_);
  auto gone = [queue](const std::shared_ptr<WatchQueue>& q) {
    return q.get() == queue;
  };
  queues_.erase(std::remove_if(queues_.begin(), queues_.end(), gone),
                queues_.end());
  to_wake_.erase(std::remove_if(to_wake_.begin(), to_wake_.end(), gone),
                 to_wake_.end());
  watchers_.store(static_cast<int>(queues_.size()), std::memory_order_relaxed);
}

void EventHub::PublishJob(v1::Job job, int64_t time_ms) {
  auto shared = std::make_shared<const v1::Job>(std::move(job));
  absl::MutexLock lock(&mu_);
  for (const auto& q : queues_) {
    if (q->PutJob(shared, time_ms)) to_wake_.push_back(q);
  }
}

void EventHub::PublishWorker(v1::WorkerInfo worker, int64_t time_ms) {
  auto shared = std::make_shared<const v1::WorkerInfo>(std::move(worker));
  absl::MutexLock lock(&mu_);
  for (const auto& q : queues_) {
    if (q->PutWorker(shared, time_ms)) to_wake_.push_back(q);
  }
}

bool EventHub::WakeDue() const { return stopping_ || !to_wake_.empty(); }

void EventHub::WakeLoop() {
  for (;;) {
    std::vector<std::shared_ptr<WatchQueue>> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &EventHub::WakeDue));
      if (stopping_) return;
      batch.swap(to_wake_);
    }
    for (const auto& q : batch) q->Pump();
  }
}

}  // namespace dlbatch::scheduler
