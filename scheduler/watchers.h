// The WatchEvents streams (`dlbatch monitor`, the web face): the snapshot
// a new stream starts with, each change of a job or worker published to
// every open stream, and the views of jobs and workers they carry, with
// why a queued job waits (which GetJob and ListJobs show too). Reached as
// Scheduler::watchers(); every part publishes through it as it changes a
// job (SchedulerState::Changed) or a worker.
//
// Lock story. Watchers owns the event hub (event_hub.h), whose own lock is
// a leaf: publishing takes it under mu_, briefly, and writing to a stream
// never holds mu_. The index of the workers each running job holds
// (watched_slots_) lives in the shared state under mu_
// (scheduler_state.h), so that clang checks it against that lock; it is
// rebuilt by the first watcher and kept current while any watches. Watch
// takes mu_ for the snapshot of memory and subscribes under it, so no
// change falls between the snapshot and the stream; the ended jobs it adds
// are read from the store after mu_ is released. The hooks run under mu_
// and take the state as `s` (ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_)); they
// are cheap when nobody watches.
#ifndef DLBATCH_SCHEDULER_WATCHERS_H_
#define DLBATCH_SCHEDULER_WATCHERS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/event_hub.h"
#include "scheduler/scheduler_state.h"

namespace dlbatch::scheduler {

class Watchers {
 public:
  using ActiveJob = SchedulerState::ActiveJob;
  using WorkerState = SchedulerState::WorkerState;

  // `state` must outlive the Watchers.
  explicit Watchers(SchedulerState& state) : state_(state) {}
  Watchers(const Watchers&) = delete;
  Watchers& operator=(const Watchers&) = delete;

  // ---- WatchEvents streams; any thread ----
  // Adds a stream: its queue holds the snapshot (running jobs, up to
  // kWatchQueuedJobs queued ones, the most recently ended, every worker)
  // closed by snapshot_done, then every change as it is published. The
  // caller starts it with Pump() and calls Unwatch when the stream is done.
  // With options.only_job, the snapshot is that job alone (from memory, or
  // the store once it ended) and snapshot_done: nothing is built for the
  // other jobs and workers, now or as they change.
  absl::StatusOr<std::shared_ptr<WatchQueue>> Watch(
      const v1::WatchEventsRequest& request, EventWriter* writer,
      const WatchOptions& options = {}) ABSL_LOCKS_EXCLUDED(state_.mu_);
  void Unwatch(const WatchQueue* queue);

  // ---- hooks; mu_ held ----
  // Hands the job's current state to the streams, with the workers whose
  // slots it took or freed. Changed() calls it; call it directly after a
  // change to a job's record that does not go through Changed() (such as
  // new progress).
  void PublishJob(SchedulerState& s, int64_t job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The same for a worker that joined, left or was lost.
  void PublishWorker(SchedulerState& s, int64_t worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // A worker forgotten (removed): the streams drop it.
  void PublishRemoved(SchedulerState& s, const WorkerState& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Memory was reloaded (Recover): every job and worker as it is now.
  void PublishAll(SchedulerState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // A job as the streams show it: the spec cut to its summary, the live
  // state and wait reason, worker names.
  v1::Job JobView(const SchedulerState& s, const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  v1::WorkerInfo WorkerView(const SchedulerState& s,
                            const WorkerState& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Why a queued job waits: held or --after, Slurm's reason, the user's
  // limit, the workers it waits for, the slots and jobs ahead.
  std::string WaitReason(const SchedulerState& s, const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The same with the placement core's answer for it already in hand
  // (PlacementCore::ExplainMany, for listings).
  std::string WaitReason(const SchedulerState& s, const ActiveJob& job,
                         const std::optional<WaitInfo>& explained) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

 private:
  SchedulerState& state_;
  EventHub events_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_WATCHERS_H_
