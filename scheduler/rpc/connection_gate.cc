#include "scheduler/rpc/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"

namespace dlbatch::scheduler {

ConnectionGate::~ConnectionGate() {
  absl::MutexLock lock(&mu_);
  for (auto& [peer, p] : pending_) ::close(p.dup_fd);
}

bool ConnectionGate::Admit(int fd, const std::string& peer) {
  const int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return false;
  absl::MutexLock lock(&mu_);
  // Two live connections under one name: the client used one address and
  // port for two addresses of this machine. The older is shut, so that no
  // name hides a waiting connection from the gate.
  if (pending_.contains(peer)) DropLocked(peer, /*shut=*/true);
  const uint64_t serial = next_serial_++;
  pending_[peer] = Pending{dup_fd, clock_->MonotonicMs(), serial};
  order_.emplace_back(peer, serial);
  count_.store(static_cast<int>(pending_.size()), std::memory_order_relaxed);
  while (static_cast<int>(pending_.size()) > max_pending_ && !order_.empty()) {
    auto [oldest, s] = order_.front();
    order_.pop_front();
    auto it = pending_.find(oldest);
    if (it != pending_.end() && it->second.serial == s) {
      DropLocked(oldest, /*shut=*/true);
    }
  }
  return true;
}

void ConnectionGate::Authenticated(absl::string_view peer) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  const std::string name = PercentDecoded(peer);
  absl::MutexLock lock(&mu_);
  if (pending_.contains(name)) DropLocked(name, /*shut=*/false);
}

int ConnectionGate::Sweep() {
  const int64_t now = clock_->MonotonicMs();
  absl::MutexLock lock(&mu_);
  int dropped = 0;
  while (!order_.empty()) {
    const auto& [peer, serial] = order_.front();
    auto it = pending_.find(peer);
    if (it == pending_.end() || it->second.serial != serial) {
      order_.pop_front();  // authenticated, or the name was admitted again
      continue;
    }
    if (now - it->second.admitted_ms < deadline_ms_) break;
    const std::string name = peer;
    order_.pop_front();
    DropLocked(name, /*shut=*/true);
    ++dropped;
  }
  return dropped;
}

void ConnectionGate::DropLocked(const std::string& peer, bool shut) {
  mu_.AssertHeld();
  auto it = pending_.find(peer);
  if (it == pending_.end()) return;
  if (shut) {
    // Shuts the connection itself down, for gRPC's descriptor too: gRPC
    // then sees it end and lets it go.
    ::shutdown(it->second.dup_fd, SHUT_RDWR);
    shut_down_.fetch_add(1);
  }
  ::close(it->second.dup_fd);
  pending_.erase(it);
  count_.store(static_cast<int>(pending_.size()), std::memory_order_relaxed);
}

std::string TcpPeerName(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
    return "";
  }
  char text[INET6_ADDRSTRLEN];
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const struct sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return absl::StrCat("ipv4:", text, ":", ntohs(in->sin_port));
  }
  if (addr.ss_family != AF_INET6) return "";
  const auto* in6 = reinterpret_cast<const struct sockaddr_in6*>(&addr);
  if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
    struct in_addr v4;
    std::memcpy(&v4, in6->sin6_addr.s6_addr + 12, sizeof v4);
    ::inet_ntop(AF_INET, &v4, text, sizeof text);
    return absl::StrCat("ipv4:", text, ":", ntohs(in6->sin6_port));
  }
  ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
  const std::string scope =
      in6->sin6_scope_id != 0 ? absl::StrCat("%", in6->sin6_scope_id) : "";
  return absl::StrCat("ipv6:[", text, scope, "]:", ntohs(in6->sin6_port));
}

}  // namespace dlbatch::scheduler
