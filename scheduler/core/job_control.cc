#include "scheduler/core/job_control.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/job_state.h"

namespace dlbatch::scheduler {

AfterVerdict DecideAfter(const std::vector<AfterJob>& after) {
  std::vector<std::string> pending;
  for (const AfterJob& job : after) {
    if (!job.state) {
      return {AfterVerdict::kNever,
              absl::StrCat("job ", job.id,
                           " it was to start after (--after) no longer "
                           "exists")};
    }
    if (!IsTerminal(*job.state)) {
      pending.push_back(
          absl::StrCat("#", job.id, " (", JobStateName(*job.state), ")"));
      continue;
    }
    if (*job.state != v1::JOB_STATE_FINISHED) {
      return {AfterVerdict::kNever,
              absl::StrCat("job ", job.id, " it was to start after (--after) ",
                           JobStateName(*job.state),
                           job.reason.empty() ? "" : ": ", job.reason)};
    }
  }
  if (pending.empty()) return {AfterVerdict::kReady, ""};
  return {AfterVerdict::kWait,
          absl::StrCat("waiting for job", pending.size() == 1 ? " " : "s ",
                       absl::StrJoin(pending, ", "), " to finish (--after)")};
}

}  // namespace dlbatch::scheduler
