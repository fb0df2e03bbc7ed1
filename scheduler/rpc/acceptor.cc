#include "scheduler/rpc/acceptor.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/log_format.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

// TLS handshakes gRPC gave up on (it says so in a log line per connection,
// which a scan of the port would turn into a flood): counted, and said in
// one warning every ten seconds at most.
std::atomic<int64_t> g_failed_handshakes{0};

void NoteHandshakeFailures(gpr_log_func_args* args) {
  if (args->message != nullptr &&
      absl::StartsWith(args->message, "Handshake failed")) {
    g_failed_handshakes.fetch_add(1);
    return;
  }
  LogGrpcLine(args);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Acceptor>> Acceptor::ListenTcp(
    const std::string& host, int port, ConnectionGate* gate,
    const TlsFiles& tls, grpc::ServerBuilder* builder) {
  auto cert = ReadFile(tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(tls.key_file);
  if (!key.ok()) return key.status();
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                         &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot listen on ", host, ":", port, ": ", ::gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (struct addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                  a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", last_error));
  }
  struct sockaddr_storage bound;
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<struct sockaddr*>(&bound), &len);
  int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
  auto acceptor =
      std::unique_ptr<Acceptor>(new Acceptor(fd, bound_port, gate, nullptr));
  // gRPC's TLS (TLS 1.2 or 1.3, HTTP/2 by ALPN), no client certificate:
  // callers authenticate with their tokens.
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  acceptor->tls_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      grpc::SslServerCredentials(options));
  gpr_set_log_function(NoteHandshakeFailures);
  return acceptor;
}

absl::StatusOr<std::unique_ptr<Acceptor>> Acceptor::ListenUnix(
    const std::string& path, mode_t mode, PeerTable* peers) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path '", path, "' must be 1 to ", sizeof(addr.sun_path) - 1,
        " bytes long; choose a shorter --listen unix:PATH"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd =
      ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("socket for ", path, ": ", std::strerror(errno)));
  }
  ::unlink(path.c_str());
  // Created with no access for anyone (the process umask is 077), then
  // given its mode: never wider than that, even for a moment.
  if (::bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      ::chmod(path.c_str(), mode) != 0 || ::listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", std::strerror(err)));
  }
  struct stat bound;
  if (::lstat(path.c_str(), &bound) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", std::strerror(err)));
  }
  std::unique_ptr<Acceptor> acceptor(new Acceptor(fd, 0, nullptr, peers));
  acceptor->socket_path_ = path;
  acceptor->socket_dev_ = bound.st_dev;
  acceptor->socket_ino_ = bound.st_ino;
  return acceptor;
}

void Acceptor::RemoveSocketFile() {
  if (socket_path_.empty()) return;
  struct stat now;
  if (::lstat(socket_path_.c_str(), &now) == 0 && S_ISSOCK(now.st_mode) &&
      now.st_dev == socket_dev_ && now.st_ino == socket_ino_) {
    ::unlink(socket_path_.c_str());
  }
  socket_path_.clear();
}

Acceptor::Acceptor(int fd, int port, ConnectionGate* gate, PeerTable* peers)
    : listen_fd_(fd),
      gate_(gate),
      peers_(peers),
      port_(port),
      spare_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

Acceptor::~Acceptor() {
  Stop();
  ::close(listen_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

void Acceptor::Start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Loop(); });
}

void Acceptor::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void Acceptor::Loop() {
  int backoff_ms = 0;
  auto last_warning = std::chrono::steady_clock::time_point();
  auto last_shed_note = std::chrono::steady_clock::time_point();
  int64_t shed_noted = 0;
  int64_t failed_noted = 0;
  auto last_tls_note = std::chrono::steady_clock::time_point();
  while (!stopping_) {
    struct pollfd p = {listen_fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, backoff_ms > 0 ? backoff_ms : 200);
    if (gate_ != nullptr) gate_->Sweep();
    if (auto now = std::chrono::steady_clock::now();
        gate_ != nullptr && gate_->shut_down() > shed_noted &&
        now - last_shed_note > std::chrono::seconds(10)) {
      spdlog::warn(
          "closed {} TCP connections that did not finish a TLS handshake and "
          "authenticate within --auth-deadline, or were the oldest of more "
          "than --max-unauthenticated waiting",
          gate_->shut_down() - shed_noted);
      shed_noted = gate_->shut_down();
      last_shed_note = now;
    }
    if (auto now = std::chrono::steady_clock::now();
        gate_ != nullptr && g_failed_handshakes.load() > failed_noted &&
        now - last_tls_note > std::chrono::seconds(10)) {
      spdlog::warn(
          "closed {} TCP connections whose TLS handshake failed (plaintext, "
          "or a client that does not trust this scheduler's certificate)",
          g_failed_handshakes.load() - failed_noted);
      failed_noted = g_failed_handshakes.load();
      last_tls_note = now;
    }
    if (ready <= 0) continue;
    for (;;) {
      int fd =
          ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        Take(fd);
        backoff_ms = 0;
        continue;
      }
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // Shed what waits, with the one descriptor the spare frees, so
        // callers hear at once instead of waiting in the queue.
        if (spare_fd_ >= 0) {
          ::close(spare_fd_);
          spare_fd_ = -1;
        }
        for (;;) {
          int shed = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (shed < 0) break;
          ::close(shed);
        }
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        backoff_ms = std::clamp(backoff_ms * 2, 10, 1000);
        auto now = std::chrono::steady_clock::now();
        if (now - last_warning > std::chrono::seconds(10)) {
          last_warning = now;
          spdlog::warn(
              "accepting connections: {}; shedding new ones until "
              "descriptors are free",
              std::strerror(err));
        }
        break;
      }
      spdlog::warn("accepting connections: {}; retrying", std::strerror(err));
      backoff_ms = std::clamp(backoff_ms * 2, 10, 1000);
      break;
    }
  }
}

void Acceptor::Take(int fd) {
  if (gate_ == nullptr) {
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      ::close(fd);  // who called is not known: nothing is served
      return;
    }
    peers_->SetUnix(fd, PeerCred{cred.uid, cred.gid, cred.pid});
    grpc::AddInsecureChannelFromFd(server_, fd);
    return;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const std::string peer = TcpPeerName(fd);
  if (peer.empty() || !gate_->Admit(fd, peer)) {
    ::close(fd);  // gone already, or out of descriptors: shed it
    return;
  }
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
  p.listener_fd = listen_fd_;
  p.fd = fd;  // gRPC's from here on
  tls_->HandleNewConnection(&p);
}

}  // namespace dlbatch::scheduler
