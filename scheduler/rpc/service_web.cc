// CreateWebLogin: the caller, as the scheduler knows it here, gets a
// one-time URL into the web face (dlbatch web).
#include "common/status.h"
#include "scheduler/rpc/service.h"

namespace dlbatch::scheduler {

grpc::Status SchedulerService::CreateWebLogin(grpc::ServerContext* context,
                                              const v1::CreateWebLoginRequest*,
                                              v1::CreateWebLoginReply* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!web_login_) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        "the scheduler serves no web face; start it with --web-listen "
        "127.0.0.1:8443 (or web_listen: in scheduler.yaml)"));
  }
  absl::StatusOr<v1::CreateWebLoginReply> made = web_login_(*caller);
  if (!made.ok()) return ToGrpcStatus(made.status());
  *reply = *std::move(made);
  return grpc::Status::OK;
}

}  // namespace dlbatch::scheduler
