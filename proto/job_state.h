// Job states as people read and type them: "queued", "running", ...
#ifndef DLBATCH_PROTO_JOB_STATE_H_
#define DLBATCH_PROTO_JOB_STATE_H_

#include <string>

#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

const char* JobStateName(v1::JobState state);
// Parses a name JobStateName returns; false for anything else.
bool ParseJobState(const std::string& text, v1::JobState* state);
bool IsTerminal(v1::JobState state);

// v1.Preemption's kinds.
inline constexpr char kPreemptedByPriority[] = "priority";
inline constexpr char kPreemptedByReclaim[] = "reclaim";
inline constexpr char kPreemptedBySlurm[] = "slurm";
// Who took a job's slots, as every part says it: "preempted by job 7
// (priority 10)", "... (a fair-share reclaim at priority 0)", "preempted by
// Slurm".
std::string PreemptedByText(const v1::Preemption& p);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_JOB_STATE_H_
