#include "scheduler/rpc/identity.h"

#include <pwd.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"

namespace dlbatch::scheduler {

std::string UserName(uid_t uid) {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 &&
      found != nullptr && found->pw_name != nullptr) {
    return found->pw_name;
  }
  return absl::StrCat("uid", uid);
}

Caller CallerFromCredential(const CredentialRecord& record) {
  Caller caller;
  caller.user = record.name;
  caller.admin = record.admin && !record.worker;
  // A one-job credential is a worker's, and less (slurm_registration.h).
  caller.worker = record.worker || record.job_id != 0;
  caller.credential = record.Key();
  return caller;
}

absl::StatusOr<Caller> Identities::Identify(
    const grpc::ServerContextBase& context) const {
  if (peers_ != nullptr) {
    if (std::optional<PeerCred> cred = peers_->UnixPeer(context.peer())) {
      Caller caller;
      caller.user = UserName(cred->uid);
      caller.admin = cred->uid == 0 || cred->uid == scheduler_uid_;
      caller.from_kernel = true;
      caller.credential = absl::StrCat("unix:", cred->uid);
      return caller;
    }
  }
  std::string token = PresentedToken(context);
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "no token presented; pass --token-file FILE or set DLBATCH_TOKEN "
        "(an admin makes one with `dlbatch admin user add NAME`; the "
        "scheduler's first admin token is in its STATE_DIR/token)");
  }
  std::optional<CredentialRecord> found = credentials_->FindByToken(token);
  if (!found) {
    return absl::UnauthenticatedError(
        "the token presented is not valid (revoked, or never issued); ask an "
        "admin for one (`dlbatch admin user add NAME`)");
  }
  return CallerFromCredential(*found);
}

}  // namespace dlbatch::scheduler
