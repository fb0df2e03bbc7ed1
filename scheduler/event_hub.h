// Fans the scheduler's job and worker changes out to WatchEvents streams
// (`dlbatch monitor`).
//
// Each stream owns a WatchQueue that holds at most one pending entry per job
// and per worker; a newer state replaces the pending one in place. So a
// stream that reads slowly costs memory bounded by the jobs and workers that
// changed since it last caught up, never by the number of changes, and it
// always ends up with the latest state.
//
// The scheduler publishes under its own lock; publishing only updates
// queues. Writes are started from the hub's wake thread or from the
// completion of the previous write, never under the scheduler's lock.
#ifndef DLBATCH_SCHEDULER_EVENT_HUB_H_
#define DLBATCH_SCHEDULER_EVENT_HUB_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::scheduler {

// The writing end of one stream (the gRPC reactor). The queue serialises
// the calls: at most one WriteEvent in flight, FinishStream only while none
// is, and none after Detach.
class EventWriter {
 public:
  virtual ~EventWriter() = default;
  // Starts writing `event`; must not block. The writer calls
  // WatchQueue::OnWritten once the write completes.
  virtual void WriteEvent(v1::ClusterEvent event) = 0;
  // Ends the stream; must not block. Called once.
  virtual void FinishStream() = 0;
};

// One stream's pending entries and write state. Thread-safe.
class WatchQueue {
 public:
  // `writer` is borrowed until Detach().
  explicit WatchQueue(EventWriter* writer) : writer_(writer) {}
  WatchQueue(const WatchQueue&) = delete;
  WatchQueue& operator=(const WatchQueue&) = delete;

  // ---- producers ----
  // Each replaces the pending entry of the same job or worker (keeping its
  // place in line) or appends one. Returns true if the queue was idle, in
  // which case the caller must arrange a Pump() (the hub does).
  bool PutJob(std::shared_ptr<const v1::Job> job, int64_t time_ms);
  bool PutWorker(std::shared_ptr<const v1::WorkerInfo> worker, int64_t time_ms);
  // Appends a job only if none is pending for it (snapshot rows read from
  // the store, older than anything published since).
  bool PutJobIfAbsent(std::shared_ptr<const v1::Job> job, int64_t time_ms);
  bool PutSnapshotDone(int64_t time_ms);

  // ---- the writer's side ----
  // Starts the next write if none is in flight and one is pending;
  // otherwise marks the queue idle so that the next Put asks for a Pump.
  // A new queue is not idle: producers can fill it (the snapshot) before
  // its first Pump.
  void Pump();
  // The write started by Pump completed; !ok: the stream is broken.
  void OnWritten(bool ok);
  // Finishes the stream as soon as no write is in flight.
  void Close();
  // The writer is gone; every later call is a no-op for it.
  void Detach();

  size_t pending() const;
  bool closed() const;

 private:
  // kind 0: job, 1: worker, 2: snapshot_done.
  using Key = std::pair<int, int64_t>;
  struct Entry {
    std::shared_ptr<const v1::Job> job;
    std::shared_ptr<const v1::WorkerInfo> worker;
    int64_t time_ms = 0;
  };
  bool PutLocked(Key key, Entry entry, bool replace)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes if asked to and no write is in flight; releases the lock.
  void MaybeFinish() ABSL_UNLOCK_FUNCTION(mu_);

  mutable absl::Mutex mu_;
  EventWriter* writer_ ABSL_GUARDED_BY(mu_);  // null once detached
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool idle_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Which workers each running job holds, so a worker's WorkerInfo can be
// rebuilt without scanning every job. Not thread-safe (the scheduler's lock).
class WorkerJobsIndex {
 public:
  // Replaces the workers `job` holds; returns the workers whose list changed.
  std::vector<int64_t> Set(int64_t job, std::vector<int64_t> workers);
  // The jobs on `worker`, ascending.
  std::vector<int64_t> Jobs(int64_t worker) const;
  void Clear();

 private:
  std::unordered_map<int64_t, std::vector<int64_t>> job_workers_;
  std::map<int64_t, std::map<int64_t, int>> worker_jobs_;  // worker -> job -> 1
};

class EventHub {
 public:
  EventHub();
  ~EventHub();  // REQUIRES: no queue is still added
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  void Add(std::shared_ptr<WatchQueue> queue);
  void Remove(const WatchQueue* queue);
  // Cheap; lets the scheduler skip building what nobody watches.
  bool has_watchers() const {
    return watchers_.load(std::memory_order_relaxed) > 0;
  }

  // Hand the entry to every queue. Never block on a stream.
  void PublishJob(v1::Job job, int64_t time_ms);
  void PublishWorker(v1::WorkerInfo worker, int64_t time_ms);

 private:
  void WakeLoop();
  bool WakeDue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::vector<std::shared_ptr<WatchQueue>> queues_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<WatchQueue>> to_wake_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> watchers_{0};
  std::thread waker_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_EVENT_HUB_H_
