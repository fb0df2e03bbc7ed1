// The scheduler's listeners, TCP and Unix socket, kept by the scheduler
// instead of gRPC: gRPC 1.51's own listener stops accepting for good once
// accept() fails with EMFILE (a burst of idle connections), even after they
// close, and it does not say who connected to a Unix socket. This one
// accepts on a thread of its own and hands each connection to the gRPC
// server; when descriptors run out it sheds the waiting connection
// (accepted with a spare descriptor and closed) and backs off, so it keeps
// accepting once descriptors are free again. A TCP connection is admitted
// to a ConnectionGate first, which closes those that do not finish their
// TLS handshake and authenticate in time; a Unix-socket connection's caller
// (SO_PEERCRED) goes into the PeerTable. TCP is always TLS: a TCP connection
// goes to gRPC through an external-connection acceptor registered with the
// server's TLS credentials, so gRPC does the handshake and the records on
// its own threads, with no hop in between. Its calls are named by the
// client's address ("ipv4:..."), never "fd:N": who called over TCP is known
// from the token alone.
#ifndef DLBATCH_SCHEDULER_RPC_ACCEPTOR_H_
#define DLBATCH_SCHEDULER_RPC_ACCEPTOR_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "scheduler/rpc/connection_gate.h"
#include "scheduler/rpc/peer_table.h"
#include "scheduler/rpc/tls_certs.h"

namespace dlbatch::scheduler {

class Acceptor {
 public:
  // Binds and listens on host:port (port 0: any free port), serving TLS
  // with the certificate and key of `tls` through `builder`, the server's
  // builder before it is built. `gate` (not null) must outlive the acceptor.
  static absl::StatusOr<std::unique_ptr<Acceptor>> ListenTcp(
      const std::string& host, int port, ConnectionGate* gate,
      const TlsFiles& tls, grpc::ServerBuilder* builder);
  // Binds and listens on the Unix socket `path` (replacing a stale one),
  // which gets `mode`; it is never wider than that, even for a moment.
  static absl::StatusOr<std::unique_ptr<Acceptor>> ListenUnix(
      const std::string& path, mode_t mode, PeerTable* peers);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  int port() const { return port_; }  // TCP
  // Hands every accepted connection to `server` (which must outlive Stop)
  // until Stop.
  void Start(grpc::Server* server);
  void Stop();
  // A Unix socket's: removes its file, on a clean shutdown, if the path
  // still names the socket bound here (the same device and inode), never
  // one that another scheduler has bound there since. TCP: does nothing.
  void RemoveSocketFile();

 private:
  Acceptor(int fd, int port, ConnectionGate* gate, PeerTable* peers);
  void Loop();
  // Hands an accepted connection on to gRPC, or closes it.
  void Take(int fd);

  const int listen_fd_;
  ConnectionGate* const gate_;  // null: a Unix socket
  PeerTable* const peers_;      // null: TCP
  const int port_;
  int spare_fd_;  // given up to shed a connection when descriptors run out
  // TCP: gRPC's end of it, doing TLS.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tls_;
  grpc::Server* server_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  // A Unix socket: its path and its file's identity once bound.
  std::string socket_path_;
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_ACCEPTOR_H_
