// Per-user limits and fair-share usage: `dlbatch admin limit` and `dlbatch
// admin usage`. Admins only: a user's limits are the cluster's policy, and
// the usage of every user is not each user's to read.
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/rpc/service.h"

namespace dlbatch::scheduler {
namespace {

absl::Status RequireAdmin(const absl::StatusOr<Caller>& caller,
                          const char* what) {
  if (!caller.ok()) return caller.status();
  if (caller->admin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("permission denied: ", what,
                   " is for admins (root or the scheduler's user); ",
                   caller->user, " is not one"));
}

// The wire's 0 (no limit) and the core's kNoLimit.
int FromWire(int32_t n) { return n > 0 ? n : kNoLimit; }
int32_t ToWire(int n) { return n > 0 ? n : 0; }

v1::UserLimitEntry ToEntry(const std::string& user, const std::string& profile,
                           const UserLimit& limit) {
  v1::UserLimitEntry e;
  e.set_user(user);
  e.set_profile(profile);
  e.set_max_slots(ToWire(limit.max_slots));
  e.set_max_queued(ToWire(limit.max_queued));
  return e;
}

}  // namespace

grpc::Status SchedulerService::SetUserLimit(
    grpc::ServerContext* context, const v1::SetUserLimitRequest* request,
    v1::UserLimitEntry* reply) {
  if (absl::Status may = RequireAdmin(Identify(*context), "setting limits");
      !may.ok()) {
    return ToGrpcStatus(may);
  }
  if (request->user().empty() || request->profile().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "a limit names a user and a profile: dlbatch admin limit set USER "
        "--profile P --slots N --queued M"));
  }
  if ((request->has_max_slots() && request->max_slots() < 0) ||
      (request->has_max_queued() && request->max_queued() < 0)) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("a limit is 1 or more, or 0 to remove it"));
  }
  UserLimit limit;
  if (!request->clear()) {
    // Fields not given keep their value.
    for (const LimitEntry& e : scheduler_->users().UserLimits()) {
      if (e.user == request->user() && e.profile == request->profile()) {
        limit = e.limit;
      }
    }
    if (request->has_max_slots())
      limit.max_slots = FromWire(request->max_slots());
    if (request->has_max_queued())
      limit.max_queued = FromWire(request->max_queued());
  }
  absl::Status s = scheduler_->users().SetUserLimit(request->user(),
                                                    request->profile(), limit);
  if (!s.ok()) return ToGrpcStatus(s);
  *reply = ToEntry(request->user(), request->profile(), limit);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListUserLimits(
    grpc::ServerContext* context, const v1::ListUserLimitsRequest* /*request*/,
    v1::ListUserLimitsReply* reply) {
  if (absl::Status may = RequireAdmin(Identify(*context), "listing limits");
      !may.ok()) {
    return ToGrpcStatus(may);
  }
  for (const LimitEntry& e : scheduler_->users().UserLimits()) {
    *reply->add_limits() = ToEntry(e.user, e.profile, e.limit);
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerService::GetUsage(grpc::ServerContext* context,
                                        const v1::GetUsageRequest* /*request*/,
                                        v1::GetUsageReply* reply) {
  if (absl::Status may = RequireAdmin(Identify(*context), "reading usage");
      !may.ok()) {
    return ToGrpcStatus(may);
  }
  int64_t now = 0;
  for (const UserUsage& u : scheduler_->users().Usage(&now)) {
    v1::UserUsageEntry* e = reply->add_users();
    e->set_user(u.user);
    e->set_slot_seconds(u.slot_seconds);
    e->set_share(u.share);
    e->set_running_slots(u.running_slots);
  }
  reply->set_half_life_ms(scheduler_->options().fair_share_half_life_ms);
  reply->set_time_ms(now);
  return grpc::Status::OK;
}

}  // namespace dlbatch::scheduler
