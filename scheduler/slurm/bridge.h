// The scheduler's bridge to Slurm: the thread that submits the queued jobs
// of Slurm profiles with sbatch and reconciles squeue with them, and all the
// state of those jobs' Slurm jobs — their records (each with its one-job
// credential), the launches, the gangs of their workers, Slurm's reasons,
// the ends that wait for Slurm's word. It reaches the scheduler's jobs and
// workers only through SlurmHost (host.h), and wraps the pure cores of this
// folder (PlanBatch, ShapeOfGang, SlurmGang, Reconcile) the way the worker's
// Worker wraps its JobTable: they decide, the bridge carries it out through
// the host.
//
// Lock story. Two locks, always taken in this order:
//  1. The host's lock, host_->mutex() (the Scheduler's mu_). It guards the
//     host's jobs and workers and, with them, the bridge's state that the
//     host's own paths read or change in the same critical section, often in
//     the same transaction: registrations (RecordOf, Join), ends of parts
//     (SettlesWithSlurm, BeginSettling, EndSettling), departures
//     (WorkerLeft, Departed), wait reasons, loads and reloads. That is every
//     member marked GUARDED_BY(host_->mutex()) below; one lock keeps each of
//     those steps atomic, as it always was.
//  2. The bridge's own mu_, ACQUIRED_AFTER the host's: the Slurm thread's
//     wake-up (poked_, stopping_) and sinfo's cached limits. It is taken
//     with the host's lock held (Poke, from Enqueue or a departure) or
//     alone; the host's lock is never taken while it is held, and it is
//     never held across a call of Slurm's tools.
//  No lock guards what Start sets before the thread starts (tool_ is atomic
//  for the readers on other threads), nor the Slurm thread's own
//  (lingering_, left_alone_).
//
// Who calls what:
//  - REQUIRES(host_->mutex()): the host's paths, with the lock held. Such a
//    method neither takes the host's lock nor blocks nor runs Slurm's
//    tools; Join writes inside the transaction its caller opened.
//  - EXCLUDES(host_->mutex()): any thread without the host's lock; such a
//    method takes it itself, briefly (Put, Forget), or runs sinfo
//    (CheckSubmit, View).
//  - The Slurm thread holds the host's lock only in short sections, never
//    across sbatch, squeue, sinfo or scancel, and calls the host only
//    there; the messages to workers its changes cause go out once the lock
//    is released (SlurmHost::WithLock). Called so, the host may call back
//    the REQUIRES methods (an end as reported ends the job's settling) and
//    no others.
// clang's -Wthread-safety checks this: the state below names the lock
// host_->mutex(), the host's methods require it, and the Scheduler, whose
// mu_ it is, asserts so (SchedulerState::SlurmLockHeld, on host_mutex())
// before it calls a REQUIRES method.
#ifndef DLBATCH_SCHEDULER_SLURM_BRIDGE_H_
#define DLBATCH_SCHEDULER_SLURM_BRIDGE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/gang.h"
#include "scheduler/slurm/host.h"
#include "scheduler/slurm/launcher.h"
#include "scheduler/slurm/preempt.h"
#include "scheduler/slurm/reconciler.h"
#include "scheduler/slurm/tool.h"

namespace dlbatch::scheduler::slurm {

struct SlurmBridgeOptions {
  std::vector<SlurmProfile> profiles;  // the host's profiles of Slurm
  // While a job of a Slurm profile exists, squeue is read this often.
  int64_t poll_ms = 2000;
  // Submissions of a job whose Slurm job fails before it starts, at most.
  int max_attempts = 3;
  // The profiles whose jobs dlbatch preempts (SlurmHost::Preempt).
  std::set<std::string> preempting;
};

// The bridge is its launcher's ledger: records go to the host's store and
// stay in memory, each with its one-job credential.
class SlurmBridge final : public SlurmJobLedger {
 public:
  // Borrowed pointers must outlive the bridge.
  SlurmBridge(SlurmHost* host, const Clock* clock, SlurmBridgeOptions options);
  ~SlurmBridge() override;  // Stop()
  SlurmBridge(const SlurmBridge&) = delete;
  SlurmBridge& operator=(const SlurmBridge&) = delete;

  // ---- set-up; the thread that starts and stops the host ----
  // Where a job's one-job credential goes when its record is written, and
  // leaves when it is forgotten (null: nowhere). Set before the first Put;
  // the table must outlive the bridge.
  void set_credential_table(CredentialTable* table) { job_tokens_ = table; }
  bool started() const { return thread_.joinable(); }
  // Starts the Slurm thread: `tool` runs Slurm's tools (borrowed),
  // `launch` (by profile) is what each batch script needs to dial back,
  // `instance` what this scheduler's Slurm jobs are named with. Until then
  // the jobs stay queued and a submit to a Slurm profile is refused.
  void Start(SlurmTool* tool, std::map<std::string, WorkerLaunch> launch,
             std::string instance) ABSL_LOCKS_EXCLUDED(host_->mutex());
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Empty before Start.
  const std::string& instance() const { return instance_; }
  // The host's lock, under the name the annotations use.
  absl::Mutex& host_mutex() const ABSL_LOCK_RETURNED(host_->mutex()) {
    return host_->mutex();
  }

  // ---- any thread ----
  // The Slurm profile named `name`; null for a profile of workers.
  const SlurmProfile* ProfileOf(const std::string& name) const;
  // OK where a job of `spec` (by `user`) can ever run on its Slurm
  // profile: its shape splits over the nodes (PlanBatch) and fits the
  // partition's limits (sinfo, read at most every 30 s), and the scheduler
  // may submit for `user`.
  absl::Status CheckSubmit(const v1::JobSpec& spec, const std::string& user)
      ABSL_LOCKS_EXCLUDED(host_->mutex(), mu_);
  // Slurm's view of a Slurm profile's partition (sinfo); NotFound for a
  // profile that is not of Slurm.
  absl::StatusOr<PartitionView> View(const std::string& profile)
      ABSL_LOCKS_EXCLUDED(host_->mutex());
  // Wakes the Slurm thread: a launch waits, or a cancel should reach Slurm
  // now rather than at the next poll.
  void Poke() ABSL_LOCKS_EXCLUDED(mu_);
  // The job's record, committed in a transaction of the host's before
  // returning, then kept for the registrations of its workers, with its
  // credential in the table (SlurmJobLedger).
  absl::Status Put(const SlurmJobRecord& record) override
      ABSL_LOCKS_EXCLUDED(host_->mutex());
  // The job no longer has a Slurm job: its record and credential go.
  absl::Status Forget(int64_t job_id) override
      ABSL_LOCKS_EXCLUDED(host_->mutex());

  // ---- the host's paths; REQUIRES: the host's lock ----
  // The store's records, as the host (re)loads: they replace those in
  // memory.
  void LoadRecords(std::vector<SlurmJobRecord> records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The rest of a (re)load, once the host has its jobs' part ends: the
  // resubmissions of queued jobs (the store's), the running jobs whose
  // every part ended (their end waited for Slurm's word) and the Slurm
  // jobs' workers whose every part ended (they left for good).
  void LoadEnds(std::map<int64_t, int> resubmits,
                const std::vector<int64_t>& settling,
                const std::vector<int64_t>& departed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The host drops its memory to reload it: the gangs, the connected and
  // departed workers and the settling ends go (found again by the load
  // and the workers' reconnections).
  void Reset() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The one-job credentials of the jobs' Slurm jobs.
  std::vector<CredentialRecord> JobCredentials() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  std::optional<SlurmJobRecord> RecordOf(int64_t job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The queued job `job_id` of a Slurm profile is to be submitted.
  void Enqueue(int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // Worker `worker` (`name`, offering `devices`) registered for Slurm job
  // `slurm`: it joins its job's gang, and the job starts on the gang's
  // parts once every node's worker is in (StartOnGang). One refused
  // (Refuse) whose Slurm job can never hold the job fails the job, and its
  // Slurm job is cancelled at the thread's next turn without the wait an
  // ended job's running Slurm job is given. REQUIRES: a transaction open.
  absl::Status Join(int64_t worker, const std::string& name,
                    const std::vector<v1::Device>& devices,
                    const v1::SlurmJob& slurm, WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The worker's stream ended. True where it is a Slurm job's worker that
  // holds no part now: the host forgets it (it served one job and never
  // returns). One whose parts all ended while its job's other parts run
  // is kept, never lost for being away, and forgotten at its job's end.
  bool WorkerLeft(int64_t worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // Whether `worker` left that way (WorkerLeft): not lost for silence.
  bool Departed(int64_t worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // Whether the end of the job `job_id` of `profile`, every part reported
  // ended, waits for Slurm's word before it is committed
  // (slurm::EndedBySignal): a failed job of a Slurm profile, not cancelled
  // or requeued by dlbatch, one of whose parts was killed by a signal.
  bool SettlesWithSlurm(int64_t job_id, const std::string& profile) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // Its end waits now (SettlesWithSlurm; `failure` for the log): squeue is
  // asked at once whether Slurm killed it, and why.
  void BeginSettling(int64_t job_id, const std::string& failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The job ended or was requeued: its end waits no more.
  void EndSettling(int64_t job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // Why the queued job `job_id` (attempts begun: `attempt`) of a Slurm
  // profile waits.
  std::string WaitReason(int64_t job_id, int attempt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());

 private:
  // What one reconcile reads under the host's lock besides its input.
  struct Snapshot {
    std::vector<SlurmJobRecord> given_back;  // held jobs' Slurm jobs
    // Jobs whose end waited for Slurm's word and that dlbatch has since
    // cancelled or requeued: they end as their workers reported, now.
    std::vector<int64_t> settle_now;
    std::set<int64_t> release;  // jobs whose Slurm job goes without a linger
    // Running jobs stopping for dlbatch's preemption (StopPreempted).
    std::map<int64_t, StoppingJob> stopping;
  };

  // ---- bridge.cc ----
  absl::StatusOr<PartitionLimits> Limits(const SlurmProfile& profile,
                                         SlurmTool* tool)
      ABSL_LOCKS_EXCLUDED(host_->mutex(), mu_);
  // The Slurm batch job of `job`'s next attempt, on nodes of `node_cpus`
  // CPUs (PlanBatch).
  absl::StatusOr<BatchRequest> RequestOf(const HostJob& job,
                                         int node_cpus) const;
  // A queued job whose Slurm job cannot hold it fails with `why` (Join).
  absl::Status FailGang(const HostJob& job, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  bool Settles(const HostJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());
  // The job `job_id` if its end still waits for Slurm's word (settling,
  // running, every part of its Slurm job's attempt ended); nullopt where
  // it has since ended or been requeued another way.
  std::optional<HostJob> SettlingJob(int64_t job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());

  // ---- bridge_thread.cc: the Slurm thread ----
  // Launches, then a reconcile every poll_ms while any Slurm job is known
  // (and once at its start, for strays).
  void Loop() ABSL_LOCKS_EXCLUDED(host_->mutex(), mu_);
  void Launch(int64_t job_id) ABSL_LOCKS_EXCLUDED(host_->mutex());
  void Reconcile() ABSL_LOCKS_EXCLUDED(host_->mutex());
  // squeue could not be read: ends that wait for Slurm's word wait no
  // longer than Slurm may take to give it (`wait_ms`); past it, the
  // workers' reports stand.
  void SettleWithoutSlurm(int64_t wait_ms) ABSL_LOCKS_EXCLUDED(host_->mutex());
  // The reconcile's view of dlbatch's jobs, into `in`.
  Snapshot Read(ReconcileInput& in) ABSL_LOCKS_EXCLUDED(host_->mutex());
  // scancel of the Slurm jobs the decisions cancel: a running one of an
  // ended job is left a while to end by itself (unless released).
  void CancelSlurmJobs(const ReconcileInput& in, const ReconcileDecisions& d,
                       const std::set<int64_t>& release);
  // The Slurm jobs of jobs stopping for a preemption: SIGTERM to those
  // whose workers cannot be asked, scancel of those past their grace.
  void EndStopping(const ReconcileInput& in,
                   std::map<int64_t, StoppingJob> stopping);
  // ---- bridge_preempt.cc ----
  // After a reconcile: the view of each profile with preemption on whose
  // jobs wait in Slurm for resources (sinfo, outside the host's lock),
  // handed to the host (SlurmHost::Preempt).
  void PreemptFor(const ReconcileInput& in) ABSL_LOCKS_EXCLUDED(host_->mutex());
  // The decisions on dlbatch's jobs and workers, under the host's lock.
  void Apply(const ReconcileDecisions& d,
             const std::vector<int64_t>& settle_now)
      ABSL_LOCKS_EXCLUDED(host_->mutex());
  // A job whose Slurm job ended or vanished before its workers reported:
  // requeued as preempted where Slurm preempted it (not counted), requeued
  // (within its attempts) where Slurm's machines failed it or it has a
  // checkpoint to resume from, else failed, with `reason`.
  // REQUIRES: a transaction open.
  absl::Status JobLost(const HostJob& job, const std::string& reason,
                       bool machine_fault, bool preempted, WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex());

  SlurmHost* const host_;
  const Clock* const clock_;
  const SlurmBridgeOptions options_;
  CredentialTable* job_tokens_ = nullptr;  // set before the first Put

  // Each job's Slurm job, as the store keeps it.
  std::map<int64_t, SlurmJobRecord> records_ ABSL_GUARDED_BY(host_->mutex());
  // Queued jobs the Slurm thread is to submit, and those it is submitting.
  std::set<int64_t> launches_ ABSL_GUARDED_BY(host_->mutex());
  std::set<int64_t> launching_ ABSL_GUARDED_BY(host_->mutex());
  // Slurm's pending reason of each job whose Slurm job waits.
  std::map<int64_t, std::string> waiting_ ABSL_GUARDED_BY(host_->mutex());
  // The workers of each started Slurm job gathered so far (queued jobs).
  std::map<int64_t, SlurmGang> gangs_ ABSL_GUARDED_BY(host_->mutex());
  // Workers of Slurm jobs now connected (their leaving wakes the thread).
  std::set<int64_t> workers_ ABSL_GUARDED_BY(host_->mutex());
  // Slurm jobs' workers that left once their own part ended while their
  // job's other parts still run: never lost for it; forgotten at its end.
  std::set<int64_t> departed_ ABSL_GUARDED_BY(host_->mutex());
  // Submissions of a job whose Slurm job failed before it started.
  std::map<int64_t, int> resubmits_ ABSL_GUARDED_BY(host_->mutex());
  // Jobs whose end waits for Slurm's word (SettlesWithSlurm), and since
  // when (NowMs): the reconcile ends each with Slurm's reason or as its
  // workers reported.
  std::map<int64_t, int64_t> settling_ ABSL_GUARDED_BY(host_->mutex());
  // Ended jobs whose Slurm job is to be cancelled at once (FailGang): their
  // workers never got the job, so they would never leave by themselves.
  std::set<int64_t> release_ ABSL_GUARDED_BY(host_->mutex());

  // Set by Start, before its thread starts; read-only after.
  std::atomic<SlurmTool*> tool_{nullptr};
  std::string instance_;
  std::map<std::string, WorkerLaunch> launch_;
  std::unique_ptr<SlurmLauncher> launcher_;

  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(host_->mutex());
  absl::CondVar cv_;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Each partition's limits as sinfo last said, and when (monotonic ms).
  std::map<std::string, std::pair<int64_t, PartitionLimits>> limits_
      ABSL_GUARDED_BY(mu_);

  // The Slurm thread's own: Slurm jobs of ended jobs still running, and
  // since when (NowMs); Slurm jobs of the old name form left alone, each
  // logged once; Slurm jobs of stopping jobs signalled.
  std::map<int64_t, int64_t> lingering_;
  std::set<int64_t> left_alone_;
  // Slurm jobs of stopping jobs signalled already, and since when (NowMs)
  // each stopping job's worker has been unreachable (EndStopping).
  std::set<int64_t> signalled_;
  std::map<int64_t, int64_t> unreachable_since_;
  std::thread thread_;
};

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_BRIDGE_H_
