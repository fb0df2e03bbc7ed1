// Worker administration (drain, resume, remove, forgetting workers lost
// too long) and job control (hold, release, requeue, --after): the
// scheduler's side of `dlbatch admin drain|resume|remove`, `dlbatch
// hold|release|requeue` and `submit --after`. Reached as
// Scheduler::control(); the other parts call its hooks as jobs end, wait
// and are explained, and as workers are lost or leave for good.
//
// Lock story. Control owns no lock. What it keeps lives in the shared
// state under the scheduler's mu_ (scheduler_state.h), so that clang
// checks it against that lock: each job's held, after and
// requeue_requested (ActiveJob), the set of jobs waiting for others
// (waiting_after_, after_dirty_: Submit adds to it and EndJob marks it, the
// rest is Control's), each worker's draining (WorkerState), the names of
// removed workers refused once (refuse_once_), and their rows in the store
// (drains, job controls). Its entry points (DrainWorker, RemoveWorker,
// ControlJobs) take mu_ themselves, change memory and the store in one
// transaction, place jobs, and send what that caused once mu_ is released.
// Its hooks run under mu_ and take the state as `s`
// (ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_)); they take no other lock but the
// leaves the state's helpers take.
#ifndef DLBATCH_SCHEDULER_CONTROL_H_
#define DLBATCH_SCHEDULER_CONTROL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/placement.h"
#include "scheduler/scheduler_state.h"

namespace dlbatch::scheduler {

class Control {
 public:
  using ActiveJob = SchedulerState::ActiveJob;
  using WorkerState = SchedulerState::WorkerState;
  using Outbox = SchedulerState::Outbox;

  // `state` must outlive the Control.
  explicit Control(SchedulerState& state) : state_(state) {}
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  // ---- entry points; any thread ----
  // Drains (drain true) or resumes the worker named `name` (or numbered):
  // a drained one takes no new jobs; kept in the store by name.
  absl::StatusOr<v1::WorkerInfo> DrainWorker(const std::string& name,
                                             bool drain,
                                             const std::string& reason)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Forgets a worker that is offline, or drained and idle; its slots leave
  // its profile, and queued jobs that can no longer ever run fail.
  absl::StatusOr<v1::RemoveWorkerReply> RemoveWorker(const std::string& name)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Hold, release or requeue each job (the caller checked who may).
  absl::StatusOr<v1::ControlJobsReply> ControlJobs(
      const v1::ControlJobsRequest& request) ABSL_LOCKS_EXCLUDED(state_.mu_);

  // ---- hooks; mu_ held ----
  // After Load's workers and jobs: drains and job control from the store.
  absl::Status Load(SchedulerState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The worker named `name`, or numbered; null if none.
  WorkerState* FindWorkerNamed(SchedulerState& s, const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Drops a worker from memory, the core and the store, then fails the
  // queued jobs that can no longer ever run (their ids in *failed).
  // REQUIRES: a transaction open.
  absl::Status ForgetWorker(SchedulerState& s, int64_t worker_id,
                            const std::string& why,
                            std::vector<int64_t>* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Forgets workers lost longer than options_.forget_offline_ms, in a
  // transaction of its own. REQUIRES: no transaction open.
  void ForgetOffline(SchedulerState& s, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Stores the job's held, after and requeue_requested.
  absl::Status SaveControl(SchedulerState& s, const ActiveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // A running job whose requeue was asked has ended: queued again.
  absl::Status RequeueAsked(SchedulerState& s, ActiveJob& job, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Jobs waiting for others (--after) whose answer may have changed:
  // enqueued when all finished, failed when one did not. In a transaction
  // of its own. REQUIRES: no transaction open.
  absl::Status ResolveAfter(SchedulerState& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The wait reason of a held or --after job; empty otherwise.
  std::string ControlWaitReason(const SchedulerState& s,
                                const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The wait reason of a job that fits only with workers that take no jobs
  // now (draining or offline ones, each named); empty otherwise.
  std::string WorkersWaitReason(const SchedulerState& s,
                                const WaitInfo& info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Names workers in the core's messages, with since when each offline
  // one is. Call the labeler only under mu_, while `s` lives.
  WorkerLabeler Labels(const SchedulerState& s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

 private:
  // Queues a job that ended (failed, cancelled) again.
  absl::Status RequeueEnded(SchedulerState& s, int64_t job_id,
                            v1::ControlResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  SchedulerState& state_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CONTROL_H_
