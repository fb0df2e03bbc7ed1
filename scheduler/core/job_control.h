// Job dependencies (submit --after, Slurm's afterok): whether a job waiting
// for others may start, must wait, or can never start. Pure: fed the states
// of the jobs it waits for.
#ifndef DLBATCH_SCHEDULER_CORE_JOB_CONTROL_H_
#define DLBATCH_SCHEDULER_CORE_JOB_CONTROL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dlbatch/v1/job.pb.h"

namespace dlbatch::scheduler {

struct AfterVerdict {
  enum Kind { kReady, kWait, kNever } kind = kReady;
  std::string reason;  // kWait: what it waits for; kNever: why it fails
};

// One job it runs after: its id and state (nullopt: no such job, e.g.
// purged) and, for an ended one, why it ended.
struct AfterJob {
  int64_t id = 0;
  std::optional<v1::JobState> state;
  std::string reason;
};

// kNever as soon as one job ended other than finished (or is gone), naming
// the first such; else kWait while one has not ended, naming those; else
// kReady.
AfterVerdict DecideAfter(const std::vector<AfterJob>& after);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_JOB_CONTROL_H_
