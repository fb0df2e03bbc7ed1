// Who is calling the scheduler. On a Unix socket the kernel says (the
// connection's SO_PEERCRED, kept by the acceptor in the PeerTable): the
// caller is that uid's user, and root and the scheduler's own user are
// admins; nothing the client sends changes that, so a shared cluster's
// socket may be world-connectable. Over TCP the caller presents a token
// from the CredentialTable: a user's (acting as that user; an admin's may
// name the user it submits for) or a worker credential's.
#ifndef DLBATCH_SCHEDULER_RPC_IDENTITY_H_
#define DLBATCH_SCHEDULER_RPC_IDENTITY_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/rpc/peer_table.h"

namespace dlbatch::scheduler {

struct Caller {
  // The user whose jobs the caller owns (a worker credential's name for a
  // worker).
  std::string user;
  bool admin = false;
  bool from_kernel = false;  // identified by the kernel, not by a token
  // A worker credential: may register workers and move their blobs only.
  bool worker = false;
  // What the caller's calls are open under, for revocation and for a
  // worker name's owner: "unix:UID", "user:NAME" or "worker:NAME".
  std::string credential;
};

// The name of `uid` in the password database, or "uid<N>" when it has none.
std::string UserName(uid_t uid);

// The caller that presents the token of `record`: its user (an admin's may
// act as any user), or a worker for a worker or one-job credential. What
// both the gRPC services and the web face's logins see.
Caller CallerFromCredential(const CredentialRecord& record);

class Identities {
 public:
  // `peers` may be null (no Unix socket). `credentials` (not null) may be
  // empty only where no TCP listener exists.
  Identities(const PeerTable* peers, const CredentialTable* credentials,
             uid_t scheduler_uid)
      : peers_(peers),
        credentials_(credentials),
        scheduler_uid_(scheduler_uid) {}

  // UNAUTHENTICATED where a TCP caller has no valid token.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context) const;

 private:
  const PeerTable* const peers_;
  const CredentialTable* const credentials_;
  const uid_t scheduler_uid_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_IDENTITY_H_
