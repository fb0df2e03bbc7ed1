// Connections that have not authenticated yet, bounded in number and in
// time. Opening a TCP connection needs no token, so without a bound anyone
// who can reach the port holds descriptors and memory for as long as gRPC
// keeps an idle connection (minutes). The TCP acceptor admits each
// connection here before handing it to gRPC; the services report each call
// that presented valid credentials. A connection whose calls have not done
// so within the deadline is shut down, and past the limit the oldest such
// connection is shut down to make room, so a flood of silent connections
// costs the ones that authenticate nothing. A connection is admitted as soon
// as it is accepted, so one that never finishes its TLS handshake is bounded
// the same way.
#ifndef DLBATCH_SCHEDULER_RPC_CONNECTION_GATE_H_
#define DLBATCH_SCHEDULER_RPC_CONNECTION_GATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace dlbatch::scheduler {

class ConnectionGate {
 public:
  // `max_pending` connections may wait to authenticate at once, each for at
  // most `deadline_ms`. `clock` must outlive the gate.
  ConnectionGate(int max_pending, int64_t deadline_ms, const Clock* clock)
      : max_pending_(max_pending), deadline_ms_(deadline_ms), clock_(clock) {}
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Admits connected socket `fd`, about to be handed to gRPC, whose calls
  // will name `peer` (TcpPeerName) as theirs. Keeps a duplicate of it to shut
  // the connection down later. Another connection waiting under the same
  // name (the same client address and port, to another address of this
  // machine) is shut down: one name, one waiting connection. Returns false
  // when even the duplicate cannot be had: the caller closes the connection
  // instead.
  bool Admit(int fd, const std::string& peer);
  // A call on `peer` (grpc::ServerContext::peer(), percent-encoded or not:
  // PercentDecoded)
  // presented valid credentials: its connection is no longer watched. Cheap
  // when nothing is waiting; peers this gate never admitted (Unix sockets)
  // are ignored.
  void Authenticated(absl::string_view peer);
  // Shuts down the connections past their deadline; returns how many.
  int Sweep();

  int pending() const { return count_.load(std::memory_order_relaxed); }
  int64_t shut_down() const { return shut_down_.load(); }

 private:
  struct Pending {
    int dup_fd;
    int64_t admitted_ms;
    uint64_t serial;  // tells a reused name's entries apart
  };
  void DropLocked(const std::string& peer, bool shut)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_pending_;
  const int64_t deadline_ms_;
  const Clock* const clock_;
  absl::Mutex mu_;
  std::unordered_map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Admission order, oldest first: (peer, serial); entries whose peer has
  // since authenticated or been admitted again are skipped.
  std::deque<std::pair<std::string, uint64_t>> order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> count_{0};
  std::atomic<int64_t> shut_down_{0};
};

// The name gRPC gives the calls of TCP connection `fd` as their peer:
// "ipv4:127.0.0.1:40000", "ipv6:[::1]:40000" ("ipv6:[fe80::1%2]:40000" with
// a scope), an IPv4 client of an IPv6 socket as IPv4. Empty when the socket
// has no peer (it has closed already).
std::string TcpPeerName(int fd);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_CONNECTION_GATE_H_
