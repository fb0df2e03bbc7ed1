// TLS for the scheduler's TCP listener. gRPC 1.51 takes an accepted
// descriptor (grpc_server_add_channel_from_fd) only with insecure
// credentials, so the scheduler ends TLS itself: each accepted TCP
// connection does its handshake here (non-blocking, bounded in time and
// in number, the oldest shed first), then plaintext is copied between it
// and one end of a socketpair whose other end is handed on (to gRPC). Either
// side ending ends the other: the client closing, or the other end being
// closed or shut down (as the ConnectionGate does), closes both. A handful
// of threads, each with an epoll of its own, do the copying; no call blocks.
#ifndef DLBATCH_SCHEDULER_TLS_RELAY_H_
#define DLBATCH_SCHEDULER_TLS_RELAY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "scheduler/tls_certs.h"

namespace dlbatch::scheduler {

class RelayLoop;

class TlsRelay {
 public:
  struct Options {
    int threads = 2;
    // Handshakes under way at once; past it the oldest is closed.
    int max_handshakes = 256;
    // A connection whose handshake has not finished this long after it
    // was accepted is closed.
    int64_t handshake_deadline_ms = 10000;
  };
  // Called on a relay thread with the plaintext end of each connection
  // whose handshake finished; it owns that descriptor from then on.
  using ReadyFn = std::function<void(int fd)>;

  // Loads the certificate and key in `files`; `clock` must outlive the
  // relay. Starts its threads.
  static absl::StatusOr<std::unique_ptr<TlsRelay>> Start(const TlsFiles& files,
                                                         const Options& options,
                                                         const Clock* clock,
                                                         ReadyFn ready);
  ~TlsRelay();  // Stop()
  TlsRelay(const TlsRelay&) = delete;
  TlsRelay& operator=(const TlsRelay&) = delete;

  // Takes accepted non-blocking TCP socket `fd` (owned from here on).
  void Add(int fd);
  // Closes every connection and joins the threads.
  void Stop();

  // Connections closed before their handshake finished: failed (plaintext,
  // a client that does not trust the certificate), past the deadline, or
  // shed to stay under max_handshakes.
  int64_t failed_handshakes() const;
  int handshaking() const;

 private:
  explicit TlsRelay(std::vector<std::unique_ptr<RelayLoop>> loops);
  std::vector<std::unique_ptr<RelayLoop>> loops_;
  std::atomic<uint64_t> next_{0};
  std::atomic<bool> stopped_{false};
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_TLS_RELAY_H_
