// The %N of job arrays (submit --array 0-99%10): at most N jobs of one
// array run at once. Part of the pure placement core (placement.h), which
// feeds it every queued and running job of an array with a limit.
//
// How: of an array's queued jobs, only the first (limit - running) in
// queue order are *released* (in the placement queue, where a pass may
// start them); the others are *parked*, out of the placement queue, so that
// a pass never looks at them however many there are. The core tells this
// class what happened to each job and then calls Settle, which says which
// jobs to move between the two so that, for every array:
//
//   released = the first min(queued, max(0, limit - running)) queued jobs
//
// A job started moves from released to running, which keeps the sum, so a
// placement pass needs no Settle; a job that ends, leaves the queue or is
// queued again (a requeue, ahead of the parked ones) moves others. Running
// jobs over the limit (known after a restart, or a limit lowered) park
// every queued job until enough of them end.
//
// Pure: no I/O, no clock, no threads; not thread-safe.
#ifndef DLBATCH_SCHEDULER_CORE_ARRAY_LIMITS_H_
#define DLBATCH_SCHEDULER_CORE_ARRAY_LIMITS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace dlbatch::scheduler {

// One job of an array with a limit, as the core orders it: higher
// priority first, then older sequence, then lower id (the queue's order).
struct ArrayMember {
  int64_t array = 0;
  int limit = 0;  // > 0
  int priority = 0;
  int64_t seq = 0;
  int64_t id = 0;
};

// Where an array stands, for why its jobs wait.
struct ArrayStanding {
  int64_t array = 0;
  int limit = 0;
  int running = 0;
  int released = 0;  // queued jobs placement may start
  int parked = 0;    // queued jobs held back by the limit
};

class ArrayLimits {
 public:
  // A job of the array was queued (parked until Settle releases it).
  // REQUIRES: not already queued.
  void Queued(const ArrayMember& job);
  // A queued job left the queue: started, held, cancelled. No-op if it is
  // not queued.
  void Unqueued(const ArrayMember& job);
  // A job of the array is running (counted until Ended).
  void Started(const ArrayMember& job);
  void Ended(const ArrayMember& job);

  // Restores the invariant above for every array changed since the last
  // call: `release(id)` for each parked job that placement may now start,
  // `park(id)` for each released one it may not (both before returning;
  // neither may call back into this class).
  void Settle(const std::function<void(int64_t)>& release,
              const std::function<void(int64_t)>& park);

  // Whether the queued job is parked (its array at its limit).
  bool IsParked(const ArrayMember& job) const;
  std::optional<ArrayStanding> Standing(int64_t array) const;

 private:
  struct Key {
    int priority = 0;
    int64_t seq = 0;
    int64_t id = 0;
    bool operator<(const Key& o) const {
      if (priority != o.priority) return priority > o.priority;
      if (seq != o.seq) return seq < o.seq;
      return id < o.id;
    }
  };
  struct Group {
    int limit = 0;
    int running = 0;
    std::set<Key> released;
    std::set<Key> parked;
  };
  static Key KeyOf(const ArrayMember& job) {
    return {job.priority, job.seq, job.id};
  }
  Group& Touch(const ArrayMember& job);

  std::map<int64_t, Group> groups_;  // by array id
  std::set<int64_t> dirty_;          // arrays to settle
};

// Why a parked job waits: "array 12 has 3 of 3 running (%3)", or, while
// some of its room goes to queued jobs ahead, "array 12 has 1 of 3 running
// and 2 next to start (%3)".
std::string ArrayWaitText(const ArrayStanding& standing);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_ARRAY_LIMITS_H_
