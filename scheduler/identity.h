// Who is calling the scheduler. On a Unix socket the kernel says (the
// connection's SO_PEERCRED, kept by the acceptor in the PeerTable): the
// caller is that uid's user, and root and the scheduler's own user are
// admins; nothing the client sends changes that, so a shared cluster's
// socket may be world-connectable. Over TCP the caller must present the
// scheduler's token, and a holder of it is an admin.
#ifndef DLBATCH_SCHEDULER_IDENTITY_H_
#define DLBATCH_SCHEDULER_IDENTITY_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "scheduler/peer_table.h"

namespace dlbatch::scheduler {

struct Caller {
  // The user whose jobs the caller owns; empty for a token holder, who
  // names the user it submits for.
  std::string user;
  bool admin = false;
  bool from_kernel = false;  // identified by the kernel, not by a token
};

// The name of `uid` in the password database, or "uid<N>" when it has none.
std::string UserName(uid_t uid);

class Identities {
 public:
  // `peers` may be null (no Unix socket). `token` may be empty only where
  // no TCP listener exists.
  Identities(const PeerTable* peers, std::string token, uid_t scheduler_uid)
      : peers_(peers),
        token_(std::move(token)),
        scheduler_uid_(scheduler_uid) {}

  // UNAUTHENTICATED where a TCP caller has no valid token.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context) const;

 private:
  const PeerTable* const peers_;
  const std::string token_;
  const uid_t scheduler_uid_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_IDENTITY_H_
