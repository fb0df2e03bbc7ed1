#include "scheduler/connection_gate.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace dlbatch::scheduler {

ConnectionGate::~ConnectionGate() {
  absl::MutexLock lock(&mu_);
  for (auto& [fd, p] : pending_) ::close(p.dup_fd);
}

bool ConnectionGate::Admit(int fd) {
  const int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return false;
  absl::MutexLock lock(&mu_);
  // An entry under this number is a closed connection's: gRPC closed it,
  // and the kernel gave its number to this one.
  if (pending_.contains(fd)) DropLocked(fd, /*shut=*/false);
  const uint64_t serial = next_serial_++;
  pending_[fd] = Pending{dup_fd, clock_->MonotonicMs(), serial};
  order_.emplace_back(fd, serial);
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
  int fd;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return;
  }
  absl::MutexLock lock(&mu_);
  if (pending_.contains(fd)) DropLocked(fd, /*shut=*/false);
}

int ConnectionGate::Sweep() {
  const int64_t now = clock_->MonotonicMs();
  absl::MutexLock lock(&mu_);
  int dropped = 0;
  while (!order_.empty()) {
    auto [fd, serial] = order_.front();
    auto it = pending_.find(fd);
    if (it == pending_.end() || it->second.serial != serial) {
      order_.pop_front();  // authenticated, or the number was reused
      continue;
    }
    if (now - it->second.admitted_ms < deadline_ms_) break;
    order_.pop_front();
    DropLocked(fd, /*shut=*/true);
    ++dropped;
  }
  return dropped;
}

void ConnectionGate::DropLocked(int fd, bool shut) {
  auto it = pending_.find(fd);
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

}  // namespace dlbatch::scheduler
