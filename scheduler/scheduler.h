// The scheduler's domain: jobs, workers and profiles, the placement core
// driven by their events, and the store that makes every change durable.
//
// Client calls (any thread) and worker messages (one loop thread, in
// batches) take mu_, change memory and the store inside one transaction,
// commit, and only then reply or acknowledge. Messages to workers are
// collected under the lock and sent after it is released. Placement runs
// on every event that can change its answer, never on a timer; the loop's
// only timer checks worker liveness.
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
#include "common/clock.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "proto/job_state.h"
#include "scheduler/core/placement.h"
#include "scheduler/diary_follow.h"
#include "scheduler/disk_guard.h"
#include "scheduler/event_hub.h"
#include "scheduler/metrics.h"
#include "scheduler/rendezvous.h"
#include "scheduler/slurm/bridge.h"
#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/launcher.h"
#include "scheduler/slurm/tool.h"
#include "scheduler/store/backup.h"
#include "scheduler/store/blob_store.h"
#include "scheduler/store/store.h"

namespace dlbatch::scheduler {

struct SchedulerOptions {
  int64_t heartbeat_interval_ms = 1000;
  int64_t heartbeat_timeout_ms = 10000;
  // Workers known from before a start (or an in-process recovery) are lost
  // only this long after it, even if silent: they need time to reconnect.
  // 0: twice heartbeat_timeout_ms.
  int64_t restart_grace_ms = 0;
  // A job's diary holds at most this many bytes of lines: past it the
  // first half and the last half are kept, with a line saying how much was
  // dropped between them. 0: no cap.
  int64_t max_diary_bytes = int64_t{64} << 20;
  // A job's outputs may hold at most this many bytes in all (0: no limit).
  int64_t max_output_bytes = 0;
  // Ended jobs older than this are purged by a background task (0: never),
  // looking every retention_interval_ms.
  int64_t keep_ended_ms = int64_t{30} * 24 * 3600 * 1000;
  int64_t retention_interval_ms = 60000;
  int max_attempts = 3;             // starts of a job before it fails
  int64_t cancel_grace_ms = 10000;  // SIGTERM to SIGKILL
  std::vector<std::pair<std::string, int>> profiles;  // name, max_pool
  // The profiles of `profiles` whose machines belong to Slurm.
  std::vector<slurm::SlurmProfile> slurm_profiles;
  // While a job of a Slurm profile exists, squeue is read this often.
  int64_t slurm_poll_ms = 2000;
  // Fair share: a user's usage halves over this long (0: no decay).
  int64_t fair_share_half_life_ms = int64_t{7} * 24 * 3600 * 1000;
  // (Limits and the usage of ended jobs are kept in the store.)
  // A root worker's "no such user" is trusted this long; a submit after it
  // asks the worker again (the account may have been added).
  int64_t unknown_user_recheck_ms = int64_t{10} * 60 * 1000;
  // A lost worker is removed by itself this long after it was last seen
  // (--forget-offline-after); 0: never.
  int64_t forget_offline_ms = int64_t{3600} * 1000;
};

// A running job's diary against its cap: the stored cut, and (once cut)
// the newest line stored per (attempt, part), so that a resend of a line
// already trimmed away is not stored again.
struct DiaryBudget {
  bool loaded = false;
  DiaryCut cut;
  std::map<std::pair<int, int>, int64_t> last_seq;
};

// The scheduler's end of one worker stream. Implemented by the gRPC
// reactor; thread-safe; Send never blocks (it queues).
class WorkerSession {
 public:
  virtual ~WorkerSession() = default;
  virtual void Send(const v1::SchedulerMessage& message) = 0;
  virtual void Close(const std::string& why) = 0;
  // Closes the stream of a worker that was removed; one that understands
  // it (leaves_when_removed()) is first sent `refused` with `why`, after
  // which it leaves instead of reconnecting.
  virtual void CloseRemoved(const std::string& why) { Close(why); }

  // The credential the stream was opened under (Caller::credential): a
  // worker's name belongs to it while the stream is open. Set before the
  // first message.
  const std::string& owner() const { return owner_; }
  void set_owner(std::string owner) { owner_ = std::move(owner); }
  // Register.leaves_when_removed of the stream's registration. Set before
  // the registration is handled.
  bool leaves_when_removed() const { return leaves_when_removed_; }
  void set_leaves_when_removed(bool leaves) { leaves_when_removed_ = leaves; }

 private:
  std::string owner_;
  bool leaves_when_removed_ = false;
};

class Scheduler : private FollowSource {
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
  v1::Stats GetStats(bool reset_max);
  // Deletes ended jobs (the named ones, or every one ended before
  // before_ms) with their diary, history, progress and the blobs no other
  // job holds, a few hundred per transaction so placement never waits
  // long. (scheduler_purge.cc)
  absl::StatusOr<v1::PurgeJobsReply> Purge(const v1::PurgeJobsRequest& request);
  // `dlbatch admin backup` and `admin status` (scheduler_backup.cc). The
  // backup's staged copy (backup.h), made while no purge runs; it removes
  // itself when dropped.
  absl::StatusOr<std::unique_ptr<StagedBackup>> StageBackup()
      ABSL_LOCKS_EXCLUDED(mu_, purge_mu_);
  absl::StatusOr<v1::SchedulerStatus> StatusReport() ABSL_LOCKS_EXCLUDED(mu_);
  // Tokens (credentials.h), kept in the store; scheduler_credentials.cc.
  absl::StatusOr<std::vector<CredentialRecord>> Credentials()
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutCredential(const CredentialRecord& record)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The one-job credentials of the jobs' Slurm jobs (kept with them in the
  // store, never listed with the others).
  absl::StatusOr<std::vector<CredentialRecord>> JobCredentials()
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- profiles of Slurm (slurm/bridge.h, scheduler_slurm.cc) ----
  // Where a job's one-job credential goes when its Slurm record is written,
  // and leaves when it is forgotten (null: nowhere). Set before the first
  // PutSlurmJob; the table must outlive the scheduler.
  void set_credential_table(CredentialTable* table) {
    slurm_->set_credential_table(table);
  }
  // The job's Slurm record (SlurmLedger, for the launcher): committed in a
  // transaction of its own before returning, then kept in memory for the
  // registrations of its workers, with its credential in the table.
  absl::Status PutSlurmJob(const slurm::SlurmJobRecord& record)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The job no longer has a Slurm job: its record and credential go.
  absl::Status ForgetSlurmJob(int64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // How the jobs of Slurm profiles reach Slurm: `tool` runs sbatch, squeue,
  // sinfo and scancel (borrowed; must outlive the scheduler), `launch`
  // (by profile name) what each batch script needs to dial back (the
  // token is made per job). Starts the thread that submits queued jobs to
  // Slurm and reconciles with squeue; until then such jobs stay queued and
  // a submit to such a profile is refused. Call once, after Start. Fails
  // where the store cannot give the scheduler's instance id (which its
  // Slurm jobs' names carry); Slurm's jobs are then left alone.
  absl::Status StartSlurm(slurm::SlurmTool* tool,
                          std::map<std::string, slurm::WorkerLaunch> launch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The instance id the scheduler's Slurm jobs are named with; empty
  // before StartSlurm.
  const std::string& slurm_instance() const { return slurm_->instance(); }
  // Whether the one-job credential of `job_id` may upload now: while its
  // job runs (its outputs and checkpoints), never before or after.
  bool SlurmJobUploads(int64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Slurm's view of a Slurm profile's partition (sinfo), for `dlbatch
  // profiles`; NotFound for a profile that is not of Slurm.
  absl::StatusOr<slurm::PartitionView> SlurmView(const std::string& profile)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> DeleteCredential(const std::string& name, bool worker)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether blob `sha256` is an attachment or checkpoint file of a job now
  // running on a worker connected under `credential`: what a worker
  // credential may download.
  bool WorkerNeedsBlob(const std::string& credential, const std::string& sha256)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Per-user limits and fair-share usage (placement.h), kept in the store:
  // limits as set, usage of ended jobs as each ends (running jobs count
  // again from their start after a restart). SetUserLimit replaces the
  // user's limits on the profile (unlimited in both: removed); NotFound for
  // an unknown profile.
  absl::Status SetUserLimit(const std::string& user, const std::string& profile,
                            const UserLimit& limit);
  std::vector<LimitEntry> UserLimits();
  // `now`, if given, receives the time the usage was decayed to.
  std::vector<UserUsage> Usage(int64_t* now = nullptr);

  // ---- workers and job control (issue 21; scheduler_control.cc) ----
  // Drains (drain true) or resumes the worker named `name` (or numbered):
  // a drained one takes no new jobs; kept in the store by name.
  absl::StatusOr<v1::WorkerInfo> DrainWorker(const std::string& name,
                                             bool drain,
                                             const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a worker that is offline, or drained and idle; its slots leave
  // its profile, and queued jobs that can no longer ever run fail.
  absl::StatusOr<v1::RemoveWorkerReply> RemoveWorker(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Hold, release or requeue each job (the caller checked who may).
  absl::StatusOr<v1::ControlJobsReply> ControlJobs(
      const v1::ControlJobsRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- WatchEvents streams; any thread ----
  // Adds a stream: its queue holds the snapshot (running jobs, up to
  // kWatchQueuedJobs queued ones, the most recently ended, every worker)
  // closed by snapshot_done, then every change as it is published. The
  // caller starts it with Pump() and calls Unwatch when the stream is done.
  absl::StatusOr<std::shared_ptr<WatchQueue>> Watch(
      const v1::WatchEventsRequest& request, EventWriter* writer);
  void Unwatch(const WatchQueue* queue);

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
  struct ActiveJob {
    JobRecord record;
    std::vector<bool> part_ended;
    std::vector<int> part_exit;
    std::string failure;  // first failing part's reason
    bool cancel_requested = false;
    std::string cancel_reason;
    v1::TrainProgress progress;       // train jobs: the latest report
    v1::CheckpointStored checkpoint;  // train jobs: the newest stored
    DiaryBudget diary;                // loaded with the first line
    int64_t disk_dropped_lines = 0;   // lines refused while the disk was full
    int64_t disk_dropped_bytes = 0;
    // Job control (scheduler_control.cc): a held job, or one waiting for
    // the jobs in `after`, is queued but not in the placement core; a
    // requeue asked while it runs stops it and queues it again.
    bool held = false;
    std::vector<int64_t> after;
    bool requeue_requested = false;
    // Some of its parts' ends are in the store (part_ends): deleted as the
    // job ends or is queued again.
    bool part_ends_stored = false;
  };
  struct WorkerState {
    WorkerRecord record;
    std::shared_ptr<WorkerSession> session;  // null while offline
    bool lost = false;
    int64_t last_seen_mono = 0;
    int64_t grace_until_mono = 0;  // not lost before (after a start)
    // Whose jobs it runs (Register): any user its machine knows, asked
    // about each (asked: the users asked this session), or only run_user's;
    // run_user empty: anyone's (a worker that said nothing).
    bool runs_as_any = false;
    std::string run_user;
    std::set<std::string> asked;
    // Users it said it does not know, and when (monotonic ms): asked again
    // after options_.unknown_user_recheck_ms (an account added since).
    std::map<std::string, int64_t> unknown_since;
    std::string version;  // as it registered (Register.version)
    // Drained by an admin (kept in the store by name): takes no new jobs.
    bool draining = false;
    std::string drain_reason;
  };
  using Outbox = std::vector<
      std::pair<std::shared_ptr<WorkerSession>, v1::SchedulerMessage>>;
  struct Event {
    std::shared_ptr<WorkerSession> session;
    std::optional<v1::WorkerMessage> message;  // empty: the stream is gone
  };

  // FollowSource, for the followers' pool threads.
  absl::StatusOr<int64_t> DiaryTailStart(int64_t job, int64_t tail) override;
  absl::StatusOr<DiaryRead> ReadDiaryLines(int64_t job, int64_t after,
                                           int limit) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> JobEnded(int64_t job) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::Job> JobForWait(int64_t job) override {
    return GetJob(job);
  }

  // ---- job control and worker administration (scheduler_control.cc) ----
  // After Load's workers and jobs: drains and job control from the store.
  absl::Status LoadControl() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkerState* FindWorkerNamed(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a worker from memory, the core and the store, then fails the
  // queued jobs that can no longer ever run (their ids in *failed).
  // REQUIRES: a transaction open.
  absl::Status ForgetWorker(int64_t worker_id, const std::string& why,
                            std::vector<int64_t>* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets workers lost longer than options_.forget_offline_ms.
  void ForgetOffline(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveControl(const ActiveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a job that ended (failed, cancelled) again.
  absl::Status RequeueEnded(int64_t job_id, v1::ControlResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running job whose requeue was asked has ended: queued again.
  absl::Status RequeueAsked(ActiveJob& job, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs waiting for others (--after) whose answer may have changed:
  // enqueued when all finished, failed when one did not. In a transaction
  // of its own. REQUIRES: no transaction open.
  absl::Status ResolveAfter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wait reason of a held or --after job; empty otherwise.
  std::string ControlWaitReason(const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wait reason of a job that fits only with workers that take no jobs
  // now (draining or offline ones, each named); empty otherwise.
  std::string WorkersWaitReason(const WaitInfo& info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Names workers in the core's messages, with since when each offline
  // one is. Call the labeler only under mu_.
  WorkerLabeler Labels() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- profiles of Slurm (scheduler_slurm.cc) ----
  // The scheduler as the Slurm bridge's host (slurm/host.h): its jobs and
  // workers under mu_, which is the bridge's host lock. Made by
  // NewSlurmSide, where it is defined.
  class SlurmSide;
  friend struct slurm::WorkerMail;  // the Outbox, as the bridge passes it
  static std::unique_ptr<slurm::SlurmHost> NewSlurmSide(Scheduler& scheduler);
  // Asserts that mu_, held, is the bridge's host lock: the bridge's methods
  // that require it may be called after this.
  void SlurmLockHeld() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_ASSERT_EXCLUSIVE_LOCK(slurm_->host_mutex()) {
    slurm_->host_mutex().AssertHeld();
  }
  // A queued job's way to its start: the placement core for profiles of
  // workers, the Slurm thread's launches for profiles of Slurm.
  void EnqueueJob(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker of a Slurm batch job registered: it joins its job's gang, and
  // the job starts on the gang's parts once every node's worker is in
  // (SlurmBridge::Join). REQUIRES: a transaction open.
  absl::Status JoinSlurmGang(const WorkerState& worker, const v1::Register& reg,
                             Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Part of Load: the running jobs' parts whose end was reported, from the
  // store; the Slurm workers that left with every part they hold ended
  // (never lost for it), jobs whose end waited for Slurm's word, and the
  // Slurm resubmissions of queued jobs.
  absl::Status LoadPartEnds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Starts attempt rec.attempt + 1 of a queued job on `parts`: the record,
  // its event and the StartJob messages (into `starts`). REQUIRES: a
  // transaction open; the core already holds the parts.
  absl::Status BeginAttempt(ActiveJob& job, const std::vector<Part>& parts,
                            int64_t now, Outbox* starts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  v1::ListProfilesReply ListProfilesLocked() ABSL_LOCKS_EXCLUDED(mu_);

  // Loop thread.
  void Loop();
  void ProcessBatch(std::deque<Event>& batch);
  void CheckLiveness();
  // Background purge of jobs ended more than keep_ended_ms ago.
  void RetentionLoop();

  // Fills memory (jobs, workers, profiles, the placement core) from the
  // store. REQUIRES: mu_ held, memory empty.
  absl::Status Load(bool open_rendezvous) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A write failed after memory took the change: memory is ahead of the
  // store. Instead of dying (a full disk would make that a crash loop), the
  // scheduler does in-process what a restart does: drops every worker
  // stream (workers reconnect and resend what was not acknowledged) and
  // reloads memory from the last commit. No transaction may be open.
  void Recover(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` in a transaction and commits it; if either fails, the
  // transaction is rolled back, memory reloaded (Recover) and the failure
  // returned. REQUIRES: no transaction open.
  absl::Status InTransaction(const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `txn`, timing it for the metrics.
  absl::Status TimedCommit(Transaction& txn);
  // OK unless writes that grow the store are refused now.
  absl::Status CheckWritable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A note in the diary of a job that ends about what it lost (lines
  // refused while the disk was full).
  absl::Status NoteLosses(ActiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One worker message inside the batch's transaction. A failure tied to
  // the message is refused once (undone, acknowledged, its reason in the
  // job's diary); only a failure of the store as a whole is returned.
  absl::Status HandleEvent(Event& event, Outbox* out, Outbox* acks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleDiary(const v1::DiaryBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Start latency for the metrics: a worker said something about a job.
  void NoteReport(const v1::WorkerMessage& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores lines within the job's diary cap (scheduler_diary.cc).
  absl::Status StoreCappedDiary(ActiveJob& job, const v1::DiaryBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadDiaryBudget(ActiveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Purges up to `limit` of `ids` in one transaction; adds to `reply`.
  absl::Status PurgeChunk(const std::vector<int64_t>& ids,
                          v1::PurgeJobsReply* reply) ABSL_LOCKS_EXCLUDED(mu_);

  // All below REQUIRE mu_ held and, where they write, a transaction open.

  // A train job whose execution_environment asks for GPUs (gpu, multi-gpu)
  // on a profile whose known workers all offer CPU slots could only fail
  // where it starts: refused at submission instead, naming the profiles
  // that have GPUs. (A profile no worker has joined is refused before, by
  // PlacementCore::CheckSatisfiable.)
  absl::Status CheckDevicesFit(const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleMessage(const std::shared_ptr<WorkerSession>& session,
                     const v1::WorkerMessage& message, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleRegister(const std::shared_ptr<WorkerSession>& session,
                              const v1::Register& reg, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleEnded(int64_t worker_id, const v1::JobEnded& ended,
                           Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every part of `job` has ended: the job ends (or is requeued, as asked)
  // as its workers reported. REQUIRES: a transaction open.
  absl::Status EndAsReported(ActiveJob& job, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job a worker's report is about if it is the attempt and part that
  // worker runs now; null for a stale report.
  ActiveJob* ReportedJob(int64_t worker_id, int64_t job_id, int attempt,
                         int part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleProgress(int64_t worker_id,
                              const v1::JobProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleCheckpoint(int64_t worker_id,
                                const v1::CheckpointStored& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills a job's progress and checkpoint from memory or the store.
  void AddTrainState(v1::Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // A worker's stream ended. A Slurm job's worker that runs nothing more
  // is forgotten (it serves one job and never returns).
  absl::Status HandleGone(const std::shared_ptr<WorkerSession>& session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeues (or fails, past max_attempts) a job whose worker was lost.
  absl::Status RequeueLost(ActiveJob& job, const std::string& why, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoseWorker(WorkerState& worker, const std::string& why,
                          Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EndJob(ActiveJob& job, v1::JobState state, int exit_code,
                      const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetState(ActiveJob& job, v1::JobState state,
                        const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelParts(const ActiveJob& job, const std::string& why, int skip_part,
                   Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a placement pass and commits its decisions in a transaction of its
  // own (recovering if that fails). REQUIRES: no transaction open.
  absl::Status PlaceJobs(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a line of dlbatch's own to a job's diary.
  absl::Status Diary(int64_t job_id, int attempt, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  QueuedJob ToQueued(const JobRecord& job) const;
  // Stores the user's usage of ended jobs as the core has it now.
  // REQUIRES: a transaction open.
  absl::Status SaveUsage(const std::string& user)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- whose jobs workers run (scheduler_users.cc) ----
  // The placement core's view of a worker that just registered; asks it
  // about the users of its profile's queued jobs if it runs as any user.
  void RegisterWorkerUsers(WorkerState& worker, const v1::Register& reg,
                           Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the online workers of `profile` that run as any user and were not
  // asked yet whether they know `user`.
  void AskWorkers(const std::string& profile, const std::string& user,
                  Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every online worker of the profile asked about `user` has
  // answered.
  bool AllAnswered(const std::string& profile, const std::string& user) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a submit: asks the profiles' workers about the user and waits
  // (at most kUserAnswerWaitMs) for their answers, so that a user no
  // worker knows is refused at once.
  void AskBeforeSubmit(const std::set<std::string>& profiles,
                       const std::string& user) ABSL_LOCKS_EXCLUDED(mu_);
  // FailedPrecondition if no registered worker of the job's profile runs
  // its user's jobs (each named with why); undecided ones count as able.
  absl::Status CheckUserRuns(const JobRecord& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `worker` does not run `user`'s jobs: "'w2' runs only nobody's".
  std::string UnableWhy(const WorkerState& worker, const std::string& user,
                        UserFit fit) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wait reason's part about workers that do not run the job's user
  // (empty if every online worker does).
  std::string UsersWaitReason(const ActiveJob& job, const WaitInfo& info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An empty placement core with the options' half-life and the limits.
  std::unique_ptr<PlacementCore> NewCore() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string WaitReason(const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed(int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the job's current state to WatchEvents streams, with the workers
  // whose slots it took or freed. Changed() calls it; call it directly after
  // a change to a job's record that does not go through Changed() (such as
  // new progress). Cheap when nobody watches. (scheduler_events.cc)
  void PublishJob(int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for a worker that joined, left or was lost.
  void PublishWorker(int64_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job as WatchEvents shows it: the spec cut to its summary, the live
  // state and wait reason, worker names.
  v1::Job JobView(const ActiveJob& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::WorkerInfo WorkerView(const WorkerState& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static v1::Job RecordToProto(const JobRecord& rec);
  static void Deliver(Outbox& out);

  Store* const store_;
  StoreReader* const reader_;
  BlobStore* const blobs_;
  const Clock* const clock_;
  const SchedulerOptions options_;
  std::unique_ptr<DiskGuard> own_disk_;  // when none was passed in
  DiskGuard* const disk_;
  RendezvousStore rendezvous_;
  Metrics* metrics_ = nullptr;
  int64_t start_ms_ = 0;  // the clock at construction, for Status

  mutable absl::Mutex mu_;
  // Replaced whole by Recover.
  std::unique_ptr<PlacementCore> core_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, UserLimit> limits_
      ABSL_GUARDED_BY(mu_);  // (user, profile): kept across reloads
  // Set when Recover could not reload; the loop retries, and until then
  // worker messages are dropped and writes refused.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Serialises purges (the RPC and the background task).
  absl::Mutex purge_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unordered_map<int64_t, ActiveJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<const WorkerSession*, int64_t> session_worker_
      ABSL_GUARDED_BY(mu_);
  int64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
  double last_pass_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double max_pass_ms_ ABSL_GUARDED_BY(mu_) = 0;
  EventHub events_;
  // Jobs with a non-empty `after`, and whether one ended since they were
  // last looked at (ResolveAfter).
  std::set<int64_t> waiting_after_ ABSL_GUARDED_BY(mu_);
  bool after_dirty_ ABSL_GUARDED_BY(mu_) = false;
  // Names of connected workers just removed: their next registration is
  // refused, once.
  std::set<std::string> refuse_once_ ABSL_GUARDED_BY(mu_);
  WorkerJobsIndex watched_slots_ ABSL_GUARDED_BY(mu_);  // valid while watched

  absl::Mutex queue_mu_;
  absl::CondVar queue_cv_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  absl::CondVar stop_cv_;  // with queue_mu_: wakes the retention task
  std::thread loop_;
  std::thread retention_;
  // Profiles of Slurm: the bridge owns the Slurm thread and state and
  // reaches the scheduler through slurm_side_ (a SlurmSide). The bridge
  // goes first: its thread reads through the side and the members above.
  std::unique_ptr<slurm::SlurmHost> slurm_side_;
  std::unique_ptr<slurm::SlurmBridge> slurm_;
  // Last: its threads read through the members above, so it goes first.
  std::unique_ptr<DiaryFollowHub> follow_;
};

// The scheduler's store as the Slurm launcher's ledger.
class SlurmLedger final : public slurm::SlurmJobLedger {
 public:
  explicit SlurmLedger(Scheduler* scheduler) : scheduler_(scheduler) {}
  absl::Status Put(const slurm::SlurmJobRecord& record) override {
    return scheduler_->PutSlurmJob(record);
  }
  absl::Status Forget(int64_t job_id) override {
    return scheduler_->ForgetSlurmJob(job_id);
  }

 private:
  Scheduler* const scheduler_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SCHEDULER_H_
