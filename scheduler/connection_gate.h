// Connections that have not authenticated yet, bounded in number and in
// time. Opening a TCP connection needs no token, so without a bound anyone
// who can reach the port holds descriptors and memory for as long as gRPC
// keeps an idle connection (minutes). The TCP acceptor admits each
// connection here before handing it to gRPC; the services report each call
// that presented valid credentials. A connection whose calls have not done
// so within the deadline is shut down, and past the limit the oldest such
// connection is shut down to make room, so a flood of silent connections
// costs the ones that authenticate nothing.
#ifndef DLBATCH_SCHEDULER_CONNECTION_GATE_H_
#define DLBATCH_SCHEDULER_CONNECTION_GATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
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

  // Admits connected socket `fd`, about to be handed to gRPC (which then
  // names it "fd:<fd>" as the call's peer). Keeps a duplicate of it to shut
  // the connection down later. Returns false when even that descriptor
  // cannot be had: the caller closes the connection instead.
  bool Admit(int fd);
  // A call on `peer` (grpc::ServerContext::peer()) presented valid
  // credentials: its connection is no longer watched. Cheap when nothing is
  // waiting; peers this gate never admitted (Unix sockets) are ignored.
  void Authenticated(absl::string_view peer);
  // Shuts down the connections past their deadline; returns how many.
  int Sweep();

  int pending() const { return count_.load(std::memory_order_relaxed); }
  int64_t shut_down() const { return shut_down_.load(); }

 private:
  struct Pending {
    int dup_fd;
    int64_t admitted_ms;
    uint64_t serial;  // tells a reused descriptor number's entries apart
  };
  void DropLocked(int fd, bool shut) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_pending_;
  const int64_t deadline_ms_;
  const Clock* const clock_;
  absl::Mutex mu_;
  std::unordered_map<int, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Admission order, oldest first: (fd, serial); entries whose fd has since
  // authenticated or been admitted again are skipped.
  std::deque<std::pair<int, uint64_t>> order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> count_{0};
  std::atomic<int64_t> shut_down_{0};
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CONNECTION_GATE_H_
