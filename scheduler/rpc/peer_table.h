// Who is at the other end of each connection the scheduler's acceptors
// handed to gRPC. gRPC names a call's peer "fd:N" for such a connection, N
// being the descriptor the acceptor accepted; for a Unix socket the kernel
// said at accept who connected (SO_PEERCRED), which no client can fake.
#ifndef DLBATCH_SCHEDULER_RPC_PEER_TABLE_H_
#define DLBATCH_SCHEDULER_RPC_PEER_TABLE_H_

#include <sys/types.h>

#include <optional>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::scheduler {

struct PeerCred {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

class PeerTable {
 public:
  // A Unix-socket connection was accepted as `fd`, from `cred`.
  void SetUnix(int fd, PeerCred cred);
  // The kernel's word on the caller of a call from `peer`
  // (grpc::ServerContext::peer()); nullopt for anything but a Unix-socket
  // connection this table was told of.
  std::optional<PeerCred> UnixPeer(absl::string_view peer) const;

 private:
  mutable absl::Mutex mu_;
  std::unordered_map<int, PeerCred> unix_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_PEER_TABLE_H_
