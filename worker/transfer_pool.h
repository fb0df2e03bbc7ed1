// Threads for the worker's transfers (attachment fetches, output and
// checkpoint uploads, removing a job's folder), fair between jobs: each job
// has a queue of its own, run one task at a time, and the queues are served
// round-robin. A thread is added whenever a job has work and every thread is
// busy (up to max_threads), so a job moving a huge output holds one thread
// and never delays another job's start or end.
#ifndef DLBATCH_WORKER_TRANSFER_POOL_H_
#define DLBATCH_WORKER_TRANSFER_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::worker {

class TransferPool {
 public:
  explicit TransferPool(int max_threads = 64);
  ~TransferPool();  // Stop()s, then joins; queued tasks are dropped
  TransferPool(const TransferPool&) = delete;
  TransferPool& operator=(const TransferPool&) = delete;

  // Queues `task` behind the job's earlier ones. Thread-safe.
  void Post(int64_t job_key, std::function<void()> task);
  // Drops queued tasks; running ones finish (they should see their own
  // stop signal). Thread-safe.
  void Stop();
  // Tasks queued or running (tests).
  size_t pending() const;
  int threads() const;

 private:
  struct Queue {
    std::deque<std::function<void()>> tasks;
    bool busy = false;  // a thread runs one of its tasks
  };
  void Loop();
  // REQUIRES mu_. The next job after `cursor_` with work and no task running.
  bool Runnable() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Queue> queues_ ABSL_GUARDED_BY(mu_);
  int64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;  // last job served
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_TRANSFER_POOL_H_
