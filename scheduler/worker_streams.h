// The worker streams: what workers say (registrations, diary lines, ends,
// progress, checkpoints, answers about users) and their streams' ends,
// handled on the scheduler's loop thread a batch at a time, and the
// liveness check that declares silent workers lost. The Scheduler queues
// each stream's messages (OnWorkerMessage, OnWorkerGone) and its loop
// hands them here.
//
// Lock story. WorkerStreams owns no lock. What it keeps lives in the shared
// state under the scheduler's mu_ (scheduler_state.h), so that clang
// checks it against that lock: which worker each stream is
// (session_worker_), each worker's liveness (WorkerState), each running
// job's diary budget (ActiveJob::diary). Its entry points, ProcessBatch and
// CheckLiveness, run on the loop thread alone; each takes mu_, handles
// everything in one transaction (a batch's messages, or the workers found
// lost), commits, places jobs, and sends the acknowledgements and what
// placement decided only once mu_ is released, the acknowledgements only
// after the commit that makes them true. The hooks below them run under
// mu_ and take the state as `s` (ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_));
// they take no other lock but the leaves the state's helpers take.
#ifndef DLBATCH_SCHEDULER_WORKER_STREAMS_H_
#define DLBATCH_SCHEDULER_WORKER_STREAMS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/scheduler_state.h"

namespace dlbatch::scheduler {

// A message of a worker's stream, or (message empty) the stream's end.
struct WorkerEvent {
  std::shared_ptr<WorkerSession> session;
  std::optional<v1::WorkerMessage> message;
};

class WorkerStreams {
 public:
  using ActiveJob = SchedulerState::ActiveJob;
  using WorkerState = SchedulerState::WorkerState;
  using Outbox = SchedulerState::Outbox;

  // `state` must outlive the WorkerStreams.
  explicit WorkerStreams(SchedulerState& state) : state_(state) {}
  WorkerStreams(const WorkerStreams&) = delete;
  WorkerStreams& operator=(const WorkerStreams&) = delete;

  // ---- the loop thread ----
  // Handles a batch of events in one transaction; a failure of the store
  // drops the batch (memory reloaded) and the workers resend.
  void ProcessBatch(std::deque<WorkerEvent>& batch)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Declares workers silent for over heartbeat_timeout_ms lost (their jobs
  // requeued), then forgets those lost too long (Control).
  void CheckLiveness() ABSL_LOCKS_EXCLUDED(state_.mu_);

 private:
  // All REQUIRE a transaction open.
  // One worker message inside the batch's transaction. A failure tied to
  // the message is refused once (undone, acknowledged, its reason in the
  // job's diary); only a failure of the store as a whole is returned.
  absl::Status HandleEvent(SchedulerState& s, WorkerEvent& event, Outbox* out,
                           Outbox* acks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  absl::Status HandleRegister(SchedulerState& s,
                              const std::shared_ptr<WorkerSession>& session,
                              const v1::Register& reg, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // A worker of a Slurm batch job registered: it joins its job's gang, and
  // the job starts on the gang's parts once every node's worker is in
  // (SlurmBridge::Join).
  absl::Status JoinSlurmGang(SchedulerState& s, const WorkerState& worker,
                             const v1::Register& reg, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  absl::Status HandleEnded(SchedulerState& s, int64_t worker_id,
                           const v1::JobEnded& ended, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The job a worker's report is about if it is the attempt and part that
  // worker runs now; null for a stale report.
  ActiveJob* ReportedJob(SchedulerState& s, int64_t worker_id, int64_t job_id,
                         int attempt, int part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  absl::Status HandleProgress(SchedulerState& s, int64_t worker_id,
                              const v1::JobProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  absl::Status HandleCheckpoint(SchedulerState& s, int64_t worker_id,
                                const v1::CheckpointStored& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // A worker's stream ended. A Slurm job's worker that runs nothing more
  // is forgotten (it serves one job and never returns).
  absl::Status HandleGone(SchedulerState& s,
                          const std::shared_ptr<WorkerSession>& session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  absl::Status LoseWorker(SchedulerState& s, WorkerState& worker,
                          const std::string& why, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Start latency for the metrics: a worker said something about a job.
  void NoteReport(SchedulerState& s, const v1::WorkerMessage& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // ---- diary lines (worker_diary.cc) ----
  absl::Status HandleDiary(SchedulerState& s, const v1::DiaryBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Stores lines within the job's diary cap (SchedulerOptions::
  // max_diary_bytes).
  absl::Status StoreCappedDiary(SchedulerState& s, ActiveJob& job,
                                const v1::DiaryBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  absl::Status LoadDiaryBudget(SchedulerState& s, ActiveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  SchedulerState& state_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_WORKER_STREAMS_H_
