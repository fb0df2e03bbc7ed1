// Preemption, as the scheduler carries it out: after each placement pass,
// the first job of each profile with preemption on that could not start
// (PlacementCore::FirstBlocked) is weighed against the running jobs
// (ChooseVictims, scheduler/core/preemption.h); the victims are asked to
// stop (CancelJob with preempt: a train job checkpoints at the signal, a
// command job gets its preempt_signal, both are killed at the grace), and
// each is queued again as it stops, as a new attempt that does not count
// against --max-attempts, resuming from its newest stored checkpoint. The
// waiting job then starts on the slots they free.
//
// On a profile of Slurm the jobs wait in Slurm's queue, not the core's: the
// bridge says, after each reconcile, which of them Slurm holds for
// resources and what the partition's nodes hold (SlurmPass); the victims'
// workers, in their Slurm jobs, are asked to stop the same way, and their
// Slurm jobs end as the workers leave (or, past the grace, by scancel:
// the bridge's EndStopping).
//
// What it keeps: each job's preemptions (ActiveJob::preemptions, a
// v1.Preemption each, in the store's `preemptions` table, committed with
// the diary lines and the state they change), so a scheduler killed in the
// middle of one resumes it: the victims still running are asked again
// when their workers register, and the waiting job's "preempting jobs 3
// and 4" is rebuilt from the victims' open records (preempting_for_).
//
// Lock story. Preemptions owns no lock. Its data lives in the shared state
// under the scheduler's mu_ (scheduler_state.h: ActiveJob::preemptions,
// checkpoint_ms, preempting_for_); every function here runs under it, takes
// the state as `s` and writes only inside the caller's transaction (Pass
// opens its own).
#ifndef DLBATCH_SCHEDULER_PREEMPTIONS_H_
#define DLBATCH_SCHEDULER_PREEMPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/preemption.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/slurm/host.h"

namespace dlbatch::scheduler {

class Preemptions {
 public:
  using ActiveJob = SchedulerState::ActiveJob;
  using Outbox = SchedulerState::Outbox;

  Preemptions() = default;
  Preemptions(const Preemptions&) = delete;
  Preemptions& operator=(const Preemptions&) = delete;

  // Reads the active jobs' preemptions (after the jobs are loaded) and
  // rebuilds preempting_for_ from the open ones.
  absl::Status Load(SchedulerState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // After a placement pass: for each profile with preemption on, its first
  // blocked job may preempt (see the header comment). Commits in a
  // transaction of its own; the CancelJobs go into `out`. REQUIRES: no
  // transaction open.
  absl::Status Pass(SchedulerState& s, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // A profile of Slurm, as its bridge found it (SlurmPreemptionView): the
  // first of its jobs that Slurm holds for resources, in dlbatch's order
  // (priority, then submission), may preempt its running jobs there
  // (ChooseVictimsOnNodes), and they are stopped as on workers. Commits in
  // a transaction of its own; the CancelJobs go into `out`. REQUIRES: no
  // transaction open.
  absl::Status SlurmPass(SchedulerState& s,
                         const slurm::SlurmPreemptionView& view, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // Records a preemption of the job's current attempt, now: `p`'s by_job,
  // by_priority and kind as given, killed `grace_ms` from now. REQUIRES: a
  // transaction open.
  absl::Status Open(SchedulerState& s, ActiveJob& job, int64_t grace_ms,
                    v1::Preemption p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // The job's current attempt is stopping for a preemption.
  static bool Stopping(const ActiveJob& job);
  // The CancelJob that asks part `part` of a stopping job to stop (again,
  // to a worker registering after a restart). REQUIRES: Stopping(job).
  v1::SchedulerMessage StopMessage(const SchedulerState& s,
                                   const ActiveJob& job, int part) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // A stopping job's parts have all ended (reported by its workers, or its
  // worker lost: `lost` says why, empty if reported): it is queued again
  // as preempted. Its slots are released already. REQUIRES: Stopping(job),
  // not cancelled; a transaction open.
  absl::Status Requeue(SchedulerState& s, ActiveJob& job,
                       const std::string& lost, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // A stopping job ended otherwise (finished before it stopped, or was
  // cancelled): its preemption did not happen and its record goes; the
  // job it made room for may preempt again. REQUIRES: a transaction open.
  absl::Status Abandon(SchedulerState& s, ActiveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The job started or left the queue: it preempts no more.
  void Forget(SchedulerState& s, int64_t job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

  // Attempts of the job that ended in a preemption: not counted against
  // --max-attempts.
  static int PreemptedAttempts(const ActiveJob& job);
  // A queued job's wait while its victims stop: "preempting jobs 3 and 4
  // (checkpointing; at most 2m)"; empty when it preempts none.
  std::string WaitReason(const SchedulerState& s, const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

 private:
  // The chosen victims of each waiting job are asked to stop, committed
  // in one transaction; then their CancelJobs go into `out`.
  struct Chosen {
    int64_t waiting;
    std::vector<Victim> victims;
    const PreemptionPolicy* policy;
  };
  absl::Status Carry(SchedulerState& s, const std::vector<Chosen>& chosen,
                     Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // What the core does not keep about the running job `id` (its
  // preemptibility now, its newest checkpoint).
  static RunningFacts FactsOf(const SchedulerState& s, JobId id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Asks `victim` to stop for `waiting`, by `kind`. REQUIRES: a transaction
  // open.
  absl::Status Start(SchedulerState& s, ActiveJob& victim,
                     const ActiveJob& waiting, PreemptionKind kind,
                     const PreemptionPolicy& policy, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The policy of the job's profile; null when it preempts nothing.
  static const PreemptionPolicy* PolicyOf(const SchedulerState& s,
                                          const std::string& profile);
  // Drops `victim` from what its preemptor waits for.
  static void Release(SchedulerState& s, const v1::Preemption& p,
                      int64_t victim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_PREEMPTIONS_H_
