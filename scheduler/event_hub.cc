#include "scheduler/event_hub.h"

#include <algorithm>
#include <utility>

namespace dlbatch::scheduler {

// ---- WatchEvent ----

namespace {
size_t SizeOf(const v1::Job* job, const v1::WorkerInfo* worker) {
  if (job) return job->ByteSizeLong();
  if (worker) return worker->ByteSizeLong();
  return 1;
}
}  // namespace

// The size is taken here, on one thread: ByteSizeLong caches it in the
// message, which is shared read-only from now on.
WatchEvent::WatchEvent(std::shared_ptr<const v1::Job> job,
                       std::shared_ptr<const v1::WorkerInfo> worker,
                       int64_t time_ms)
    : job_(std::move(job)),
      worker_(std::move(worker)),
      time_ms_(time_ms),
      size_hint_(SizeOf(job_.get(), worker_.get())) {}

v1::ClusterEvent WatchEvent::ToProto() const {
  v1::ClusterEvent event;
  event.set_time_ms(time_ms_);
  if (job_) {
    *event.mutable_job() = *job_;
  } else if (worker_) {
    *event.mutable_worker() = *worker_;
  } else {
    event.set_snapshot_done(true);
  }
  return event;
}

const std::string& WatchEvent::Text(
    int variant, absl::FunctionRef<std::string()> make) const {
  absl::call_once(made_[variant], [&] { text_[variant] = make(); });
  return text_[variant];
}

// ---- WatchQueue ----

bool WatchQueue::Wanted(const WatchEvent& event) const {
  if (options_.only_job == 0 || event.snapshot_done()) return true;
  return event.job() != nullptr && event.job()->id() == options_.only_job;
}

bool WatchQueue::PutLocked(std::shared_ptr<const WatchEvent> event,
                           bool replace) {
  mu_.AssertHeld();
  if (finished_ || closing_) return false;
  Key key = event->job()      ? Key{0, event->job()->id()}
            : event->worker() ? Key{1, event->worker()->id()}
                              : Key{2, 0};
  auto [it, inserted] = entries_.try_emplace(key, event);
  if (!inserted) {
    if (replace) it->second = std::move(event);
    return false;  // already pending: a wake is already due or in progress
  }
  order_.push_back(key);
  bool wake = idle_;
  idle_ = false;
  return wake;
}

bool WatchQueue::Put(std::shared_ptr<const WatchEvent> event) {
  if (!Wanted(*event)) return false;  // options_ is const: no lock
  absl::MutexLock lock(&mu_);
  return PutLocked(std::move(event), /*replace=*/true);
}

bool WatchQueue::PutJob(std::shared_ptr<const v1::Job> job, int64_t time_ms) {
  return Put(
      std::make_shared<const WatchEvent>(std::move(job), nullptr, time_ms));
}

bool WatchQueue::PutJobIfAbsent(std::shared_ptr<const v1::Job> job,
                                int64_t time_ms) {
  if (options_.only_job != 0 && job->id() != options_.only_job) return false;
  auto event =
      std::make_shared<const WatchEvent>(std::move(job), nullptr, time_ms);
  absl::MutexLock lock(&mu_);
  return PutLocked(std::move(event), /*replace=*/false);
}

bool WatchQueue::PutWorker(std::shared_ptr<const v1::WorkerInfo> worker,
                           int64_t time_ms) {
  if (options_.only_job != 0) return false;
  return Put(
      std::make_shared<const WatchEvent>(nullptr, std::move(worker), time_ms));
}

bool WatchQueue::PutSnapshotDone(int64_t time_ms) {
  auto event = std::make_shared<const WatchEvent>(nullptr, nullptr, time_ms);
  absl::MutexLock lock(&mu_);
  return PutLocked(std::move(event), /*replace=*/false);
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
  EventWriter::Batch batch;
  size_t bytes = 0;
  const size_t most = std::max<size_t>(options_.max_batch, 1);
  while (!order_.empty() && batch.size() < most) {
    auto it = entries_.find(order_.front());
    const size_t size = it->second->size_hint();
    if (!batch.empty() && options_.max_batch_bytes > 0 &&
        bytes + size > options_.max_batch_bytes) {
      break;
    }
    bytes += size;
    batch.push_back(std::move(it->second));
    entries_.erase(it);
    order_.pop_front();
  }
  writing_ = true;
  EventWriter* writer = writer_;
  mu_.Unlock();
  // Unlocked: FinishStream waits while writing_, so the writer lives on.
  writer->WriteEvents(std::move(batch));
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
  to_wake_.erase(std::remove_if(to_wake_.begin(), to_wake_.end(),
                                [&](const Wake& w) { return gone(w.queue); }),
                 to_wake_.end());
  watchers_.store(static_cast<int>(queues_.size()), std::memory_order_relaxed);
}

void EventHub::PublishJob(v1::Job job, int64_t time_ms) {
  Publish(std::make_shared<const WatchEvent>(
      std::make_shared<const v1::Job>(std::move(job)), nullptr, time_ms));
}

void EventHub::PublishWorker(v1::WorkerInfo worker, int64_t time_ms) {
  Publish(std::make_shared<const WatchEvent>(
      nullptr, std::make_shared<const v1::WorkerInfo>(std::move(worker)),
      time_ms));
}

void EventHub::Publish(const std::shared_ptr<const WatchEvent>& event) {
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::InfinitePast();
  for (const auto& q : queues_) {
    if (!q->Put(event)) continue;
    absl::Time due = now;
    if (const int linger = q->options().linger_ms; linger > 0) {
      if (now == absl::InfinitePast()) now = absl::Now();
      due = now + absl::Milliseconds(linger);
    }
    to_wake_.push_back(Wake{due, q});
    earliest_due_ = std::min(earliest_due_, due);
  }
}

void EventHub::WakeLoop() {
  for (;;) {
    std::vector<std::shared_ptr<WatchQueue>> batch;
    {
      absl::MutexLock lock(&mu_);
      // Sleeps until the earliest due wake, or until one earlier than it
      // is added (earliest_due_ drops), or the hub stops.
      while (!stopping_) {
        const absl::Time due = earliest_due_;
        if (due <= absl::Now()) break;
        auto changed = [this, due]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || earliest_due_ < due;
        };
        if (due == absl::InfiniteFuture()) {
          mu_.Await(absl::Condition(&changed));
        } else {
          mu_.AwaitWithDeadline(absl::Condition(&changed), due);
        }
      }
      if (stopping_) return;
      const absl::Time now = absl::Now();
      absl::Time next = absl::InfiniteFuture();
      std::vector<Wake> later;
      for (Wake& w : to_wake_) {
        if (w.due <= now) {
          batch.push_back(std::move(w.queue));
        } else {
          next = std::min(next, w.due);
          later.push_back(std::move(w));
        }
      }
      to_wake_.swap(later);
      earliest_due_ = next;
    }
    for (const auto& q : batch) q->Pump();
  }
}

}  // namespace dlbatch::scheduler
