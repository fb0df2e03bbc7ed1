// The scheduler as the Slurm bridge sees it (bridge.h): its jobs and
// workers, read and changed under its lock, and its store's transactions.
// The bridge decides what Slurm's word means for a job; the host carries
// it out on its own records (ends, requeues, starts, forgotten workers),
// as the worker's shell carries out what its JobTable decides.
//
// Every method but mutex() and WithLock requires the host's lock; those
// that write say whether they commit a transaction of their own or write
// inside the one the caller opened (InTransaction, or the host's batch that
// called the bridge). Each fails only where the store fails.
#ifndef DLBATCH_SCHEDULER_SLURM_HOST_H_
#define DLBATCH_SCHEDULER_SLURM_HOST_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dlbatch/v1/job.pb.h"
#include "scheduler/core/placement.h"
#include "scheduler/core/preemption.h"
#include "scheduler/slurm/launcher.h"

namespace dlbatch::scheduler::slurm {

// Messages to workers that the host's calls collect while its lock is held,
// sent once it is released (no lock is held across a send). Opaque here:
// the bridge passes on what the host gave it.
struct WorkerMail;

// What a job of `spec` asks of its Slurm profile.
JobShape ShapeOf(const v1::JobSpec& spec);

// A job of the host's, as the bridge reads it (SlurmHost::FindJob).
struct HostJob {
  int64_t id = 0;
  int attempt = 0;  // attempts begun: the next is attempt + 1
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string profile;
  std::string user;
  JobShape shape;
  bool held = false;
  bool waits_for_others = false;  // --after jobs not all finished yet
  bool cancel_requested = false;
  bool requeue_requested = false;
  std::string failure;  // the first failing part's reason
  std::vector<bool> part_ended;
  std::vector<int> part_exit;
  bool has_checkpoint = false;  // one is stored to resume from
  // Its current attempt is stopping for a preemption of dlbatch's (not
  // Slurm's own), whose grace ends at stop_deadline_ms; stop_unreachable:
  // a worker of a running part has no stream to be asked on.
  bool stopping = false;
  int64_t stop_deadline_ms = 0;
  bool stop_unreachable = false;
};

// A profile of Slurm with preemption on, as the bridge found it after a
// reconcile (SlurmHost::Preempt): its queued jobs that Slurm holds for
// resources, the partition's nodes, and its running jobs' nodes. Counts
// are in ranks (RoomOf, preempt.h).
struct SlurmPreemptionView {
  std::string profile;
  std::vector<NodeRoom> room;  // the partition's nodes
  struct Waiting {
    int64_t job_id = 0;
    int nodes = 1;     // its Slurm job's
    int per_node = 1;  // ranks on each
  };
  std::vector<Waiting> waiting;
  struct Running {
    int64_t job_id = 0;
    std::vector<std::string> nodes;  // its Slurm job's
    int per_node = 1;                // ranks on each
  };
  std::vector<Running> running;
};

// The parts of the host's jobs on one worker (SlurmHost::PartsOn).
struct WorkerParts {
  bool holds = false;     // some job has a part on it
  bool all_ended = true;  // every part of a running job on it has ended
};

class SlurmHost {
 public:
  virtual ~SlurmHost() = default;

  // The host's lock: it guards the host's jobs and workers, and the
  // bridge's state tied to them (bridge.h).
  virtual absl::Mutex& mutex() const = 0;

  // ---- reads ----
  // The job `id`; nullopt once it has ended (or for one never known).
  virtual std::optional<HostJob> FindJob(int64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  virtual WorkerParts PartsOn(int64_t worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;

  // ---- memory only ----
  // The job's view changed (its wait reason): its watchers are told.
  virtual void JobChanged(int64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The queued job `id` goes its way to a start again: the placement
  // core's, or the bridge's launches where its profile is of Slurm.
  virtual void Enqueue(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // Worker `worker` is sent `refused` with `why`.
  virtual void Refuse(int64_t worker, const std::string& why, WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;

  // ---- locks and transactions ----
  // Runs `body` with the lock held, then, released, sends what it mailed.
  virtual void WithLock(const std::function<void(WorkerMail&)>& body)
      ABSL_LOCKS_EXCLUDED(mutex()) = 0;
  // Runs `body` in one transaction and commits it; where either fails, the
  // host reloads its memory from the last commit (as a restart would) and
  // returns the failure. REQUIRES: no transaction open.
  virtual absl::Status InTransaction(const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // A job's Slurm record (replacing its earlier one), committed in a
  // transaction of its own; refused while the store takes no writes that
  // grow it.
  virtual absl::Status CommitRecord(const SlurmJobRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The job's Slurm record deleted, in a transaction of its own (allowed on
  // a full disk).
  virtual absl::Status CommitForget(int64_t job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // A profile's view (above): the first of its waiting jobs in the host's
  // order may preempt running ones there, as on workers (the choice
  // ChooseVictimsOnNodes'). Commits in a transaction of its own; the stop
  // messages go into `mail`. REQUIRES: no transaction open.
  virtual absl::Status Preempt(const SlurmPreemptionView& view,
                               WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;

  // ---- inside the caller's transaction ----
  // How often the queued job was submitted to Slurm again (0: forgotten).
  virtual absl::Status PutResubmits(int64_t job, int count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // A line of dlbatch's own in the job's diary.
  virtual absl::Status Note(int64_t job, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The queued job ends (`state`: failed or cancelled) with `reason`,
  // after `note` in its diary.
  virtual absl::Status EndQueued(int64_t job, v1::JobState state,
                                 const std::string& note,
                                 const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The queued job starts its next attempt on `parts`, its Slurm job's
  // workers in node order.
  virtual absl::Status StartOnGang(int64_t job, const std::vector<Part>& parts,
                                   WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The running job lost its Slurm job: requeued (or failed past its
  // attempts) with `why`.
  virtual absl::Status RequeueLost(int64_t job, const std::string& why,
                                   WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // Slurm preempted the running job's Slurm job (`why` says so): its
  // parts still running are cancelled and it is queued again as preempted
  // (a Preemption of kind "slurm", by no dlbatch job, not counted against
  // its attempts), to resume from its newest stored checkpoint.
  virtual absl::Status RequeuePreempted(int64_t job, const std::string& why,
                                        WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The running job fails with `why`: its parts still running are
  // cancelled.
  virtual absl::Status FailRunning(int64_t job, const std::string& why,
                                   WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The running job, every part ended, ends as its workers reported.
  virtual absl::Status EndAsReported(int64_t job, WorkerMail& mail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
  // The worker is forgotten: memory, placement and store.
  virtual absl::Status ForgetWorker(int64_t worker, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) = 0;
};

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_HOST_H_
