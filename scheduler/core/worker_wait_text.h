// What a queued job that waits for workers taking no jobs now is told, and
// how a message says since when a worker is offline. Pure text from the
// facts given; the scheduler gathers them under its lock. Names and drain
// reasons are said as they were written: the CLI escapes what it prints.
#ifndef DLBATCH_SCHEDULER_CORE_WORKER_WAIT_TEXT_H_
#define DLBATCH_SCHEDULER_CORE_WORKER_WAIT_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dlbatch::scheduler {

// A worker a job waits for: draining (with the admin's reason, maybe
// empty), else offline (last heard from at last_seen_ms; 0: never).
struct WaitedWorker {
  std::string name;
  bool draining = false;
  std::string drain_reason;
  int64_t last_seen_ms = 0;
};

// "offline since 12:03:04" in the scheduler's local time zone, with the day
// ("offline since 2024-05-01 12:03:04") when that is not today; "offline"
// for a worker never heard from.
std::string OfflineSince(int64_t last_seen_ms, int64_t now_ms);

// `waiting: worker 'w1' is draining ("new fans")`, each worker in turn
// ("; "), the first kNamedWaitedWorkers named and the rest counted.
// REQUIRES: !workers.empty().
std::string WaitingForWorkers(const std::vector<WaitedWorker>& workers,
                              int64_t now_ms);

inline constexpr size_t kNamedWaitedWorkers = 4;

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_WORKER_WAIT_TEXT_H_
