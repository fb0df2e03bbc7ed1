#include "scheduler/tls_relay.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tls_client.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

constexpr size_t kChunk = 16384;
constexpr uint64_t kWakeId = 0;

struct FreeCtx {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using CtxPtr = std::shared_ptr<SSL_CTX>;

// gRPC clients insist on HTTP/2 by ALPN.
int SelectAlpn(SSL*, const unsigned char** out, unsigned char* outlen,
               const unsigned char* in, unsigned int inlen, void*) {
  static const unsigned char kH2[] = {2, 'h', '2'};
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, kH2, sizeof kH2, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

absl::StatusOr<CtxPtr> MakeContext(const TlsFiles& files) {
  CtxPtr ctx(SSL_CTX_new(TLS_server_method()), FreeCtx());
  if (!ctx) return absl::InternalError("SSL_CTX_new: " + OpenSslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // Buffers stay with their connection (about 34 KiB each): releasing them
  // when idle would allocate them again for every call.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE |
                                  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  // One read takes what the socket holds, records and all, instead of a
  // read for each record's header and another for its body.
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), files.cert_file.c_str()) !=
          1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), files.key_file.c_str(),
                                  SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use TLS certificate ", files.cert_file,
                     " with key ", files.key_file, ": ", OpenSslErrors()));
  }
  SSL_CTX_set_alpn_select_cb(ctx.get(), SelectAlpn, nullptr);
  return ctx;
}

}  // namespace

// One thread and its epoll, relaying the connections given to it.
class RelayLoop {
 public:
  RelayLoop(CtxPtr ctx, int max_handshakes, int64_t deadline_ms,
            const Clock* clock, TlsRelay::ReadyFn ready)
      : ctx_(std::move(ctx)),
        max_handshakes_(max_handshakes),
        deadline_ms_(deadline_ms),
        clock_(clock),
        ready_(std::move(ready)),
        epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeId;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    thread_ = std::thread([this] { Run(); });
  }
  ~RelayLoop() {
    Stop();
    ::close(epoll_fd_);
    ::close(wake_fd_);
  }

  void Add(int fd) {
    {
      absl::MutexLock lock(&mu_);
      incoming_.push_back(fd);
    }
    Wake();
  }
  void Stop() {
    stopping_ = true;
    Wake();
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    for (int fd : incoming_) ::close(fd);
    incoming_.clear();
  }
  int64_t failed() const { return failed_.load(); }
  int handshaking() const { return handshaking_.load(); }

 private:
  struct Conn {
    uint64_t id = 0;
    int tcp = -1;
    int plain = -1;  // -1 while handshaking
    SSL* ssl = nullptr;
    int64_t accepted_ms = 0;
    std::string up;  // from the client, for the plaintext end
    size_t up_off = 0;
    std::string down;  // from the plaintext end, for the client
    size_t down_off = 0;
    bool tls_eof = false;
    bool plain_eof = false;
    uint32_t tcp_events = 0;
    uint32_t plain_events = 0;
  };

  void Wake() {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }

  void Run() {
    struct epoll_event events[64];
    while (!stopping_) {
      const int n = ::epoll_wait(epoll_fd_, events, 64, 200);
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[i].data.u64;
        if (tag == kWakeId) {
          uint64_t count;
          (void)!::read(wake_fd_, &count, sizeof count);
          TakeIncoming();
          continue;
        }
        // The tag is the connection's id and which of its descriptors.
        const uint64_t id = tag >> 1;
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;  // closed earlier in this batch
        Conn* c = it->second.get();
        const bool plain_side = (tag & 1) != 0;
        const bool progress = Pump(c, !plain_side, plain_side);
        // A hung-up descriptor that moved nothing would be reported again
        // and again: the connection is over.
        if (conns_.contains(id) && !progress &&
            (events[i].events & (EPOLLHUP | EPOLLERR)) != 0) {
          Close(c);
        }
      }
      Sweep();
    }
    for (auto& [id, c] : conns_) {
      ::close(c->tcp);
      if (c->plain >= 0) ::close(c->plain);
      SSL_free(c->ssl);
    }
    conns_.clear();
    handshaking_ = 0;
  }

  void TakeIncoming() {
    std::vector<int> fds;
    {
      absl::MutexLock lock(&mu_);
      fds.swap(incoming_);
    }
    for (int fd : fds) {
      auto c = std::make_unique<Conn>();
      c->id = next_id_++;
      c->tcp = fd;
      c->accepted_ms = clock_->MonotonicMs();
      c->ssl = SSL_new(ctx_.get());
      if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
        ERR_clear_error();
        SSL_free(c->ssl);
        ::close(fd);
        failed_.fetch_add(1);
        continue;
      }
      SSL_set_accept_state(c->ssl);
      Conn* raw = c.get();
      conns_.emplace(raw->id, std::move(c));
      order_.push_back(raw->id);
      handshaking_.fetch_add(1);
      struct epoll_event ev = {};
      ev.events = EPOLLIN;
      ev.data.u64 = raw->id << 1;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      raw->tcp_events = EPOLLIN;
      Pump(raw, true, false);
    }
    // Past the limit the oldest handshakes go.
    while (handshaking_.load() > max_handshakes_ && !order_.empty()) {
      auto it = conns_.find(order_.front());
      order_.pop_front();
      if (it != conns_.end() && it->second->plain < 0) {
        failed_.fetch_add(1);
        Close(it->second.get());
      }
    }
  }

  // Handshakes past their deadline are closed.
  void Sweep() {
    const int64_t now = clock_->MonotonicMs();
    while (!order_.empty()) {
      auto it = conns_.find(order_.front());
      if (it == conns_.end() || it->second->plain >= 0) {
        order_.pop_front();
        continue;
      }
      if (now - it->second->accepted_ms < deadline_ms_) break;
      order_.pop_front();
      failed_.fetch_add(1);
      Close(it->second.get());
    }
  }

  void Watch(int fd, uint32_t* current, uint32_t want, uint64_t tag) {
    if (*current == want) return;
    struct epoll_event ev = {};
    ev.events = want;
    ev.data.u64 = tag;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
    *current = want;
  }

  // Moves what can be moved; true if anything happened. May close `c`.
  // `tcp_ready` / `plain_ready`: that descriptor was reported ready, so a
  // read from it is worth a try; after a short read it is taken as drained
  // until epoll (level-triggered) reports it again, which spares a read
  // that would only say EAGAIN.
  bool Pump(Conn* c, bool tcp_ready, bool plain_ready) {
    if (c->plain < 0) return Handshake(c);
    bool any = false;
    for (;;) {
      uint32_t tcp_want = 0;
      uint32_t plain_want = 0;
      bool progress = false;
      // Client to plaintext end.
      if (c->up_off < c->up.size()) {
        ssize_t n = ::send(c->plain, c->up.data() + c->up_off,
                           c->up.size() - c->up_off, MSG_NOSIGNAL);
        if (n > 0) {
          c->up_off += static_cast<size_t>(n);
          progress = true;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          plain_want |= EPOLLOUT;
        } else if (errno != EINTR) {
          Close(c);
          return true;
        }
      }
      if (c->up_off == c->up.size() && !c->tls_eof && !tcp_ready &&
          SSL_has_pending(c->ssl) == 0) {
        tcp_want |= EPOLLIN;
      } else if (c->up_off == c->up.size() && !c->tls_eof) {
        c->up.clear();
        c->up_off = 0;
        char buf[kChunk];
        const int n = SSL_read(c->ssl, buf, sizeof buf);
        if (n > 0) {
          c->up.assign(buf, static_cast<size_t>(n));
          progress = true;
          // Read-ahead holds what the socket had: nothing pending, so
          // nothing more until epoll says so.
          if (SSL_has_pending(c->ssl) == 0) tcp_ready = false;
        } else {
          switch (SSL_get_error(c->ssl, n)) {
            case SSL_ERROR_WANT_READ:
              tcp_want |= EPOLLIN;
              break;
            case SSL_ERROR_WANT_WRITE:
              tcp_want |= EPOLLOUT;
              break;
            default:  // closed, reset or broken
              ERR_clear_error();
              c->tls_eof = true;
              progress = true;
          }
        }
      }
      // Plaintext end to client.
      if (c->down_off < c->down.size()) {
        const int n = SSL_write(c->ssl, c->down.data() + c->down_off,
                                static_cast<int>(c->down.size() - c->down_off));
        if (n > 0) {
          c->down_off += static_cast<size_t>(n);
          progress = true;
        } else {
          switch (SSL_get_error(c->ssl, n)) {
            case SSL_ERROR_WANT_READ:
              tcp_want |= EPOLLIN;
              break;
            case SSL_ERROR_WANT_WRITE:
              tcp_want |= EPOLLOUT;
              break;
            default:
              ERR_clear_error();
              Close(c);
              return true;
          }
        }
      }
      if (c->down_off == c->down.size() && !c->plain_eof && !plain_ready) {
        plain_want |= EPOLLIN;
      } else if (c->down_off == c->down.size() && !c->plain_eof) {
        c->down.clear();
        c->down_off = 0;
        char buf[kChunk];
        ssize_t n = ::recv(c->plain, buf, sizeof buf, 0);
        if (n > 0) {
          c->down.assign(buf, static_cast<size_t>(n));
          progress = true;
          if (static_cast<size_t>(n) < sizeof buf) plain_ready = false;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          plain_want |= EPOLLIN;
        } else if (n == 0 || errno != EINTR) {
          c->plain_eof = true;
          progress = true;
        }
      }
      // Either side over, and what it sent passed on: both close.
      if ((c->tls_eof && c->up_off == c->up.size()) ||
          (c->plain_eof && c->down_off == c->down.size())) {
        if (!c->tls_eof) SSL_shutdown(c->ssl);  // close_notify, best effort
        Close(c);
        return true;
      }
      any = any || progress;
      if (!progress) {
        Watch(c->tcp, &c->tcp_events, tcp_want, c->id << 1);
        Watch(c->plain, &c->plain_events, plain_want, (c->id << 1) | 1);
        return any;
      }
    }
  }

  bool Handshake(Conn* c) {
    const int r = SSL_accept(c->ssl);
    if (r != 1) {
      switch (SSL_get_error(c->ssl, r)) {
        case SSL_ERROR_WANT_READ:
          Watch(c->tcp, &c->tcp_events, EPOLLIN, c->id << 1);
          return false;
        case SSL_ERROR_WANT_WRITE:
          Watch(c->tcp, &c->tcp_events, EPOLLOUT, c->id << 1);
          return false;
        default:  // not TLS, not trusted, or gone
          ERR_clear_error();
          failed_.fetch_add(1);
          Close(c);
          return true;
      }
    }
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
                     pair) != 0) {
      // Out of descriptors: shed this one, as the acceptor sheds.
      const int64_t now = clock_->MonotonicMs();
      if (now - last_warning_ms_ >= 10000) {
        last_warning_ms_ = now;
        spdlog::warn(
            "TLS connections: socketpair: {}; closing them until descriptors "
            "are free",
            std::strerror(errno));
      }
      failed_.fetch_add(1);
      Close(c);
      return true;
    }
    handshaking_.fetch_sub(1);
    c->plain = pair[0];
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u64 = (c->id << 1) | 1;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->plain, &ev);
    c->plain_events = EPOLLIN;
    ready_(pair[1]);
    // The client may have sent its first bytes with its last handshake
    // message.
    Pump(c, true, false);
    return true;
  }

  void Close(Conn* c) {
    if (c->plain < 0) handshaking_.fetch_sub(1);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->tcp, nullptr);
    ::close(c->tcp);
    if (c->plain >= 0) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->plain, nullptr);
      ::close(c->plain);
    }
    SSL_free(c->ssl);
    conns_.erase(c->id);
  }

  const CtxPtr ctx_;
  const int max_handshakes_;
  const int64_t deadline_ms_;
  const Clock* const clock_;
  const TlsRelay::ReadyFn ready_;
  const int epoll_fd_;
  const int wake_fd_;
  absl::Mutex mu_;
  std::vector<int> incoming_ ABSL_GUARDED_BY(mu_);
  // Only the loop's thread touches these.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::deque<uint64_t> order_;  // handshakes, oldest first (ids)
  uint64_t next_id_ = kWakeId + 1;
  int64_t last_warning_ms_ = INT64_MIN / 2;
  std::atomic<int> handshaking_{0};
  std::atomic<int64_t> failed_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<TlsRelay>> TlsRelay::Start(
    const TlsFiles& files, const Options& options, const Clock* clock,
    ReadyFn ready) {
  auto ctx = MakeContext(files);
  if (!ctx.ok()) return ctx.status();
  const int threads = std::max(1, options.threads);
  std::vector<std::unique_ptr<RelayLoop>> loops;
  for (int i = 0; i < threads; ++i) {
    loops.push_back(std::make_unique<RelayLoop>(
        *ctx, std::max(1, (options.max_handshakes + threads - 1) / threads),
        options.handshake_deadline_ms, clock, ready));
  }
  return std::unique_ptr<TlsRelay>(new TlsRelay(std::move(loops)));
}

TlsRelay::TlsRelay(std::vector<std::unique_ptr<RelayLoop>> loops)
    : loops_(std::move(loops)) {}

TlsRelay::~TlsRelay() { Stop(); }

void TlsRelay::Add(int fd) {
  if (stopped_) {
    ::close(fd);
    return;
  }
  loops_[next_.fetch_add(1) % loops_.size()]->Add(fd);
}

void TlsRelay::Stop() {
  if (stopped_.exchange(true)) return;
  for (auto& loop : loops_) loop->Stop();
}

int64_t TlsRelay::failed_handshakes() const {
  int64_t n = 0;
  for (const auto& loop : loops_) n += loop->failed();
  return n;
}

int TlsRelay::handshaking() const {
  int n = 0;
  for (const auto& loop : loops_) n += loop->handshaking();
  return n;
}

}  // namespace dlbatch::scheduler
