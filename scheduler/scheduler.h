// The scheduler's domain: jobs, workers and profiles, the placement core
// driven by their events, and the store that makes every change durable.
//
// Client calls (any thread) and worker messages (one loop thread, in
// batches) take mu_, change memory and the store inside one transaction,
// commit, and only then reply or acknowledge. Messages to workers are
// collected under the lock and sent after it is released. Placement runs
// on every event that can change its answer, never on a timer; the loop's
// only timer checks worker liveness.
//
// The Scheduler is split by concern into parts, each with its lock story
// at the top of its header: Admin (admin.h: purge, backup, status), Users
// (users.h: tokens, limits, whose jobs workers run), Control (control.h:
// drain, remove, hold, release, requeue, --after), Watchers (watchers.h:
// WatchEvents streams, the views of jobs and workers, wait reasons),
// WorkerStreams (worker_streams.h: the loop thread's worker messages and
// liveness) and SlurmProfiles (slurm_profiles.h: the Slurm bridge and its
// host). They share the SchedulerState (scheduler_state.h), which holds
// the one lock, the state under it and the job's life every part moves
// jobs through; the Scheduler owns the parts, and keeps the jobs' own
// calls (submit, show, list, cancel, wait, diary), loading and recovery,
// placement and the loop thread.
#ifndef DLBATCH_SCHEDULER_SCHEDULER_H_
#define DLBATCH_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "proto/job_state.h"
#include "scheduler/admin.h"
#include "scheduler/control.h"
#include "scheduler/core/placement.h"
#include "scheduler/diary_follow.h"
#include "scheduler/disk_guard.h"
#include "scheduler/event_hub.h"
#include "scheduler/metrics.h"
#include "scheduler/preemptions.h"
#include "scheduler/rendezvous.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/slurm/bridge.h"
#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/launcher.h"
#include "scheduler/slurm/tool.h"
#include "scheduler/slurm_profiles.h"
#include "scheduler/store/backup.h"
#include "scheduler/store/blob_store.h"
#include "scheduler/store/store.h"
#include "scheduler/users.h"
#include "scheduler/watchers.h"
#include "scheduler/worker_streams.h"

namespace dlbatch::scheduler {

// The facade the services call: jobs and workers here, administration in
// admin() (admin.h), credentials, limits and whose jobs workers run in
// users() (users.h), worker administration and job control in control()
// (control.h), WatchEvents streams in watchers() (watchers.h), profiles of
// Slurm in slurm() (slurm_profiles.h). Its state, and the lock that guards
// it, are the SchedulerState it derives from (scheduler_state.h, the lock
// story).
class Scheduler : private FollowSource, private SchedulerState {
 public:
  // Borrowed pointers must outlive the scheduler. disk: the state folder's
  // space (null: one that notes only failed writes).
  Scheduler(Store* store, StoreReader* reader, BlobStore* blobs,
            const Clock* clock, SchedulerOptions options,
            DiskGuard* disk = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Loads every job, worker and profile, then starts the loop thread.
  absl::Status Start();
  void Stop();

  // ---- clients; any thread ----
  absl::StatusOr<v1::SubmitJobReply> Submit(
      const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(int64_t job_id);
  // Who submitted job `job_id`; NotFound for an unknown job.
  absl::StatusOr<std::string> JobOwner(int64_t job_id) {
    return reader_->JobUser(job_id);
  }
  absl::StatusOr<bool> UserHoldsBlob(const std::string& user,
                                     const std::string& sha256) {
    return reader_->UserHoldsBlob(user, sha256);
  }
  absl::StatusOr<v1::ListJobsReply> ListJobs(
      const v1::ListJobsRequest& request);
  absl::StatusOr<v1::CancelJobsReply> Cancel(
      const v1::CancelJobsRequest& request);
  // ReadDiary and WaitJobs calls: reactors fed per job, without a thread
  // each (diary_follow.h).
  DiaryFollowHub& followers() { return *follow_; }
  // The blocking forms of the same, for in-process callers: Wait blocks
  // until every job has ended, the timeout passes, or `gone` is true;
  // ReadDiary sends the diary in chunks through `send` (false: the client
  // left).
  absl::StatusOr<v1::WaitJobsReply> Wait(const v1::WaitJobsRequest& request,
                                         const std::function<bool()>& gone);
  absl::Status ReadDiary(const v1::ReadDiaryRequest& request,
                         const std::function<bool(const v1::DiaryChunk&)>& send,
                         const std::function<bool()>& gone);
  v1::ListWorkersReply ListWorkers();
  // Each profile; a Slurm profile's with Slurm's view (sinfo, read
  // without the lock).
  v1::ListProfilesReply ListProfiles() ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ListOutputsReply> ListOutputs(int64_t job_id);
  // Purge, backup, status and statistics (admin.h).
  Admin& admin() { return admin_; }
  // Tokens, per-user limits and usage, whose jobs workers run (users.h).
  Users& users() { return users_; }
  // Drain, resume and remove workers; hold, release and requeue jobs
  // (control.h).
  Control& control() { return control_; }
  // WatchEvents streams (watchers.h).
  Watchers& watchers() { return watchers_; }
  // Profiles of Slurm: the bridge's start, the one-job credentials, Slurm's
  // view of a partition (slurm_profiles.h).
  SlurmProfiles& slurm() { return slurm_; }

  // ---- worker streams; queued to the loop thread ----
  void OnWorkerMessage(std::shared_ptr<WorkerSession> session,
                       v1::WorkerMessage message);
  void OnWorkerGone(std::shared_ptr<WorkerSession> session);

  // The train jobs' rendezvous (thread-safe on its own).
  RendezvousStore& rendezvous() { return rendezvous_; }

  const SchedulerOptions& options() const { return options_; }
  // Where the scheduler reports what it does (metrics.h); null: nowhere.
  // Set before Start; borrowed.
  void set_metrics(Metrics* metrics) { metrics_ = metrics; }

 private:
  // FollowSource, for the followers' pool threads.
  absl::StatusOr<int64_t> DiaryTailStart(
      int64_t job, int64_t tail, const std::vector<int32_t>& ranks) override;
  absl::StatusOr<DiaryRead> ReadDiaryLines(
      int64_t job, int64_t after, int limit,
      const std::vector<int32_t>& ranks) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> JobEnded(int64_t job) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::Job> JobForWait(int64_t job) override {
    return GetJob(job);
  }

  v1::ListProfilesReply ListProfilesLocked() ABSL_LOCKS_EXCLUDED(mu_);

  // Loop thread.
  void Loop();
  // The retention task's wait (Admin): up to `d`, false once stopping.
  bool SleepUnlessStopped(absl::Duration d) ABSL_LOCKS_EXCLUDED(queue_mu_);

  // Fills memory (jobs, workers, profiles, the placement core) from the
  // store. REQUIRES: mu_ held, memory empty.
  absl::Status Load(bool open_rendezvous) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SchedulerState's: reloads memory from the last commit.
  void Recover(const absl::Status& why) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A train job whose execution_environment asks for GPUs (gpu, multi-gpu)
  // on a profile whose known workers all offer CPU slots could only fail
  // where it starts: refused at submission instead, naming the profiles
  // that have GPUs. (A profile no worker has joined is refused before, by
  // PlacementCore::CheckSatisfiable.)
  absl::Status CheckDevicesFit(const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SchedulerState's: a placement pass, its decisions committed.
  absl::Status PlaceJobs(Outbox* out) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (The collaborators, mu_ and the state it guards are SchedulerState's.)

  absl::Mutex queue_mu_;
  absl::CondVar queue_cv_;
  std::deque<WorkerEvent> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  absl::CondVar stop_cv_;  // with queue_mu_: wakes the retention task
  std::thread loop_;
  Admin admin_;  // its retention task is joined by Stop
  Users users_;
  Control control_;
  Watchers watchers_;
  Preemptions preemptions_;
  WorkerStreams streams_;
  // Profiles of Slurm: the bridge owns the Slurm thread and state and
  // reaches the scheduler through its host, the members above. It goes
  // first: its thread reads through them.
  SlurmProfiles slurm_;
  // Last: its threads read through the members above, so it goes first.
  std::unique_ptr<DiaryFollowHub> follow_;
};

// The scheduler's store as the Slurm launcher's ledger.
class SlurmLedger final : public slurm::SlurmJobLedger {
 public:
  explicit SlurmLedger(Scheduler* scheduler) : scheduler_(scheduler) {}
  absl::Status Put(const slurm::SlurmJobRecord& record) override {
    return scheduler_->slurm().PutJob(record);
  }
  absl::Status Forget(int64_t job_id) override {
    return scheduler_->slurm().ForgetJob(job_id);
  }

 private:
  Scheduler* const scheduler_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SCHEDULER_H_
