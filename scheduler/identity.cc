#include "scheduler/identity.h"

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

absl::StatusOr<Caller> Identities::Identify(
    const grpc::ServerContextBase& context) const {
  if (peers_ != nullptr) {
    if (std::optional<PeerCred> cred = peers_->UnixPeer(context.peer())) {
      Caller caller;
      caller.user = UserName(cred->uid);
      caller.admin = cred->uid == 0 || cred->uid == scheduler_uid_;
      caller.from_kernel = true;
      return caller;
    }
  }
  if (token_.empty()) {
    return absl::UnauthenticatedError(
        "the scheduler cannot tell who is calling: connect through its Unix "
        "socket or its TCP listener");
  }
  absl::Status auth = CheckToken(context, token_);
  if (!auth.ok()) return auth;
  Caller caller;
  caller.admin = true;
  return caller;
}

}  // namespace dlbatch::scheduler
