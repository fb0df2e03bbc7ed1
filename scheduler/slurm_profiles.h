// The scheduler's profiles of Slurm: it owns the Slurm bridge
// (slurm/bridge.h), which submits their queued jobs with sbatch and
// reconciles squeue with them, and is the bridge's host (Side, in
// slurm_profiles.cc), through which the bridge reaches the scheduler's
// jobs and workers. Reached as Scheduler::slurm() by the daemon (Start,
// the credential table), the launcher's ledger (PutJob, ForgetJob) and
// the services (JobUploads, JobCredentials, View); the other parts reach
// the bridge itself as SchedulerState::bridge().
//
// Lock story. SlurmProfiles owns no lock. The bridge's host lock is the
// scheduler's mu_ (scheduler_state.h): the Side's mutex() returns it, and a
// caller that holds mu_ asserts so (SchedulerState::SlurmLockHeld) before
// it calls a bridge method that requires it. The bridge's own mu_ is
// taken after mu_, never before (bridge.h, the lock story). Its entry
// points take mu_ themselves, briefly (JobUploads, JobCredentials, the
// instance id's transaction in Start), or leave it to the bridge (PutJob,
// ForgetJob), or run sinfo without it (View). The Side's methods run under
// mu_, called by the bridge's thread in its short sections or by the
// scheduler's own paths.
#ifndef DLBATCH_SCHEDULER_SLURM_PROFILES_H_
#define DLBATCH_SCHEDULER_SLURM_PROFILES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/slurm/bridge.h"
#include "scheduler/slurm/host.h"
#include "scheduler/slurm/launcher.h"
#include "scheduler/slurm/tool.h"

namespace dlbatch::scheduler {

class SlurmProfiles {
 public:
  using ActiveJob = SchedulerState::ActiveJob;

  // Makes the bridge, with the state's Slurm profiles; `state` must
  // outlive the SlurmProfiles.
  explicit SlurmProfiles(SchedulerState& state);
  // Stop the bridge (SlurmBridge::Stop) before.
  ~SlurmProfiles();
  SlurmProfiles(const SlurmProfiles&) = delete;
  SlurmProfiles& operator=(const SlurmProfiles&) = delete;

  slurm::SlurmBridge& bridge() { return *bridge_; }

  // Where a job's one-job credential goes when its Slurm record is written,
  // and leaves when it is forgotten (null: nowhere). Set before the first
  // PutJob; the table must outlive the scheduler.
  void set_credential_table(CredentialTable* table) {
    bridge_->set_credential_table(table);
  }
  // The job's Slurm record (SlurmLedger, for the launcher): committed in a
  // transaction of its own before returning, then kept in memory for the
  // registrations of its workers, with its credential in the table.
  absl::Status PutJob(const slurm::SlurmJobRecord& record)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // The job no longer has a Slurm job: its record and credential go.
  absl::Status ForgetJob(int64_t job_id) ABSL_LOCKS_EXCLUDED(state_.mu_);
  // How the jobs of Slurm profiles reach Slurm: `tool` runs sbatch, squeue,
  // sinfo and scancel (borrowed; must outlive the scheduler), `launch`
  // (by profile name) what each batch script needs to dial back (the
  // token is made per job). Starts the thread that submits queued jobs to
  // Slurm and reconciles with squeue; until then such jobs stay queued and
  // a submit to such a profile is refused. Call once, after
  // Scheduler::Start. Fails where the store cannot give the scheduler's
  // instance id (which its Slurm jobs' names carry); Slurm's jobs are then
  // left alone.
  absl::Status Start(slurm::SlurmTool* tool,
                     std::map<std::string, slurm::WorkerLaunch> launch)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // The instance id the scheduler's Slurm jobs are named with; empty
  // before Start.
  const std::string& instance() const { return bridge_->instance(); }
  // Whether the one-job credential of `job_id` may upload now: while its
  // job runs (its outputs and checkpoints), never before or after.
  bool JobUploads(int64_t job_id) ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Slurm's view of a Slurm profile's partition (sinfo), for `dlbatch
  // profiles`; NotFound for a profile that is not of Slurm.
  absl::StatusOr<slurm::PartitionView> View(const std::string& profile)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // The one-job credentials of the jobs' Slurm jobs (kept with them in the
  // store, never listed with the others).
  absl::StatusOr<std::vector<CredentialRecord>> JobCredentials()
      ABSL_LOCKS_EXCLUDED(state_.mu_);

  // ---- hooks; mu_ held ----
  // Part of Load: the running jobs' parts whose end was reported, from the
  // store; the Slurm workers that left with every part they hold ended
  // (never lost for it), jobs whose end waited for Slurm's word, and the
  // Slurm resubmissions of queued jobs.
  absl::Status LoadPartEnds(SchedulerState& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

 private:
  // The scheduler as the bridge's host (slurm/host.h): each method the
  // SlurmHost's of the same name, called with mu_ held.
  class Side;

  SchedulerState& state_;
  // The bridge goes first: its thread reads through the side.
  std::unique_ptr<slurm::SlurmHost> side_;
  std::unique_ptr<slurm::SlurmBridge> bridge_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SLURM_PROFILES_H_
