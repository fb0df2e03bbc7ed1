// The state the Scheduler's parts share (the Scheduler itself, Admin,
// Users, Control, Watchers, Preemptions, WorkerStreams, SlurmProfiles), the
// job's life that every part moves jobs through, and what a part asks of
// the Scheduler with it. The Scheduler is the one implementation, and the one
// owner: it derives from this class, so its own code names the members
// directly, and hands itself to its parts as their SchedulerState.
//
// Lock story. One mutex, mu_, guards every member marked
// ABSL_GUARDED_BY(mu_): the placement core, the jobs and workers in
// memory, the per-user limits, the store's broken status, the placement
// counters, and the parts' own state kept here so that the lock that
// guards it is this one (Control's --after set, the worker streams'
// sessions, the watchers' slot index). A client call or a batch of worker
// messages takes it, changes memory and the store inside one transaction
// (the store's writer is used only under mu_), commits, and only then
// releases it and replies; messages to workers are collected in an Outbox
// under it and sent (Deliver) once it is released. No I/O to a client or
// worker is done under it.
//
// A part's function that runs with mu_ held takes the state as its first
// argument `s` and is marked ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_); the
// Scheduler passes itself. clang's -Wthread-safety then checks the lock
// from each caller to the next across the classes (a lock reached through
// a part's own reference would be another lock to it). A part's entry
// point takes mu_ through its own reference and passes that on. Parts
// reach each other through the accessors below (s.control(),
// s.watchers(), ...): pointers the Scheduler sets at construction and
// never replaces.
//
// The job's life (job_life.cc: queued, started, ended, requeued, and the
// notes in its diary) is helpers on this class rather than a part of its
// own: it owns nothing but what is here, every part calls it, and as the
// state's own functions it is checked against s.mu_ with no part between.
//
// Locks taken while mu_ is held are leaves of their own (the event hub's,
// the diary followers', the disk guard's, the rendezvous', the
// SlurmBridge's own mu_); Admin's purge_mu_ is taken before it, never
// under it.
#ifndef DLBATCH_SCHEDULER_SCHEDULER_STATE_H_
#define DLBATCH_SCHEDULER_SCHEDULER_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/placement.h"
#include "scheduler/disk_guard.h"
#include "scheduler/event_hub.h"
#include "scheduler/metrics.h"
#include "scheduler/rendezvous.h"
#include "scheduler/scheduler_options.h"
#include "scheduler/slurm/bridge.h"
#include "scheduler/store/blob_store.h"
#include "scheduler/store/store.h"

namespace dlbatch::scheduler {

class Control;
class DiaryFollowHub;
class Preemptions;
class Users;
class Watchers;

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

class SchedulerState {
 public:
  struct ActiveJob {
    JobRecord record;
    std::vector<bool> part_ended;
    std::vector<int> part_exit;
    std::string failure;  // first failing part's reason
    bool cancel_requested = false;
    std::string cancel_reason;
    v1::TrainProgress progress;  // train jobs: the latest report
    // The stored checkpoint a later attempt resumes from: the newest of
    // part 0, or with `checkpoint: per-part` part 0's of the newest step
    // every part stored (empty: none).
    v1::CheckpointStored checkpoint;
    // Every stored checkpoint kept (kept_checkpoints.h), by part and then
    // iteration: the newest few of each part, `checkpoint` among them.
    std::vector<v1::CheckpointStored> kept_checkpoints;
    DiaryBudget diary;               // loaded with the first line
    int64_t disk_dropped_lines = 0;  // lines refused while the disk was full
    int64_t disk_dropped_bytes = 0;
    // Job control (control.cc): a held job, or one waiting for
    // the jobs in `after`, is queued but not in the placement core; a
    // requeue asked while it runs stops it and queues it again.
    bool held = false;
    std::vector<int64_t> after;
    bool requeue_requested = false;
    // Preemption (preemptions.h): the preemptions it suffered, oldest
    // first; the last is under way while not done (the job is stopping).
    std::vector<v1::Preemption> preemptions;
    // When its newest stored checkpoint reached the scheduler (0: none
    // known; after a restart, its progress report's time).
    int64_t checkpoint_ms = 0;
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
    // Its GPUs' latest NVML readings (Heartbeat.gpus) and when it took
    // them: memory only, this session's (cleared when it registers, goes
    // or is lost).
    std::vector<v1::GpuReading> gpus;
    int64_t gpus_read_ms = 0;
  };
  using Outbox = std::vector<
      std::pair<std::shared_ptr<WorkerSession>, v1::SchedulerMessage>>;

  // Borrowed pointers must outlive the state. disk: the state folder's
  // space (null: one that notes only failed writes).
  SchedulerState(Store* store, StoreReader* reader, BlobStore* blobs,
                 const Clock* clock, SchedulerOptions options, DiskGuard* disk);
  virtual ~SchedulerState() = default;
  SchedulerState(const SchedulerState&) = delete;
  SchedulerState& operator=(const SchedulerState&) = delete;

  // ---- what a part asks of the Scheduler ----
  // A write failed after memory took the change: memory is ahead of the
  // store. Instead of dying (a full disk would make that a crash loop), the
  // scheduler does in-process what a restart does: drops every worker
  // stream (workers reconnect and resend what was not acknowledged) and
  // reloads memory from the last commit. No transaction may be open.
  virtual void Recover(const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Runs a placement pass and commits its decisions in a transaction of its
  // own (recovering if that fails). REQUIRES: no transaction open.
  virtual absl::Status PlaceJobs(Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // ---- helpers over the state (scheduler_state.cc) ----
  // Runs `body` in a transaction and commits it; if either fails, the
  // transaction is rolled back, memory reloaded (Recover) and the failure
  // returned. REQUIRES: no transaction open.
  absl::Status InTransaction(const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `txn`, timing it for the metrics.
  absl::Status TimedCommit(Transaction& txn);
  // OK unless writes that grow the store are refused now.
  absl::Status CheckWritable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores the user's usage of ended jobs as the core has it now.
  // REQUIRES: a transaction open.
  absl::Status SaveUsage(const std::string& user)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An empty placement core with the options' half-life and the limits.
  std::unique_ptr<PlacementCore> NewCore() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends each message of `out` (a null session: dropped) and empties it.
  // Call without mu_.
  static void Deliver(Outbox& out);
  // Asserts that mu_, held, is the Slurm bridge's host lock: the bridge's
  // methods that require it may be called after this.
  void SlurmLockHeld() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_ASSERT_EXCLUSIVE_LOCK(bridge().host_mutex()) {
    bridge().host_mutex().AssertHeld();
  }

  // ---- a job's life (job_life.cc) ----
  // All REQUIRE mu_ held and, where they write, a transaction open.
  // A queued job's way to its start: the placement core for profiles of
  // workers, the Slurm thread's launches for profiles of Slurm.
  void EnqueueJob(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts attempt rec.attempt + 1 of a queued job on `parts`: the record,
  // its event and the StartJob messages (into `starts`). The core already
  // holds the parts.
  absl::Status BeginAttempt(ActiveJob& job, const std::vector<Part>& parts,
                            int64_t now, Outbox* starts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetState(ActiveJob& job, v1::JobState state,
                        const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EndJob(ActiveJob& job, v1::JobState state, int exit_code,
                      const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every part of `job` has ended: the job ends (or is requeued, as asked)
  // as its workers reported.
  absl::Status EndAsReported(ActiveJob& job, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeues (or fails, past max_attempts) a job whose worker was lost.
  absl::Status RequeueLost(ActiveJob& job, const std::string& why, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's attempt is over and it is queued again (its parts and their
  // ends cleared), with `reason` in its history; its user's workers asked
  // about it where they were not.
  absl::Status QueueAgain(ActiveJob& job, const std::string& reason,
                          Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the job's parts still running, but `skip_part`.
  void CancelParts(const ActiveJob& job, const std::string& why, int skip_part,
                   Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a line of dlbatch's own to a job's diary.
  absl::Status Diary(int64_t job_id, int attempt, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A note in the diary of a job that ends about what it lost (lines
  // refused while the disk was full).
  absl::Status NoteLosses(ActiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job changed: its diary followers and waiters are woken (their
  // reads take mu_: after this commit) and watchers sent its state.
  void Changed(int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static QueuedJob ToQueued(const JobRecord& job);
  static v1::Job RecordToProto(const JobRecord& rec);

  // ---- the parts: set at construction, never replaced ----
  Control& control() const { return *parts_.control; }
  Users& users() const { return *parts_.users; }
  Watchers& watchers() const { return *parts_.watchers; }
  Preemptions& preemptions() const { return *parts_.preemptions; }
  DiaryFollowHub& follow() const { return *parts_.follow; }
  slurm::SlurmBridge& bridge() const { return *parts_.bridge; }

  // ---- collaborators: set at construction, never replaced ----
  Store* const store_;  // its writer: only under mu_
  StoreReader* const reader_;
  BlobStore* const blobs_;
  const Clock* const clock_;
  const SchedulerOptions options_;
  std::unique_ptr<DiskGuard> own_disk_;  // when none was passed in
  DiskGuard* const disk_;
  // Where the scheduler reports what it does; null: nowhere. Set before
  // Start.
  Metrics* metrics_ = nullptr;
  // The train jobs' rendezvous (thread-safe on its own).
  RendezvousStore rendezvous_;

  // ---- the shared state ----
  mutable absl::Mutex mu_;
  // Replaced whole by Recover.
  std::unique_ptr<PlacementCore> core_ ABSL_GUARDED_BY(mu_);
  // (user, profile): kept across reloads. Written by Users (SetUserLimit)
  // and Load.
  std::map<std::pair<std::string, std::string>, UserLimit> limits_
      ABSL_GUARDED_BY(mu_);
  // Set when Recover could not reload; the loop retries, and until then
  // worker messages are dropped and writes refused.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<int64_t, ActiveJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  // Placement passes, for Admin's GetStats.
  int64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
  double last_pass_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double max_pass_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // The worker streams': which worker each registered stream is.
  std::unordered_map<const WorkerSession*, int64_t> session_worker_
      ABSL_GUARDED_BY(mu_);
  // Names of connected workers just removed (Control): their next
  // registration is refused, once.
  std::set<std::string> refuse_once_ ABSL_GUARDED_BY(mu_);
  // Control's: jobs with a non-empty `after`, and whether one ended since
  // they were last looked at (ResolveAfter).
  std::set<int64_t> waiting_after_ ABSL_GUARDED_BY(mu_);
  bool after_dirty_ ABSL_GUARDED_BY(mu_) = false;
  // Preemptions': each queued job that preempted others -> those still
  // stopping for it.
  std::map<int64_t, std::vector<int64_t>> preempting_for_ ABSL_GUARDED_BY(mu_);
  // The watchers': the workers each running job holds, valid while
  // watched.
  WorkerJobsIndex watched_slots_ ABSL_GUARDED_BY(mu_);

 protected:
  // The Scheduler's constructor names its parts, once.
  struct Parts {
    Control* control = nullptr;
    Users* users = nullptr;
    Watchers* watchers = nullptr;
    Preemptions* preemptions = nullptr;
    DiaryFollowHub* follow = nullptr;
    slurm::SlurmBridge* bridge = nullptr;
  };
  void SetParts(const Parts& parts) { parts_ = parts; }

 private:
  Parts parts_;
};

// The Outbox of the caller that holds mu_, as the Slurm bridge passes it
// back to its host (slurm/host.h).
struct slurm::WorkerMail {
  SchedulerState::Outbox* out;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SCHEDULER_STATE_H_
