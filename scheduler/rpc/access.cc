#include "scheduler/rpc/access.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dlbatch::scheduler {

absl::Status RefuseWorker(const Caller& caller) {
  if (!caller.worker) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "permission denied: '", caller.user,
      "' is a worker credential; it registers workers and moves their "
      "files, and may not submit, cancel or read jobs (use a user's "
      "token)"));
}

absl::Status RequireAdmin(const Caller& caller, absl::string_view what) {
  if (caller.admin) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "permission denied: ", what,
      " is for admins (root or the scheduler's user on its socket, or a "
      "token made with `dlbatch admin user add NAME --admin`); ",
      caller.user, " is not one"));
}

absl::Status MayAccessJob(const Caller& caller, int64_t job_id, bool control,
                          bool shared_visibility, JobOwnerFn owner) {
  if (caller.admin || (shared_visibility && !control)) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string user, owner(job_id));
  if (user == caller.user) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("permission denied: job ", job_id, " belongs to ", user));
}

void RedactJob(const Caller& caller, v1::Job* job) {
  if (!caller.admin && job->user() != caller.user) {
    job->mutable_spec()->clear_env();
  }
}

}  // namespace dlbatch::scheduler
