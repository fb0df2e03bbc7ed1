#include "worker/transfer_pool.h"

#include <utility>

namespace dlbatch::worker {

TransferPool::TransferPool(int max_threads)
    : max_threads_(max_threads < 1 ? 1 : max_threads) {}

TransferPool::~TransferPool() {
  Stop();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

void TransferPool::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [key, q] : queues_) {
    pending_ -= q.tasks.size();
    q.tasks.clear();
  }
}

void TransferPool::Post(int64_t job_key, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  Queue& q = queues_[job_key];
  q.tasks.push_back(std::move(task));
  ++pending_;
  // More runnable jobs than idle threads to take them: add one.
  int runnable = 0;
  for (const auto& [k, other] : queues_)
    runnable += !other.busy && !other.tasks.empty();
  if (runnable > idle_ && static_cast<int>(threads_.size()) < max_threads_)
    threads_.emplace_back([this] { Loop(); });
}

size_t TransferPool::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

int TransferPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

bool TransferPool::Runnable() const {
  for (const auto& [key, q] : queues_) {
    if (!q.busy && !q.tasks.empty()) return true;
  }
  return false;
}

void TransferPool::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    ++idle_;
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || Runnable();
    };
    mu_.Await(absl::Condition(&ready));
    --idle_;
    if (stopping_) return;
    // Round-robin: the first runnable job after the last one served.
    auto it = queues_.upper_bound(cursor_);
    for (size_t n = 0; n <= queues_.size(); ++n, ++it) {
      if (it == queues_.end()) it = queues_.begin();
      if (!it->second.busy && !it->second.tasks.empty()) break;
    }
    const int64_t key = it->first;
    cursor_ = key;
    std::function<void()> task = std::move(it->second.tasks.front());
    it->second.tasks.pop_front();
    it->second.busy = true;
    mu_.Unlock();
    task();
    task = nullptr;
    mu_.Lock();
    --pending_;
    auto q = queues_.find(key);
    q->second.busy = false;
    if (q->second.tasks.empty()) queues_.erase(q);
  }
}

}  // namespace dlbatch::worker
