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
//
// Each change is published as one WatchEvent shared by every queue, so the
// cost per stream is a pointer in its queue; what a stream renders of an
// entry is made once for all streams (WatchEvent::Text). A stream may take
// everything pending in one write (WatchOptions), and wait a little after
// its first new entry for more (linger), so that many open streams cost
// a few writes a second each rather than one per change.
#ifndef DLBATCH_SCHEDULER_EVENT_HUB_H_
#define DLBATCH_SCHEDULER_EVENT_HUB_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::scheduler {

// One entry of the streams: a job's or worker's state, or the end of a
// snapshot. Immutable, and shared by every stream it was published to, so
// that what a stream writes of it (a web stream's JSON) is made once for
// all of them: Text() keeps one rendering per variant.
class WatchEvent {
 public:
  // Renderings kept per entry (the web streams': the job as its owner and
  // admins see it, and as everyone else does).
  static constexpr int kTextVariants = 2;

  // Exactly one of `job` and `worker`, or neither for snapshot_done.
  WatchEvent(std::shared_ptr<const v1::Job> job,
             std::shared_ptr<const v1::WorkerInfo> worker, int64_t time_ms);
  WatchEvent(const WatchEvent&) = delete;
  WatchEvent& operator=(const WatchEvent&) = delete;

  const v1::Job* job() const { return job_.get(); }
  const v1::WorkerInfo* worker() const { return worker_.get(); }
  bool snapshot_done() const { return !job_ && !worker_; }
  int64_t time_ms() const { return time_ms_; }
  // The entry's protobuf size, taken once: what bounds a batch.
  size_t size_hint() const { return size_hint_; }
  // A copy as the gRPC stream carries it.
  v1::ClusterEvent ToProto() const;
  // Rendering `variant` (< kTextVariants): `make()` the first time any
  // thread asks for it, the same string after (others asking meanwhile
  // wait). Every caller of one variant must mean the same text: `make`
  // may depend on the entry and the variant only.
  const std::string& Text(int variant,
                          absl::FunctionRef<std::string()> make) const;

 private:
  const std::shared_ptr<const v1::Job> job_;
  const std::shared_ptr<const v1::WorkerInfo> worker_;
  const int64_t time_ms_;
  const size_t size_hint_;
  mutable std::array<absl::once_flag, kTextVariants> made_;
  mutable std::array<std::string, kTextVariants> text_;
};

// The writing end of one stream (the gRPC reactor, a web event stream).
// The queue serialises the calls: at most one WriteEvents in flight,
// FinishStream only while none is, and none after Detach.
class EventWriter {
 public:
  using Batch = std::vector<std::shared_ptr<const WatchEvent>>;
  virtual ~EventWriter() = default;
  // Starts writing `events`, in order (at least one; at most the queue's
  // WatchOptions allow); must not block. The writer calls
  // WatchQueue::OnWritten once the write completes.
  virtual void WriteEvents(Batch events) = 0;
  // Ends the stream; must not block. Called once.
  virtual void FinishStream() = 0;
};

// What one stream takes from the hub, and how it writes.
struct WatchOptions {
  // Non-zero: only this job's entries (and snapshot_done); every other
  // job's and every worker's are dropped as they are put, before anything
  // is made of them.
  int64_t only_job = 0;
  // One write takes up to this many pending entries, and past the first
  // only while the sum of their size hints stays within max_batch_bytes
  // (0: no bound). 1: one entry per write (the gRPC stream).
  size_t max_batch = 1;
  size_t max_batch_bytes = 0;
  // A queue that was idle is pumped this long after its first new entry,
  // so that what comes meanwhile goes out in the same write (0: at once).
  // Writes that follow a completed one are never delayed.
  int linger_ms = 0;
};

// One stream's pending entries and write state. Thread-safe.
class WatchQueue {
 public:
  // `writer` is borrowed until Detach().
  explicit WatchQueue(EventWriter* writer, WatchOptions options = {})
      : options_(options), writer_(writer) {}
  WatchQueue(const WatchQueue&) = delete;
  WatchQueue& operator=(const WatchQueue&) = delete;

  // ---- producers ----
  // Each replaces the pending entry of the same job or worker (keeping its
  // place in line) or appends one. Returns true if the queue was idle, in
  // which case the caller must arrange a Pump() (the hub does). An entry
  // the options filter out is dropped (false).
  bool Put(std::shared_ptr<const WatchEvent> event);
  bool PutJob(std::shared_ptr<const v1::Job> job, int64_t time_ms);
  bool PutWorker(std::shared_ptr<const v1::WorkerInfo> worker, int64_t time_ms);
  // Appends a job only if none is pending for it (snapshot rows read from
  // the store, older than anything published since).
  bool PutJobIfAbsent(std::shared_ptr<const v1::Job> job, int64_t time_ms);
  bool PutSnapshotDone(int64_t time_ms);

  // ---- the writer's side ----
  // Starts the next write (of up to the options' batch of pending
  // entries) if none is in flight and one is pending; otherwise marks the
  // queue idle so that the next Put asks for a Pump. A new queue is not
  // idle: producers can fill it (the snapshot) before its first Pump.
  void Pump();
  // The write started by Pump completed; !ok: the stream is broken.
  void OnWritten(bool ok);
  // Finishes the stream as soon as no write is in flight.
  void Close();
  // The writer is gone; every later call is a no-op for it.
  void Detach();

  const WatchOptions& options() const { return options_; }
  size_t pending() const;
  bool closed() const;

 private:
  // kind 0: job, 1: worker, 2: snapshot_done.
  using Key = std::pair<int, int64_t>;
  bool Wanted(const WatchEvent& event) const;
  bool PutLocked(std::shared_ptr<const WatchEvent> event, bool replace)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes if asked to and no write is in flight; releases the lock.
  void MaybeFinish() ABSL_UNLOCK_FUNCTION(mu_);

  const WatchOptions options_;
  mutable absl::Mutex mu_;
  EventWriter* writer_ ABSL_GUARDED_BY(mu_);  // null once detached
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::shared_ptr<const WatchEvent>> entries_
      ABSL_GUARDED_BY(mu_);
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

  // Hand the entry, made once, to every queue. Never block on a stream.
  void PublishJob(v1::Job job, int64_t time_ms);
  void PublishWorker(v1::WorkerInfo worker, int64_t time_ms);

 private:
  struct Wake {
    absl::Time due;
    std::shared_ptr<WatchQueue> queue;
  };
  void Publish(const std::shared_ptr<const WatchEvent>& event);
  void WakeLoop();

  absl::Mutex mu_;
  std::vector<std::shared_ptr<WatchQueue>> queues_ ABSL_GUARDED_BY(mu_);
  // Queues to pump, each at its due time (its linger after the entry that
  // woke it); the earliest due, for the wake thread's sleep.
  std::vector<Wake> to_wake_ ABSL_GUARDED_BY(mu_);
  absl::Time earliest_due_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> watchers_{0};
  std::thread waker_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_EVENT_HUB_H_
