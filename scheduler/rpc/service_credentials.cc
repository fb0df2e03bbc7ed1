// AddCredential, ListCredentials, RevokeCredential: admins only. The store
// is written first, then the table the identities read, so a revoke that
// has returned is in force for every later call; the revoked credential's
// open streams are ended before the reply.
#include <sys/time.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/rpc/service.h"

namespace dlbatch::scheduler {
namespace {

int64_t WallMs() {
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  return int64_t{tv.tv_sec} * 1000 + tv.tv_usec / 1000;
}

const char* Kind(bool worker) { return worker ? "worker credential" : "user"; }

}  // namespace

grpc::Status SchedulerService::AddCredential(
    grpc::ServerContext* context, const v1::AddCredentialRequest* request,
    v1::AddCredentialReply* reply) {
  absl::StatusOr<Caller> caller =
      IdentifyAdmin(*context, "adding users and worker credentials");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = CheckCredentialName(request->name()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (request->worker() && request->admin()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "a worker credential cannot be an admin: it may only register "
        "workers"));
  }
  absl::MutexLock lock(&admin_mu_);
  absl::StatusOr<std::vector<CredentialRecord>> existing =
      scheduler_->users().Credentials();
  if (!existing.ok()) return ToGrpcStatus(existing.status());
  for (const CredentialRecord& r : *existing) {
    if (r.name == request->name() && r.worker == request->worker()) {
      return ToGrpcStatus(absl::AlreadyExistsError(absl::StrCat(
          Kind(r.worker), " ", r.name,
          " already has a token; to issue a new one, revoke it first (dlbatch "
          "admin ",
          r.worker ? absl::StrCat("worker-token ", r.name, " --revoke")
                   : absl::StrCat("user revoke ", r.name),
          ")")));
    }
  }
  absl::StatusOr<std::string> token = NewToken(request->worker());
  if (!token.ok()) return ToGrpcStatus(token.status());
  CredentialRecord record;
  record.name = request->name();
  record.worker = request->worker();
  record.admin = request->admin();
  record.token_sha256 = TokenSha256(*token);
  record.created_ms = WallMs();
  if (absl::Status s = scheduler_->users().PutCredential(record); !s.ok()) {
    return ToGrpcStatus(s);
  }
  credentials_->Put(record);
  auto* c = reply->mutable_credential();
  c->set_name(record.name);
  c->set_worker(record.worker);
  c->set_admin(record.admin);
  c->set_created_ms(record.created_ms);
  reply->set_token(*token);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListCredentials(
    grpc::ServerContext* context, const v1::ListCredentialsRequest*,
    v1::ListCredentialsReply* reply) {
  absl::StatusOr<Caller> caller =
      IdentifyAdmin(*context, "listing users and worker credentials");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<std::vector<CredentialRecord>> all =
      scheduler_->users().Credentials();
  if (!all.ok()) return ToGrpcStatus(all.status());
  for (const CredentialRecord& r : *all) {
    auto* c = reply->add_credentials();
    c->set_name(r.name);
    c->set_worker(r.worker);
    c->set_admin(r.admin);
    c->set_created_ms(r.created_ms);
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerService::RevokeCredential(
    grpc::ServerContext* context, const v1::RevokeCredentialRequest* request,
    v1::RevokeCredentialReply* reply) {
  absl::StatusOr<Caller> caller =
      IdentifyAdmin(*context, "revoking users and worker credentials");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::MutexLock lock(&admin_mu_);
  absl::StatusOr<bool> deleted =
      scheduler_->users().DeleteCredential(request->name(), request->worker());
  if (!deleted.ok()) return ToGrpcStatus(deleted.status());
  if (!*deleted) {
    return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "no ", Kind(request->worker()), " named '", request->name(),
        "' holds a token (dlbatch admin user list shows those "
        "that do)")));
  }
  credentials_->Remove(request->name(), request->worker());
  CredentialRecord gone;
  gone.name = request->name();
  gone.worker = request->worker();
  reply->set_streams_closed(open_calls_->EndAll(gone.Key()));
  return grpc::Status::OK;
}

}  // namespace dlbatch::scheduler
