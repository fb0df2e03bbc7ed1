// Who may do what with jobs: the rules the gRPC services (service.h) and
// the web face's REST API (scheduler/web/api.h) both apply, so that a
// caller is refused or shown the same through either. Pure functions of
// the caller and the job: the owner of a job is looked up only where the
// answer depends on it.
#ifndef DLBATCH_SCHEDULER_RPC_ACCESS_H_
#define DLBATCH_SCHEDULER_RPC_ACCESS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/rpc/identity.h"

namespace dlbatch::scheduler {

// PERMISSION_DENIED for a worker credential: it registers workers and
// moves their files, and may not submit, cancel or read jobs. OK for
// anyone else.
absl::Status RefuseWorker(const Caller& caller);

// PERMISSION_DENIED, saying that `what` ("purging jobs") is for admins,
// unless `caller` is one.
absl::Status RequireAdmin(const Caller& caller, absl::string_view what);

// Who submitted a job; NotFound for an unknown one.
using JobOwnerFn = absl::FunctionRef<absl::StatusOr<std::string>(int64_t)>;

// Whether `caller` may read job `job_id` (its diary, progress and outputs)
// or, with `control`, cancel, hold, release or requeue it: its owner and
// admins may; with `shared_visibility` everyone may read (never control).
// PERMISSION_DENIED names the owner; NotFound from `owner` for an unknown
// job (not looked up where the caller may anyway).
absl::Status MayAccessJob(const Caller& caller, int64_t job_id, bool control,
                          bool shared_visibility, JobOwnerFn owner);

// What `caller` may see of `job`: another user's env: is never shown
// (admins see it).
void RedactJob(const Caller& caller, v1::Job* job);

// For a request naming jobs to act on (cancel, hold, ...): `act` gets the
// request with only the jobs `may` allows (`may(id)` as MayAccessJob with
// control; unknown ones kept, for the scheduler to say so), and `reply`
// answers every job of the request in its order, a refusal for each of
// the others. Reply's results have job_id and error, as CancelJobsReply's
// and ControlJobsReply's do. An error of `act` is returned, `reply` then
// untouched.
template <typename Request, typename Reply, typename May, typename Act>
absl::Status ForControllableJobs(const Request& request, Reply* reply, May may,
                                 Act act) {
  Request allowed = request;
  allowed.clear_job_ids();
  std::map<int64_t, std::string> refused;
  for (int64_t id : request.job_ids()) {
    absl::Status ok = may(id);
    if (ok.ok() || absl::IsNotFound(ok)) {
      allowed.add_job_ids(id);
    } else {
      refused[id] = std::string(ok.message());
    }
  }
  absl::StatusOr<Reply> done = act(allowed);
  if (!done.ok()) return done.status();
  int next = 0;
  for (int64_t id : request.job_ids()) {
    if (auto it = refused.find(id); it != refused.end()) {
      auto* r = reply->add_results();
      r->set_job_id(id);
      r->set_error(it->second);
    } else if (next < done->results_size()) {
      *reply->add_results() = done->results(next++);
    }
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_ACCESS_H_
