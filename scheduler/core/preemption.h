// Preemption policy of the scheduling core: which running jobs a queued job
// that cannot start may take the slots of, and the text it then shows.
//
// Pure: no I/O, no clock reads. ChooseVictims weighs one waiting job against
// the running jobs of its profile and returns the jobs to preempt (or why
// none), and the caller carries the preemption out (signals, checkpoints,
// requeues). It decides; it changes nothing in the core.
//
// Policy, per profile (PreemptionPolicy):
//  - kOff: nothing is preempted.
//  - kPriority: a waiting job may take the slots of running preemptible jobs
//    of strictly lower priority.
//  - kFairShare: as kPriority, and also, at equal priority, of jobs of users
//    above their fair share when the waiting job's user is below theirs (a
//    reclaim). A user's fair share is 1/N of the usage of the N users with
//    queued or running jobs; their share is their part of those users'
//    decayed usage (PlacementCore's fair-share ledger).
//  - Never a non-preemptible job; never a job inside min_run of its
//    (re)start, so every start, a preemptor's included, runs that long.
//  - Never for a job that its user's max_slots holds (preemption never makes
//    room under a limit), that fits now, or that would not fit the workers
//    that take it even with every job of its priority or lower gone; and the
//    chosen set is confirmed with the core (PlacementCore::FitsWithReleased).
//  - Whole jobs: a victim frees every slot it holds, on every worker.
//  - Choice: the fewest victims whose release lets the job start; among
//    equally few, the least work lost in sum (ms since each victim's last
//    stored checkpoint, or its start without one), then the lowest sum of
//    priorities, then the most recent starts (largest sum of start times),
//    then the lowest ids.
//  - No cycle, no thrash:
//    (a) A job never preempts one that preempted it, unless it now has a
//        strictly higher priority than that job.
//    (b) A job that was once reclaimed from (preempted at equal priority)
//        never reclaims: it may still preempt jobs of lower priority.
//    With fixed priorities this rules out every cycle of preemptions: a
//    priority preemption goes to a strictly lower priority, so a cycle holds
//    reclaims alone; its latest reclaim's preemptor was reclaimed from
//    earlier in the cycle, which (b) forbids. And min_run keeps a
//    preemptor's new start from being taken at once by anyone.
//
// Search: with max_nodes 1 the job goes on one worker, so each worker is
// solved alone: the fewest of its jobs that free its missing slots, all
// subsets of that size of the jobs holding slots there (at most its slot
// count) weighed; workers needing more victims than the best are skipped.
// A job that may span workers is searched over all candidates: first
// greedily by worker (the max_nodes workers with the most room once their
// candidates are gone, then the candidates freeing the most there, then
// dropping victims not needed); then subsets by increasing size from a
// lower bound (the fewest that free enough slots in sum), pruned by that
// sum, up to the greedy choice's size. Both searches stop at a budget of
// subsets weighed (kSingleWorkerBudget leaves of a few additions each,
// kSpanBudget fits of O(max_nodes + workers touched) each), then keep the
// best found at the smallest size, or the greedy choice; `exact` says
// whether the minimum was proved (always, for max_nodes 1, as to the
// count). So one call costs O(R log R + W) for R running jobs on W workers
// plus the bounded search: about 1 ms at 1,800 running jobs and 100,000
// queued (bench/placement_bench.cc).
#ifndef DLBATCH_SCHEDULER_CORE_PREEMPTION_H_
#define DLBATCH_SCHEDULER_CORE_PREEMPTION_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/core/placement.h"

namespace dlbatch::scheduler {

enum class PreemptionMode { kOff, kPriority, kFairShare };

inline constexpr TimeMs kDefaultPreemptGraceMs = 2 * 60 * 1000;
inline constexpr TimeMs kDefaultPreemptMinRunMs = 10 * 60 * 1000;

// Subsets weighed at most per call (see the header comment).
inline constexpr int64_t kSingleWorkerBudget = 200000;
inline constexpr int64_t kSpanBudget = 4096;

// One profile's preemption settings.
struct PreemptionPolicy {
  PreemptionMode mode = PreemptionMode::kOff;
  // From the signal to the kill: how long a victim has to checkpoint.
  TimeMs grace_ms = kDefaultPreemptGraceMs;
  // A job is never preempted within this long of its (re)start.
  TimeMs min_run_ms = kDefaultPreemptMinRunMs;
  // Whether a job that does not say (JobSpec.preemptible unset) may be.
  bool jobs_preemptible = true;
};

// Why a victim is taken: a lower priority, or a fair-share reclaim at equal
// priority.
enum class PreemptionKind { kPriority, kReclaim };

// One preemption a job suffered (on any of its attempts): by which job, how.
struct Displacement {
  JobId by = 0;
  PreemptionKind kind = PreemptionKind::kPriority;
};

// A running job, as the chooser weighs it.
struct PreemptionCandidate {
  JobId id = 0;
  std::string user;
  int priority = 0;
  bool preemptible = true;
  std::vector<Part> parts;  // the slots it holds, on every worker
  TimeMs started = 0;       // when its current attempt started
  // When its last stored checkpoint was written; none: its work since
  // `started` is lost.
  std::optional<TimeMs> checkpoint;
};

// The work the candidate loses if preempted at `now`, in ms (>= 0).
TimeMs LostWorkMs(const PreemptionCandidate& c, TimeMs now);

// The queued job that cannot start.
struct WaitingJob {
  JobId id = 0;
  std::string user;
  int priority = 0;
  int pool = 1;
  int max_nodes = 1;
  std::vector<Displacement> displaced;  // the preemptions it suffered
};

struct PreemptionInput {
  WaitingJob job;
  bool within_limit = true;  // its pool fits its user's max_slots now
  int user_slots = 0;        // for the reason text when not
  int user_slot_limit = kNoLimit;
  std::vector<WorkerSlots> workers;  // that take the job now
  std::vector<PreemptionCandidate> running;
  int higher_running = 0;  // running jobs of higher priority not in `running`
  std::vector<UserUsage> usage;  // active users, shares among them
};

// Why nothing is preempted.
enum class NoPreemption {
  kNone,         // victims were chosen
  kOff,          // the policy's mode is off
  kFitsNow,      // the job fits without preempting
  kOverLimit,    // its user's max_slots holds it
  kNeverFits,    // not even the slots of every job of its priority or
                 // lower would do
  kNoVictims,    // the jobs that may be preempted would not free enough
  kCoreRefused,  // the core would not place it on the chosen slots
};

struct Victim {
  JobId id = 0;
  PreemptionKind kind = PreemptionKind::kPriority;
  TimeMs lost_ms = 0;
};

struct PreemptionChoice {
  std::vector<Victim> victims;  // by id; empty when none is possible
  NoPreemption why = NoPreemption::kNone;
  std::string reason;  // why none, for the log and `show`; empty otherwise
  TimeMs lost_ms = 0;  // the victims' lost work, summed
  bool exact = true;   // the search proved the count minimal
  std::vector<JobId> ids() const;
};

// The choice for input.job at `now` from the input alone (the core's view
// as the input says it; see the header comment for the rules).
PreemptionChoice ChooseVictims(const PreemptionInput& input,
                               const PreemptionPolicy& policy, TimeMs now);

// What the core does not keep about a running job.
struct RunningFacts {
  bool preemptible = true;
  std::optional<TimeMs> checkpoint;  // see PreemptionCandidate
};
using RunningFactsFn = std::function<RunningFacts(JobId)>;

// The input for the queued job `waiting` from the core's snapshot, the
// preemptions it suffered and `facts` about each running job (null: every
// job preemptible, none checkpointed). Its running jobs' start is the
// core's (the current attempt's). nullopt if `waiting` is not queued.
std::optional<PreemptionInput> InputFromCore(
    const PlacementCore& core, JobId waiting,
    const std::vector<Displacement>& displaced, TimeMs now,
    const RunningFactsFn& facts);

// ChooseVictims on InputFromCore, the chosen set confirmed with the core
// (kCoreRefused if it would not place the job there).
// REQUIRES: `waiting` is queued.
PreemptionChoice ChooseVictims(const PlacementCore& core, JobId waiting,
                               const std::vector<Displacement>& displaced,
                               const PreemptionPolicy& policy, TimeMs now,
                               const RunningFactsFn& facts);

// ---- Nodes another scheduler allocates (a Slurm partition) ----
//
// There a job asks for `nodes` nodes with `per_node` units each (GPUs, or
// CPUs on CPU-only nodes: the ranks it runs there), the allocator places
// it, and each running job holds the same share of every node it was
// given. The rules are ChooseVictims's: each node is a worker whose slots
// are the job's per-node share (a node with less never takes it), its
// free slots what the allocator has not given out (to anyone), and a
// victim frees its share of each of its nodes.

// One node, in the units the waiting job asks for.
struct NodeRoom {
  std::string name;
  int units = 0;  // all of the node's
  int free = 0;   // not allocated to any job now
};

// A running job on those nodes.
struct NodeCandidate {
  PreemptionCandidate job;         // its parts are not read
  std::vector<std::string> nodes;  // the nodes it was given
  int per_node = 0;                // units it holds on each
};

struct NodePreemptionInput {
  WaitingJob job;              // its pool and max_nodes are not read
  int nodes = 1;               // the nodes it asks for
  int per_node = 1;            // units on each
  std::vector<NodeRoom> room;  // the nodes that may take it
  std::vector<NodeCandidate> running;
  std::vector<UserUsage> usage;  // active users, shares among them
};

// ChooseVictims over the nodes (see above). A candidate's nodes that are
// not in `room` free nothing the job can use.
PreemptionChoice ChooseVictimsOnNodes(const NodePreemptionInput& input,
                                      const PreemptionPolicy& policy,
                                      TimeMs now);

// What the waiting job shows while its victims stop: "preempting jobs 3 and
// 4 (checkpointing; at most 2m)". REQUIRES: victims is not empty.
std::string PreemptingText(const std::vector<JobId>& victims, TimeMs grace_ms);

// A duration as the policy's texts say it: "2m", "1m30s", "1h", "500ms".
std::string DurationText(TimeMs ms);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_PREEMPTION_H_
