// The scheduling core: which queued job starts where, and why a job waits.
//
// A pure state machine (ninja's Plan): no I/O, no clock reads, no threads.
// It is fed events (a job queued, a job ended, a worker joined or was lost)
// and Schedule(now) returns the jobs to start now. The caller persists the
// decisions and carries them out; time comes in as arguments.
//
// Policy:
//  - Order: higher priority first; among equal priorities, the user with the
//    least fair-share usage first (see below); then lower submission
//    sequence. With one user this is priority, then submission order.
//  - Limits: per (user, profile), at most `max_slots` slots of running jobs
//    and at most `max_queued` queued jobs. A job that would take its user
//    past max_slots waits (Explain says so) and holds no one back: it never
//    holds the backfill reservation. max_queued is enforced at submit
//    (CheckAdmission); the core itself never refuses a job.
//  - Fair share (Slurm multifactor style): a user's usage is the slot-time of
//    their jobs, ended and running, on every profile, each moment weighted by
//    2^-(age / half-life); a half-life of 0 turns decay off.
//  - Gang placement: a job starts only when its whole pool is free at once.
//    Best fit on one worker first (the online worker with the fewest free
//    slots that still holds the pool); across workers (fewest workers, most
//    free first) only when the job's max_nodes allows it.
//  - EASY backfill: the first job in order that cannot start gets a
//    reservation: the earliest time its pool frees up, assuming running jobs
//    end at start + time_limit (jobs without a limit never end, for this
//    estimate), on the slots it would then take. A later job may start ahead
//    of it only if it ends (by its own time_limit) before that time, or uses
//    slots that the reservation does not need (when its pool frees only
//    once every job has ended, slots held by jobs without a limit are never
//    counted as unneeded: they would be given again each pass). So the
//    first waiting job is never delayed by backfill, and every job becomes
//    the first in turn.
//    Under limits, the first job also keeps its user's room: a later job of
//    the same user and profile starts ahead of it only if it leaves room for
//    both under the user's max_slots.
//  - Arrays: of an array with a limit (%N), at most N jobs run at once;
//    the array's other queued jobs are parked out of the queue
//    (array_limits.h): they hold no one back and never hold the backfill
//    reservation, and Explain says so (array_limited).
//  - Users: a job goes only to workers that run its user's jobs
//    (WorkerUsers); the others count for it as if they were not there, in
//    placement, in its reservation and in what Explain says.
//
// Not thread-safe; the scheduler calls it under its own lock.
#ifndef DLBATCH_SCHEDULER_CORE_PLACEMENT_H_
#define DLBATCH_SCHEDULER_CORE_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/core/array_limits.h"

namespace dlbatch::scheduler {

using JobId = int64_t;
using WorkerId = int64_t;
using TimeMs = int64_t;

inline constexpr TimeMs kNever = INT64_MAX;

// Schedule(now) repeats a profile's pass while the last one started a job,
// at most this many times.
inline constexpr int kMaxPassesPerSchedule = 8;

struct QueuedJob {
  JobId id = 0;
  std::string profile;
  int pool = 1;
  int priority = 0;
  int64_t seq = 0;           // submission order; unique, smaller is older
  int max_nodes = 1;         // workers the pool may span (>= 1)
  TimeMs time_limit_ms = 0;  // 0: none
  std::string user;          // whose limits and usage it counts in
  // A job of an array with a limit (%N, N = array_limit > 0): at most N
  // jobs of array array_id run at once (array_limits.h). 0: none.
  int64_t array_id = 0;
  int array_limit = 0;
};

inline constexpr int kNoLimit = -1;

// Whose jobs a worker runs, as the scheduler has learnt it. A worker started
// as root runs anyone its machine knows (anyone = false, asked user by user:
// `can` and `cannot` hold the answers, a user in neither is undecided); a
// worker not started as root runs only its own user's (can = {it},
// closed). The default, anyone, is a worker that said nothing.
struct WorkerUsers {
  bool anyone = true;
  bool closed = false;  // users outside `can` are all refused
  std::set<std::string> can;
  std::set<std::string> cannot;
};

enum class UserFit { kYes, kNo, kUndecided };
UserFit FitOf(const WorkerUsers& users, const std::string& user);

// What one user may hold on one profile; kNoLimit: unlimited.
struct UserLimit {
  int max_slots = kNoLimit;   // slots of running jobs
  int max_queued = kNoLimit;  // queued jobs, checked at submit
  bool operator==(const UserLimit&) const = default;
};

struct LimitEntry {
  std::string user;
  std::string profile;
  UserLimit limit;
};

// A user's fair-share standing at a given time.
struct UserUsage {
  std::string user;
  double slot_seconds = 0;  // decayed usage, running jobs included
  double share = 0;         // fraction of all users' decayed usage (0..1)
  int running_slots = 0;    // on every profile
};

// The slots a job holds on one worker.
struct Part {
  WorkerId worker = 0;
  std::vector<int> devices;  // device indices on that worker, ascending
  bool operator==(const Part&) const = default;
};

struct Decision {
  JobId job = 0;
  std::vector<Part> parts;  // one per worker, in the order chosen
};

// Why a queued job waits, for `dlbatch show`.
struct WaitInfo {
  int needed = 0;         // the job's pool
  int free_now = 0;       // free slots on the profile's online workers
  int largest_free = 0;   // most free on one online worker
  int online_slots = 0;   // all slots on online workers of the profile
  int offline_slots = 0;  // slots on workers not connected (lost included)
  int jobs_ahead = 0;     // queued jobs of the profile ordered before it
  // Its place in QueueOrder(profile), from 1; 0 while parked (its array is
  // at its limit: it is not in the order).
  int position = 0;
  JobId first_ahead = 0;  // the first of them (0 if none)
  int first_ahead_priority = 0;
  int draining_slots = 0;  // slots on connected workers that are draining
  bool reserved = false;   // it holds the backfill reservation
  TimeMs reserved_start = kNever;  // estimated start when reserved
  // Its user's running slots on the profile and their max_slots there: it
  // waits for its user's own jobs when over_limit (held + needed > limit).
  std::string user;
  int user_slots = 0;
  int user_slot_limit = kNoLimit;
  bool over_limit = false;
  // Online workers of the profile that cannot run its user's jobs (or have
  // not said yet); the others are able, with able_free slots free.
  int unable_workers = 0;
  int undecided_workers = 0;  // of the unable: not answered yet
  int able_workers = 0;
  int able_free = 0;
  // Whether the job fits the workers that take jobs now (those that run its
  // user's), once their slots are free. When it does not, it waits for
  // workers that take none now: `draining` (connected) and `offline` (not
  // connected: gone, lost, or not back since a restart), the profile's
  // workers in each that may run its user's jobs, by id.
  bool fits_online = true;
  std::vector<WorkerId> draining;
  std::vector<WorkerId> offline;
  // Parked: its array is at its limit (ArrayWaitText(array) says so).
  bool array_limited = false;
  ArrayStanding array;
};

// What the caller calls a worker in the core's messages: its name, and why
// it does not count now ("offline since 12:03:04"). Without a labeler a
// worker is "#<id>", "offline".
struct WorkerLabel {
  std::string name;
  std::string state;
};
using WorkerLabeler = std::function<WorkerLabel(WorkerId)>;

struct ProfileSummary {
  std::string name;
  int max_pool_configured = 0;  // 0: no configured limit
  int workers = 0;
  int workers_online = 0;
  int online_slots = 0;
  int free_slots = 0;
  int known_slots = 0;     // online and offline workers together
  int largest_worker = 0;  // most slots on one known worker
  int queued = 0;
  int running = 0;
};

// What the preemption chooser (preemption.h) needs from the core about one
// queued job; see PlacementCore::PreemptionSnapshot.
struct WorkerSlots {  // a worker that takes the job now
  WorkerId id = 0;
  int slots = 0;
  int free = 0;
};
struct RunningSlots {  // a running job of the job's profile
  JobId id = 0;
  std::string user;
  int priority = 0;
  std::vector<Part> parts;  // the devices it holds, on every worker
  TimeMs start = 0;
};
struct PlacementSnapshot {
  QueuedJob job;
  // Its pool fits under its user's max_slots on its profile now.
  bool within_limit = true;
  int user_slots = 0;  // its user's running slots on the profile
  int user_slot_limit = kNoLimit;
  // The profile's workers that take the job now (online, not draining,
  // running its user's jobs), by id.
  std::vector<WorkerSlots> workers;
  // Those of priority up to the job's (no other may ever be preempted for
  // it), by id; `higher` counts the others.
  std::vector<RunningSlots> running;
  int higher = 0;
  // Users with queued or running jobs on any profile, their share taken
  // among these users alone; by user.
  std::vector<UserUsage> active_usage;
};

class PlacementCore {
 public:
  PlacementCore();
  ~PlacementCore();
  PlacementCore(const PlacementCore&) = delete;
  PlacementCore& operator=(const PlacementCore&) = delete;

  // Declares a profile. max_pool > 0 caps the pool of its jobs. A profile
  // also comes into being when a worker joins it. Redeclaring updates the cap.
  void AddProfile(const std::string& name, int max_pool);
  bool HasProfile(const std::string& name) const;

  // A worker joined (or rejoined) `profile` with `slots` devices, numbered
  // 0..slots-1; it is online. If it was known, the jobs it still runs keep
  // their devices (slots may change; devices held beyond the new count stay
  // held until their jobs end).
  void WorkerOnline(WorkerId worker, const std::string& profile, int slots);
  // The worker's connection broke but it is not yet lost: it takes no new
  // jobs, its running jobs keep their slots, and CheckSatisfiable no longer
  // counts it (it is offline: its slots are not capacity).
  void WorkerOffline(WorkerId worker);
  // As WorkerOffline, for a worker known from before a scheduler restart
  // that has not reconnected yet: it is expected back, so CheckSatisfiable
  // still counts it, until it comes online, goes offline or is lost.
  void WorkerAwaited(WorkerId worker);
  // The worker is lost: its running jobs are removed from the core (the
  // caller requeues or fails them) and returned; its slots leave the online
  // pool. It stays known (offline, counted in known capacity) until Forget.
  std::vector<JobId> WorkerLost(WorkerId worker);
  void ForgetWorker(WorkerId worker);
  // A draining worker takes no new jobs (as if offline) while its running
  // jobs keep their slots; CheckSatisfiable counts it (drain is
  // maintenance: jobs queue for it and start once it is resumed). Kept
  // across WorkerOnline/WorkerOffline until set false.
  void SetDraining(WorkerId worker, bool draining);
  // Whose jobs the worker runs (replaces what was known); a worker's users
  // stay when it goes offline or comes back online. Jobs already running
  // there stay.
  void SetWorkerUsers(WorkerId worker, WorkerUsers users);
  // The worker's answer about one user (kept until SetWorkerUsers).
  void SetWorkerUser(WorkerId worker, const std::string& user, bool can);
  // Drops the worker's answer about `user`: undecided again (asked anew).
  void ForgetWorkerUser(WorkerId worker, const std::string& user);
  // Whether each registered worker of `profile` (online or not) runs
  // `user`'s jobs, by worker id.
  std::vector<std::pair<WorkerId, UserFit>> UserFits(
      const std::string& profile, const std::string& user) const;

  // OK if the profile could start the job: it exists, the pool is >= 1,
  // within max_pool, and within the largest placement its workers allow
  // (one worker's slots, or the sum of the max_nodes largest), counting
  // the workers that are connected (draining ones included) or awaited,
  // not the offline or lost ones. The message says the profile's size,
  // names the offline workers left out (through `labels`), and what to
  // change: waiting for them, where the job would fit with them.
  absl::Status CheckSatisfiable(const QueuedJob& job,
                                const WorkerLabeler& labels = nullptr) const;
  // Queued jobs that no placement on every registered worker of their
  // profile (lost and draining ones included) could ever start, with the
  // reason: after a profile shrank (ForgetWorker). By job id.
  std::vector<std::pair<JobId, std::string>> Unrunnable() const;

  // OK if job's user may queue `count` more jobs like it on its profile:
  // within max_queued, and its pool within max_slots (else it could never
  // start). The message names the limit and what to do.
  absl::Status CheckAdmission(const QueuedJob& job, int count = 1) const;

  // Sets (replaces) the limits of `user` on `profile`; takes effect at the
  // next pass. Jobs already queued or running stay.
  void SetLimit(const std::string& user, const std::string& profile,
                const UserLimit& limit);
  UserLimit GetLimit(const std::string& user, const std::string& profile) const;
  // Every limit that is not unlimited, by profile then user.
  std::vector<LimitEntry> Limits() const;

  // The fair-share half-life; 0: no decay. Default 7 days.
  // REQUIRES: no job has run and no usage was charged yet.
  void SetFairShareHalfLife(TimeMs half_life);
  // Adds `slot_ms` of usage for `user` as of time `at` (it decays from
  // then): usage restored after a restart, or charged from outside.
  void ChargeUsage(const std::string& user, double slot_ms, TimeMs at);
  // Every user the core knows, decayed to `now`, least usage first.
  std::vector<UserUsage> Usage(TimeMs now) const;
  // The user's usage of ended jobs (and charges) alone, as decayed slot-ms
  // at `at`: what ChargeUsage(user, it, at) restores in a new core.
  double EndedUsage(const std::string& user, TimeMs at) const;

  // REQUIRES: CheckSatisfiable(job) was OK when it was submitted; job.id is
  // neither queued nor running.
  void Enqueue(const QueuedJob& job);
  // Removes a queued job; returns false if it is not queued.
  bool Dequeue(JobId job);

  // Records a running job that holds `parts` since `start` (recovery after a
  // restart, or a job reported by a reconnecting worker). Device indices
  // beyond a worker's slots are tolerated.
  void MarkRunning(const QueuedJob& job, const std::vector<Part>& parts,
                   TimeMs start);
  // A running job ended and every process of it has exited: its slots are
  // free, and its user is charged its slot-time from start to `end`.
  // Returns false if it was not running. Without `end`, and for the jobs of
  // a lost worker, it is charged up to the last pass's time.
  bool Finished(JobId job);
  bool Finished(JobId job, TimeMs end);

  // One placement pass at time `now`. Returns the jobs to start, each
  // already marked running in the core, in the order decided.
  std::vector<Decision> Schedule(TimeMs now);

  // The job of `profile` that preempts, as of the last Schedule: the first
  // queued job in queue order that its pass could not start, that its
  // user's max_slots does not hold back and that fits the profile's online
  // workers once they are free (the job holding the backfill reservation).
  // nullopt if there is none, the profile is unknown, or that job started or
  // left the queue since (until the next Schedule). Recorded by the pass;
  // where no pass reached such a job, the profile being full (the last free
  // slot given, or none free to start with), it is looked for at the call
  // in the queue as it is then (none if slots came free since: the next
  // Schedule decides), in O(the profile's users + the jobs skipped).
  std::optional<JobId> FirstBlocked(const std::string& profile) const;

  // The queued jobs of `profile` in the order a pass tries them: higher
  // priority first, then the user with the least fair-share usage (decayed
  // to the last Schedule's time, running jobs counted), then the older
  // submission. Jobs parked by their array's limit are not in it (a pass
  // does not try them). A pass may start later ones first (backfill, or
  // jobs that fit where earlier ones do not); this is the order it looks
  // at them in, and the order in which each becomes the first to wait. In
  // O(q log q) for the profile's q queued jobs. Empty for an unknown
  // profile.
  std::vector<JobId> QueueOrder(const std::string& profile) const;

  // The queued job's standing as the preemption chooser needs it, with
  // usage decayed to `now`; nullopt if it is not queued.
  std::optional<PlacementSnapshot> PreemptionSnapshot(JobId job,
                                                      TimeMs now) const;
  // Whether a pass would place the queued job if the running jobs
  // `released` (ids; unknown ones ignored) had ended: within its user's
  // max_slots (their slots not counted back), on the workers that take it
  // now, on free slots and theirs. False if it is not queued.
  bool FitsWithReleased(JobId job, const std::vector<JobId>& released) const;

  // REQUIRES: job is queued.
  std::optional<WaitInfo> Explain(JobId job) const;
  // Explain of each of `jobs` (nullopt for one not queued), the same
  // answers in one walk of each profile's queue: O(q log q) per profile
  // for its q queued jobs, however many are asked about, where Explain
  // walks the jobs ahead of each. For listings.
  std::vector<std::optional<WaitInfo>> ExplainMany(
      const std::vector<JobId>& jobs) const;
  // WaitInfo::position of each of `jobs` as ExplainMany has it (0 for one
  // not queued or parked), without the rest of the explanation.
  std::vector<int> QueuePositions(const std::vector<JobId>& jobs) const;
  std::vector<ProfileSummary> Profiles() const;
  // Free device indices of a worker (ascending); empty if unknown.
  std::vector<int> FreeDevices(WorkerId worker) const;

  size_t queued_count() const;
  size_t running_count() const;
  bool IsQueued(JobId job) const;
  bool IsRunning(JobId job) const;

 private:
  struct State;
  // Explain's parts: what it says but the jobs ahead; then, with whether
  // one of those could run, the position and the reservation. REQUIRES:
  // job is queued.
  WaitInfo ExplainStanding(JobId job) const;
  void FinishExplain(JobId job, bool head_ahead, WaitInfo* info) const;

  std::unique_ptr<State> state_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_PLACEMENT_H_
