// Worker administration (drain, resume, remove: admins only) and job
// control (hold, release, requeue: the owner or an admin, as cancel).
#include <map>

#include "common/status.h"
#include "scheduler/rpc/service.h"

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
  return ReplyWith(scheduler_->control().DrainWorker(request->name(), true,
                                                     request->reason()),
                   reply);
}

grpc::Status SchedulerService::ResumeWorker(
    grpc::ServerContext* context, const v1::ResumeWorkerRequest* request,
    v1::WorkerInfo* reply) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "resuming workers");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ReplyWith(
      scheduler_->control().DrainWorker(request->name(), false, ""), reply);
}

grpc::Status SchedulerService::RemoveWorker(
    grpc::ServerContext* context, const v1::RemoveWorkerRequest* request,
    v1::RemoveWorkerReply* reply) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "removing workers");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ReplyWith(scheduler_->control().RemoveWorker(request->name()), reply);
}

grpc::Status SchedulerService::ControlJobs(
    grpc::ServerContext* context, const v1::ControlJobsRequest* request,
    v1::ControlJobsReply* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ForControllableJobs(
      *caller, *request, reply, [&](const v1::ControlJobsRequest& allowed) {
        return scheduler_->control().ControlJobs(allowed);
      });
}

}  // namespace dlbatch::scheduler
