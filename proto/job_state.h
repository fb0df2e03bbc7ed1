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

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_JOB_STATE_H_
