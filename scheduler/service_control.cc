// Worker administration (drain, resume, remove: admins only) and job
// control (hold, release, requeue: the owner or an admin, as cancel).
// Issue 21.
#include <map>

#include "common/status.h"
#include "scheduler/service.h"

namespace dlbatch::scheduler {
namespace {

template <typename T>
grpc::Status ReplyWith(absl::StatusOr<T> result, T* reply) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *reply = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status SchedulerService::DrainWorker(
    grpc::ServerContext* context, const v1::DrainWorkerRequest* request,
    v1::WorkerInfo* reply) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "draining workers");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ReplyWith(
      scheduler_->DrainWorker(request->name(), true, request->reason()), reply);
}

grpc::Status SchedulerService::ResumeWorker(
    grpc::ServerContext* context, const v1::ResumeWorkerRequest* request,
    v1::WorkerInfo* reply) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "resuming workers");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ReplyWith(scheduler_->DrainWorker(request->name(), false, ""), reply);
}

grpc::Status SchedulerService::RemoveWorker(
    grpc::ServerContext* context, const v1::RemoveWorkerRequest* request,
    v1::RemoveWorkerReply* reply) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "removing workers");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ReplyWith(scheduler_->RemoveWorker(request->name()), reply);
}

grpc::Status SchedulerService::ControlJobs(
    grpc::ServerContext* context, const v1::ControlJobsRequest* request,
    v1::ControlJobsReply* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // As CancelJobs: each job the caller may not touch gets its refusal; the
  // others are done; results keep the request's order.
  v1::ControlJobsRequest allowed;
  allowed.set_action(request->action());
  std::map<int64_t, std::string> refused;
  for (int64_t id : request->job_ids()) {
    absl::Status may = MayAccess(*caller, id, /*control=*/true);
    if (may.ok() || absl::IsNotFound(may)) {
      allowed.add_job_ids(id);
    } else {
      refused[id] = std::string(may.message());
    }
  }
  absl::StatusOr<v1::ControlJobsReply> done = scheduler_->ControlJobs(allowed);
  if (!done.ok()) return ToGrpcStatus(done.status());
  int next = 0;
  for (int64_t id : request->job_ids()) {
    if (auto it = refused.find(id); it != refused.end()) {
      auto* r = reply->add_results();
      r->set_job_id(id);
      r->set_error(it->second);
    } else if (next < done->results_size()) {
      *reply->add_results() = done->results(next++);
    }
  }
  return grpc::Status::OK;
}

}  // namespace dlbatch::scheduler
