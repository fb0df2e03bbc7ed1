// How a scheduler runs: heartbeats, caps, retention, attempts, profiles,
// fair share. Filled from flags and scheduler.yaml by main; read-only once
// the Scheduler has it.
#ifndef DLBATCH_SCHEDULER_SCHEDULER_OPTIONS_H_
#define DLBATCH_SCHEDULER_SCHEDULER_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/core/preemption.h"
#include "scheduler/slurm/commands.h"

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
  // Each profile's preemption (scheduler.yaml's `preemption:`); a profile
  // not named here preempts nothing.
  std::map<std::string, PreemptionPolicy> preemption;
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

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SCHEDULER_OPTIONS_H_
