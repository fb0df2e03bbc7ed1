#include "proto/job_state.h"

#include "absl/strings/str_cat.h"

namespace dlbatch {

const char* JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return "queued";
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_CANCELLING:
      return "cancelling";
    case v1::JOB_STATE_FINISHED:
      return "finished";
    case v1::JOB_STATE_FAILED:
      return "failed";
    case v1::JOB_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

bool ParseJobState(const std::string& text, v1::JobState* state) {
  for (int s = v1::JOB_STATE_QUEUED; s <= v1::JOB_STATE_CANCELLED; ++s) {
    if (text == JobStateName(static_cast<v1::JobState>(s))) {
      *state = static_cast<v1::JobState>(s);
      return true;
    }
  }
  return false;
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_FINISHED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string PreemptedByText(const v1::Preemption& p) {
  if (p.kind() == kPreemptedBySlurm) return "preempted by Slurm";
  if (p.kind() == kPreemptedByReclaim) {
    return absl::StrCat("preempted by job ", p.by_job(),
                        " (a fair-share reclaim at priority ", p.by_priority(),
                        ")");
  }
  return absl::StrCat("preempted by job ", p.by_job(), " (priority ",
                      p.by_priority(), ")");
}

}  // namespace dlbatch
