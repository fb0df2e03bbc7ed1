// The scheduling core: which queued job starts where, and why a job waits.
//
// A pure state machine (ninja's Plan): no I/O, no clock reads, no threads.
// It is fed events (a job queued, a job ended, a worker joined or was lost)
// and Schedule(now) returns the jobs to start now. The caller persists the
// decisions and carries them out; time comes in as arguments.
//
// Policy:
//  - Order: higher priority first, then lower submission sequence.
//  - Gang placement: a job starts only when its whole pool is free at once.
//    Best fit on one worker first (the online worker with the fewest free
//    slots that still holds the pool); across workers (fewest workers, most
//    free first) only when the job's max_nodes allows it.
//  - EASY backfill: the first job in order that cannot start gets a
//    reservation: the earliest time its pool frees up, assuming running jobs
//    end at start + time_limit (jobs without a limit never end, for this
//    estimate), on the slots it would then take. A later job may start ahead
//    of it only if it ends (by its own time_limit) before that time, or uses
//    slots that the reservation does not need. So the first waiting job is
//    never delayed by backfill, and every job becomes the first in turn.
//
// Not thread-safe; the scheduler calls it under its own lock.
#ifndef DLBATCH_SCHEDULER_PLACEMENT_H_
#define DLBATCH_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace dlbatch::scheduler {

using JobId = int64_t;
using WorkerId = int64_t;
using TimeMs = int64_t;

inline constexpr TimeMs kNever = INT64_MAX;

struct QueuedJob {
  JobId id = 0;
  std::string profile;
  int pool = 1;
  int priority = 0;
  int64_t seq = 0;           // submission order; unique, smaller is older
  int max_nodes = 1;         // workers the pool may span (>= 1)
  TimeMs time_limit_ms = 0;  // 0: none
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
  int offline_slots = 0;  // slots on known workers that are offline
  int jobs_ahead = 0;     // queued jobs of the profile ordered before it
  JobId first_ahead = 0;  // the first of them (0 if none)
  int first_ahead_priority = 0;
  bool reserved = false;           // it holds the backfill reservation
  TimeMs reserved_start = kNever;  // estimated start when reserved
};

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
  // The worker is unreachable but not yet lost: it takes no new jobs, its
  // running jobs keep their slots.
  void WorkerOffline(WorkerId worker);
  // The worker is lost: its running jobs are removed from the core (the
  // caller requeues or fails them) and returned; its slots leave the online
  // pool. It stays known (offline, counted in known capacity) until Forget.
  std::vector<JobId> WorkerLost(WorkerId worker);
  void ForgetWorker(WorkerId worker);

  // OK if the profile could ever start the job: it exists, the pool is >= 1,
  // within max_pool, and within the largest placement its known workers
  // allow (one worker's slots, or the sum of the max_nodes largest).
  // The message says the profile's size and what to change.
  absl::Status CheckSatisfiable(const QueuedJob& job) const;

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
  // free. Returns false if it was not running.
  bool Finished(JobId job);

  // One placement pass at time `now`. Returns the jobs to start, each
  // already marked running in the core, in the order decided.
  std::vector<Decision> Schedule(TimeMs now);

  // REQUIRES: job is queued.
  std::optional<WaitInfo> Explain(JobId job) const;
  std::vector<ProfileSummary> Profiles() const;
  // Free device indices of a worker (ascending); empty if unknown.
  std::vector<int> FreeDevices(WorkerId worker) const;

  size_t queued_count() const;
  size_t running_count() const;
  bool IsQueued(JobId job) const;
  bool IsRunning(JobId job) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_PLACEMENT_H_
