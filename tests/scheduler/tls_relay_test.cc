// The relay that ends the TCP listener's TLS: real loopback sockets, a real
// OpenSSL client trusting the scheduler's CA, a fake clock for the
// handshake deadline. Bytes pass both ways (more than any buffer holds),
// either side closing closes the other, and connections that never finish
// a handshake (silent, plaintext, not trusting the certificate) are closed
// without ever reaching the plaintext side.
#include "scheduler/tls_relay.h"

#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "gtest/gtest.h"
#include "scheduler/tls_certs.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::scheduler {
namespace {

bool WaitUntil(const std::function<bool()>& done, int timeout_ms) {
  auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// True once the peer of `fd` has closed it (EOF or reset); what it sent
// meanwhile is appended to `got`.
bool PeerClosed(int fd, std::string* got = nullptr) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (got != nullptr) got->append(buf, static_cast<size_t>(n));
      continue;
    }
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

class TlsRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tls-relay-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    auto files = LoadOrCreateTls(dir_, {"localhost", "127.0.0.1"});
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *files;
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(listen_fd_, 64), 0);
    socklen_t len = sizeof addr_;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr_), &len);
  }
  void TearDown() override {
    if (relay_) relay_->Stop();
    absl::MutexLock lock(&mu_);
    for (int fd : ready_) ::close(fd);
    ::close(listen_fd_);
    std::filesystem::remove_all(dir_);
  }

  void StartRelay(int max_handshakes, int64_t deadline_ms) {
    TlsRelay::Options options;
    options.threads = 2;
    options.max_handshakes = max_handshakes;
    options.handshake_deadline_ms = deadline_ms;
    auto relay = TlsRelay::Start(files_, options, &clock_, [this](int fd) {
      absl::MutexLock lock(&mu_);
      ready_.push_back(fd);
    });
    ASSERT_TRUE(relay.ok()) << relay.status();
    relay_ = std::move(*relay);
  }

  // A client socket whose accepted end the relay took.
  int Connect() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(
        ::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), sizeof addr_),
        0);
    int accepted =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    EXPECT_GE(accepted, 0);
    relay_->Add(accepted);
    return fd;
  }

  // The plaintext ends handed on so far.
  std::vector<int> Ready() {
    absl::MutexLock lock(&mu_);
    return ready_;
  }

  // A TLS client on `fd` trusting `ca_pem`, handshake done (or not: null).
  SSL* Handshake(int fd, const std::string& ca_pem) {
    ctx_.reset(SSL_CTX_new(TLS_client_method()));
    BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
    X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx_.get()), ca);
    X509_free(ca);
    SSL_CTX_set_verify(ctx_.get(), SSL_VERIFY_PEER, nullptr);
    static const unsigned char kH2[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx_.get(), kH2, sizeof kH2);
    SSL* ssl = SSL_new(ctx_.get());
    SSL_set_fd(ssl, fd);
    X509_VERIFY_PARAM_set1_host(SSL_get0_param(ssl), "localhost", 0);
    if (SSL_connect(ssl) != 1) {
      ERR_clear_error();
      SSL_free(ssl);
      return nullptr;
    }
    return ssl;
  }

  std::string dir_;
  TlsFiles files_;
  FakeClock clock_;
  int listen_fd_ = -1;
  struct sockaddr_in addr_ = {};
  std::unique_ptr<TlsRelay> relay_;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx_{nullptr, SSL_CTX_free};
  absl::Mutex mu_;
  std::vector<int> ready_ ABSL_GUARDED_BY(mu_);
};

TEST_F(TlsRelayTest, BytesPassBothWaysAndEitherSideClosingClosesTheOther) {
  StartRelay(16, 10000);
  const std::string ca = ReadFile(files_.ca_file).value();
  int client = Connect();
  SSL* ssl = Handshake(client, ca);
  ASSERT_NE(ssl, nullptr);
  const unsigned char* alpn = nullptr;
  unsigned int alpn_len = 0;
  SSL_get0_alpn_selected(ssl, &alpn, &alpn_len);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(alpn), alpn_len), "h2");
  ASSERT_TRUE(WaitUntil([&] { return Ready().size() == 1; }, 5000));
  const int plain = Ready()[0];

  // 4 MiB each way at once: more than socket and TLS buffers hold.
  const std::string up(4 << 20, 'u');
  const std::string down(4 << 20, 'd');
  std::string got_plain, got_tls;
  std::thread plain_side([&] {
    size_t sent = 0;
    char buf[65536];
    while (got_plain.size() < up.size() || sent < down.size()) {
      struct pollfd p = {
          plain,
          static_cast<short>(POLLIN | (sent < down.size() ? POLLOUT : 0)), 0};
      ::poll(&p, 1, 1000);
      if (p.revents & POLLOUT) {
        ssize_t n = ::send(plain, down.data() + sent,
                           std::min<size_t>(down.size() - sent, 65536),
                           MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) sent += static_cast<size_t>(n);
      }
      if (p.revents & POLLIN) {
        ssize_t n = ::recv(plain, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) got_plain.append(buf, static_cast<size_t>(n));
        if (n == 0) break;
      }
    }
  });
  // The client writes from one thread and reads from this one, each only
  // while the other does not hold the SSL: in turns.
  size_t sent = 0;
  char buf[65536];
  SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE);
  while (got_tls.size() < down.size() || sent < up.size()) {
    struct pollfd p = {
        client, static_cast<short>(POLLIN | (sent < up.size() ? POLLOUT : 0)),
        0};
    if (SSL_pending(ssl) == 0) ::poll(&p, 1, 1000);
    if (sent < up.size() && (p.revents & POLLOUT)) {
      int n = SSL_write(
          ssl, up.data() + sent,
          static_cast<int>(std::min<size_t>(up.size() - sent, 16384)));
      ASSERT_GT(n, 0);
      sent += static_cast<size_t>(n);
    }
    if (SSL_pending(ssl) > 0 || (p.revents & POLLIN)) {
      int n = SSL_read(ssl, buf, sizeof buf);
      ASSERT_GT(n, 0);
      got_tls.append(buf, static_cast<size_t>(n));
    }
  }
  plain_side.join();
  EXPECT_EQ(got_plain, up);
  EXPECT_EQ(got_tls, down);

  // The plaintext end shut down (as the ConnectionGate does): the client's
  // connection ends.
  ::shutdown(plain, SHUT_RDWR);
  EXPECT_TRUE(WaitUntil([&] { return PeerClosed(client); }, 5000));
  SSL_free(ssl);
  ::close(client);

  // The client closing ends the plaintext end.
  int client2 = Connect();
  SSL* ssl2 = Handshake(client2, ca);
  ASSERT_NE(ssl2, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return Ready().size() == 2; }, 5000));
  const int plain2 = Ready()[1];
  SSL_free(ssl2);
  ::close(client2);
  EXPECT_TRUE(WaitUntil([&] { return PeerClosed(plain2); }, 5000));
  EXPECT_EQ(relay_->failed_handshakes(), 0);
}

TEST_F(TlsRelayTest, SilentHandshakesAreBoundedAndClosedAtTheirDeadline) {
  StartRelay(/*max_handshakes=*/4, /*deadline_ms=*/2000);
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) {
    silent.push_back(Connect());
    // In this order; the two loops each keep their newest two.
    ASSERT_TRUE(WaitUntil([&] { return relay_->handshaking() > 0; }, 1000));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto closed = [&] {
    int n = 0;
    for (int fd : silent) n += PeerClosed(fd);
    return n;
  };
  EXPECT_TRUE(WaitUntil([&] { return closed() == 6; }, 3000)) << closed();
  EXPECT_TRUE(PeerClosed(silent.front())) << "the oldest made room";
  EXPECT_FALSE(PeerClosed(silent.back())) << "the newest waits";
  EXPECT_EQ(relay_->handshaking(), 4);
  clock_.Advance(2001);
  EXPECT_TRUE(WaitUntil([&] { return closed() == 10; }, 3000)) << closed();
  EXPECT_EQ(relay_->handshaking(), 0);
  EXPECT_EQ(relay_->failed_handshakes(), 10);
  EXPECT_TRUE(Ready().empty());
  for (int fd : silent) ::close(fd);
}

TEST_F(TlsRelayTest, PlaintextAndAnUntrustingClientGetNothingThrough) {
  StartRelay(16, 10000);
  // gRPC's plaintext preface: no HTTP/2 answer, the connection closes.
  int plaintext = Connect();
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  ASSERT_EQ(::send(plaintext, preface.data(), preface.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(preface.size()));
  std::string got;
  EXPECT_TRUE(WaitUntil([&] { return PeerClosed(plaintext, &got); }, 5000));
  // At most a TLS alert record (type 21), never an HTTP/2 frame.
  EXPECT_TRUE(got.empty() || got[0] == 21) << got.size() << " bytes";
  ::close(plaintext);

  // A client that trusts another CA refuses the handshake.
  char tmpl[] = "/tmp/tls-other-XXXXXX";
  const std::string other = ::mkdtemp(tmpl);
  ASSERT_TRUE(LoadOrCreateTls(other, {"localhost"}).ok());
  int untrusting = Connect();
  EXPECT_EQ(Handshake(untrusting, ReadFile(other + "/ca.pem").value()),
            nullptr);
  std::filesystem::remove_all(other);
  ::close(untrusting);
  EXPECT_TRUE(
      WaitUntil([&] { return relay_->failed_handshakes() == 2; }, 5000));
  EXPECT_EQ(relay_->handshaking(), 0);
  EXPECT_TRUE(Ready().empty());
}

}  // namespace
}  // namespace dlbatch::scheduler
