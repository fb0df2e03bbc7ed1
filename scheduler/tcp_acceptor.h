// The scheduler's TCP listener, kept by the scheduler instead of gRPC:
// gRPC 1.51's own listener stops accepting for good once accept() fails
// with EMFILE (a burst of idle connections), even after they close. This
// one accepts on a thread of its own and hands each connection to the
// gRPC server; when descriptors run out it sheds the waiting connection
// (accepted with a spare descriptor and closed) and backs off, so it keeps
// accepting once descriptors are free again. Each connection is admitted to
// a ConnectionGate first, which closes those that do not authenticate.
#ifndef DLBATCH_SCHEDULER_TCP_ACCEPTOR_H_
#define DLBATCH_SCHEDULER_TCP_ACCEPTOR_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "scheduler/connection_gate.h"

namespace dlbatch::scheduler {

class TcpAcceptor {
 public:
  // Binds and listens on host:port (port 0: any free port). `gate` (not
  // null) must outlive the acceptor.
  static absl::StatusOr<std::unique_ptr<TcpAcceptor>> Listen(
      const std::string& host, int port, ConnectionGate* gate);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  int port() const { return port_; }
  // Hands every accepted connection to `server` (which must outlive Stop)
  // until Stop.
  void Start(grpc::Server* server);
  void Stop();

 private:
  TcpAcceptor(int fd, int port, ConnectionGate* gate);
  void Loop();

  const int listen_fd_;
  ConnectionGate* const gate_;
  const int port_;
  int spare_fd_;  // given up to shed a connection when descriptors run out
  grpc::Server* server_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_TCP_ACCEPTOR_H_
