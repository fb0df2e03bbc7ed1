#include "scheduler/rpc/peer_table.h"

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace dlbatch::scheduler {

void PeerTable::SetUnix(int fd, PeerCred cred) {
  absl::MutexLock lock(&mu_);
  unix_[fd] = cred;
}

std::optional<PeerCred> PeerTable::UnixPeer(absl::string_view peer) const {
  int fd;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = unix_.find(fd);
  if (it == unix_.end()) return std::nullopt;
  return it->second;
}

}  // namespace dlbatch::scheduler
