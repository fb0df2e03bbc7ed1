// TCP is always TLS, tried on the real binaries: plaintext to the TCP port
// gets nothing, a client or worker trusting another CA fails at once naming
// the CA file it used, a worker over TLS runs a job, the certificate names
// the addresses asked for (--tls-name) and a restart keeps the CA, and an
// operator's own certificate is used instead of the scheduler's CA.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

int Port(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

std::string Token(const Cluster& c) { return c.scheduler_state() + "/token"; }

// Starts worker w1 with the cluster's token; true once `workers` says it is
// online.
bool StartTokenWorker(Cluster& c) {
  c.StartWorker("w1", 1, "local", {"--token-file", Token(c)});
  return WaitFor(
      [&] {
        return c.Cli({"--token-file", Token(c), "workers"})
                   .out.find("online") != std::string::npos;
      },
      15000);
}

// Submits a job of `yaml` with the cluster's token and follows its diary to
// the end; `id` is left empty if the submit failed (the result is the
// submit's then).
Result SubmitAndFollow(Cluster& c, const std::string& yaml, std::string* id) {
  Result submitted = c.Cli(
      {"--token-file", Token(c), "submit", "-q", c.JobFile("j.yaml", yaml)});
  id->clear();
  if (submitted.code != 0) return submitted;
  *id = submitted.out.substr(0, submitted.out.find_first_not_of("0123456789"));
  return c.Cli({"--token-file", Token(c), "diary", "-f", *id});
}

// The CLI with the cluster's token and the environment given.
Result CliWith(const std::string& address, const std::vector<std::string>& args,
               std::map<std::string, std::string> env, int timeout_ms = 60000) {
  std::vector<std::string> argv = {BinDir() + "/dlbatch", "--scheduler",
                                   address};
  argv.insert(argv.end(), args.begin(), args.end());
  return Exec(argv, env, timeout_ms);
}

TEST(Tls, PlaintextToTheTcpPortGetsNothing) {
  Cluster c;
  c.StartScheduler({}, "127.0.0.1:0");
  // The same scheduler answers over TLS.
  Result tls = c.Cli({"--token-file", Token(c), "profiles"});
  ASSERT_EQ(tls.code, 0) << tls.err << c.Logs();

  // A plaintext gRPC client, with the right token, is not served.
  auto channel =
      grpc::CreateChannel(c.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Scheduler::NewStub(channel);
  grpc::ClientContext ctx;
  AddToken(&ctx, ReadAll(Token(c)).substr(0, 64));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::Stats stats;
  grpc::Status status = stub->GetStats(&ctx, v1::GetStatsRequest(), &stats);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();

  // Raw: HTTP/2's preface and an empty SETTINGS frame get no HTTP/2 back,
  // at most a TLS alert, and the connection closes.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(Port(c.address())));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string preface =
      std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
      std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  ASSERT_EQ(send(fd, preface.data(), preface.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(preface.size()));
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, n);
  EXPECT_TRUE(n == 0 || errno == ECONNRESET) << strerror(errno);
  EXPECT_TRUE(got.empty() || got[0] == 21)
      << got.size() << " bytes came back, not a TLS alert";
  close(fd);
  EXPECT_NE(ReadAll(c.dir() + "/scheduler.log").find("TLS handshake"),
            std::string::npos)
      << ReadAll(c.dir() + "/scheduler.log");
}

// A TLS connection to 127.0.0.1:port that trusts `ca_file` and has done its
// handshake, but sends nothing; null if the handshake failed.
struct SilentTls {
  int fd = -1;
  SSL* ssl = nullptr;
  ~SilentTls() {
    SSL_free(ssl);
    if (fd >= 0) close(fd);
  }
  // True once the scheduler has closed it (what it sent before is read).
  bool Closed() {
    char buf[4096];
    for (;;) {
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n > 0) continue;
      int err = SSL_get_error(ssl, n);
      ERR_clear_error();
      return err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE;
    }
  }
};

std::unique_ptr<SilentTls> OpenSilentTls(SSL_CTX* ctx, int port) {
  auto c = std::make_unique<SilentTls>();
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(c->fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return nullptr;
  }
  c->ssl = SSL_new(ctx);
  SSL_set_fd(c->ssl, c->fd);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), "127.0.0.1");
  if (SSL_connect(c->ssl) != 1) {
    ERR_clear_error();
    return nullptr;
  }
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  return c;
}

// Past the handshake a connection is still one that has not
// authenticated: the ConnectionGate bounds such connections in number (the
// oldest goes) and in time, whoever does the handshake.
TEST(Tls, SilentConnectionsPastTheHandshakeAreBoundedByTheGate) {
  Cluster c;
  c.StartScheduler({"--max-unauthenticated", "5", "--auth-deadline", "2s"},
                   "127.0.0.1:0");
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(
      SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  const std::string ca = ReadAll(c.ca_file());
  BIO* bio = BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  ASSERT_NE(cert, nullptr);
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), cert);
  X509_free(cert);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  static const unsigned char kH2[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kH2, sizeof kH2);

  std::vector<std::unique_ptr<SilentTls>> silent;
  for (int i = 0; i < 12; ++i) {
    auto conn = OpenSilentTls(ctx.get(), Port(c.address()));
    ASSERT_NE(conn, nullptr) << "handshake " << i;
    silent.push_back(std::move(conn));
    usleep(20000);  // reach the gate in this order
  }
  auto closed = [&] {
    int n = 0;
    for (auto& s : silent) n += s->Closed();
    return n;
  };
  EXPECT_TRUE(WaitFor([&] { return closed() >= 7; }, 1500)) << closed();
  EXPECT_TRUE(silent.front()->Closed()) << "the oldest makes room";
  EXPECT_FALSE(silent.back()->Closed()) << "the newest waits its deadline";
  // One that authenticates is served meanwhile.
  Result served = c.Cli({"--token-file", Token(c), "profiles"});
  EXPECT_EQ(served.code, 0) << served.err;
  EXPECT_TRUE(WaitFor([&] { return closed() == 12; }, 5000)) << closed();
}

TEST(Tls, AWrongCaFailsAtOnceNamingTheCaFile) {
  Cluster c;
  c.StartScheduler({}, "127.0.0.1:0");
  Cluster other;  // another scheduler: its CA is the wrong one
  other.StartScheduler({}, "127.0.0.1:0");
  const std::string wrong = other.ca_file();
  const std::string token = ReadAll(Token(c)).substr(0, 64);

  const auto start = std::chrono::steady_clock::now();
  Result r = CliWith(c.address(), {"jobs"},
                     {{"DLBATCH_TOKEN", token}, {"DLBATCH_CA", wrong}});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("CA file " + wrong), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--ca-file"), std::string::npos) << r.err;
  // The CLI's message alone, without gRPC's own log line before it.
  EXPECT_EQ(r.err.find("Handshake failed"), std::string::npos) << r.err;
  // Not taken for an outage and retried for --retry-for (30 s).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // --ca-file wins over DLBATCH_CA.
  Result flag =
      CliWith(c.address(), {"--ca-file", wrong, "jobs"},
              {{"DLBATCH_TOKEN", token}, {"DLBATCH_CA", c.ca_file()}});
  EXPECT_NE(flag.code, 0);
  EXPECT_NE(flag.err.find(wrong), std::string::npos) << flag.err;
  Result right =
      CliWith(c.address(), {"jobs"},
              {{"DLBATCH_TOKEN", token}, {"DLBATCH_CA", c.ca_file()}});
  EXPECT_EQ(right.code, 0) << right.err;

  // With no --ca-file or DLBATCH_CA, the state folder's ca.pem beside the
  // token file is the one.
  Result beside = CliWith(c.address(), {"--token-file", Token(c), "jobs"}, {});
  EXPECT_EQ(beside.code, 0) << beside.err;

  // No CA at all, and a file that is none: each says what to pass.
  Result none = CliWith(c.address(), {"jobs"}, {{"DLBATCH_TOKEN", token}});
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.err.find("speaks TLS: pass --ca-file"), std::string::npos)
      << none.err;
  Result not_pem = CliWith(c.address(), {"--ca-file", Token(c), "jobs"},
                           {{"DLBATCH_TOKEN", token}});
  EXPECT_NE(not_pem.code, 0);
  EXPECT_NE(not_pem.err.find("holds no PEM certificate"), std::string::npos)
      << not_pem.err;

  // A worker trusting the wrong CA stops at start and names it.
  Result worker =
      Exec({BinDir() + "/dlbatch-worker", "--scheduler", c.address(),
            "--work-dir", c.dir() + "/w", "--cpu-slots", "1", "--token-file",
            Token(c), "--ca-file", wrong},
           {}, 20000);
  EXPECT_NE(worker.code, 0);
  EXPECT_NE(worker.err.find("CA file " + wrong), std::string::npos)
      << worker.err;
}

TEST(Tls, AWorkerOverTlsRunsAJob) {
  Cluster c;
  c.StartScheduler({}, "127.0.0.1:0");
  // The harness passes --ca-file STATE_DIR/ca.pem.
  ASSERT_TRUE(StartTokenWorker(c)) << c.Logs();
  std::string id;
  Result followed =
      SubmitAndFollow(c, "command: [sh, -c, 'echo over-tls $((6*7))']\n", &id);
  ASSERT_FALSE(id.empty()) << followed.err;
  EXPECT_EQ(followed.code, 0) << followed.err << c.Logs();
  EXPECT_NE(followed.out.find("over-tls 42"), std::string::npos)
      << followed.out;
  Result shown = c.Cli({"--token-file", Token(c), "show", "--json", id});
  EXPECT_NE(shown.out.find("\"state\": \"finished\""), std::string::npos)
      << shown.out;
}

// gRPC names an IPv6 client's calls "ipv6:%5B::1%5D:PORT": the gate knows
// the connection by it, so a worker's stream that authenticated is never
// shut at the deadline, while a silent connection is.
TEST(Tls, AnIpv6ConnectionThatAuthenticatedOutlivesTheDeadline) {
  Cluster c;
  c.StartScheduler({"--auth-deadline", "1s"}, "[::1]:0");
  int silent = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<uint16_t>(Port(c.address())));
  addr.sin6_addr = in6addr_loopback;
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0)
      << strerror(errno);
  ASSERT_TRUE(StartTokenWorker(c)) << c.Logs();
  usleep(3000000);  // three deadlines
  struct timeval tv = {5, 0};
  setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[64];
  EXPECT_EQ(recv(silent, buf, sizeof buf, 0), 0) << "the silent one is shut";
  close(silent);
  std::string id;
  Result followed =
      SubmitAndFollow(c, "command: [sh, -c, 'echo over-ipv6']\n", &id);
  ASSERT_FALSE(id.empty()) << followed.err;
  EXPECT_EQ(followed.code, 0) << followed.err << c.Logs();
  EXPECT_NE(followed.out.find("over-ipv6"), std::string::npos) << followed.out;
  // The worker's stream, open all along, is still the first one.
  EXPECT_EQ(ReadAll(c.dir() + "/worker-w1.log").find("reconnect"),
            std::string::npos)
      << ReadAll(c.dir() + "/worker-w1.log");
}

// A worker checks the CA at start and at every failed reconnect: a
// scheduler that comes back with another CA (its keys lost, say) is named
// in the worker's log as untrusted, not as unreachable, while the worker
// keeps trying.
TEST(Tls, AWorkerNamesTheCaWhenARestartedSchedulerIsNoLongerTrusted) {
  Cluster c;
  c.StartScheduler({}, "127.0.0.1:0");
  ASSERT_TRUE(StartTokenWorker(c)) << c.Logs();
  c.KillScheduler(SIGKILL);
  for (const char* f : {"ca.pem", "ca.key", "server.pem", "server.key"}) {
    ASSERT_EQ(unlink((c.scheduler_state() + "/" + f).c_str()), 0) << f;
  }
  c.StartScheduler();  // same address; a new CA
  const std::string log = c.dir() + "/worker-w1.log";
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadAll(log).find("does not vouch for") != std::string::npos;
      },
      20000))
      << ReadAll(log);
  EXPECT_NE(ReadAll(log).find("CA file " + c.ca_file()), std::string::npos)
      << ReadAll(log);
}

TEST(Tls, TheCertificateNamesTheTlsNamesAndARestartKeepsTheCa) {
  Cluster c;
  // On every address: the certificate names this machine's, not 127.0.0.2.
  c.StartScheduler({}, "0.0.0.0:0");
  const std::string port = std::to_string(Port(c.address()));
  const std::string token = ReadAll(Token(c)).substr(0, 64);
  const std::map<std::string, std::string> env = {{"DLBATCH_TOKEN", token},
                                                  {"DLBATCH_CA", c.ca_file()}};
  EXPECT_EQ(CliWith("127.0.0.1:" + port, {"jobs"}, env).code, 0);
  EXPECT_EQ(CliWith("localhost:" + port, {"jobs"}, env).code, 0);
  Result unnamed = CliWith("127.0.0.2:" + port, {"jobs"}, env);
  EXPECT_NE(unnamed.code, 0);
  EXPECT_NE(unnamed.err.find("does not name 127.0.0.2"), std::string::npos)
      << unnamed.err;
  EXPECT_NE(unnamed.err.find("--tls-name 127.0.0.2"), std::string::npos)
      << unnamed.err;

  const std::string ca = ReadAll(c.ca_file());
  const std::string server = ReadAll(c.scheduler_state() + "/server.pem");
  // A restart as before reuses both.
  c.KillScheduler(SIGTERM);
  c.StartScheduler({}, "0.0.0.0:" + port);
  EXPECT_EQ(ReadAll(c.ca_file()), ca);
  EXPECT_EQ(ReadAll(c.scheduler_state() + "/server.pem"), server);
  // A restart with --tls-name: a new server certificate by the same CA.
  c.KillScheduler(SIGTERM);
  c.StartScheduler({"--tls-name", "127.0.0.2"}, "0.0.0.0:" + port);
  EXPECT_EQ(ReadAll(c.ca_file()), ca);
  EXPECT_NE(ReadAll(c.scheduler_state() + "/server.pem"), server);
  Result named = CliWith("127.0.0.2:" + port, {"jobs"}, env);
  EXPECT_EQ(named.code, 0) << named.err;

  // A --tls-name that is no name is refused.
  Result bad = Exec(
      {BinDir() + "/dlbatch-scheduler", "--state-dir", c.dir() + "/other-state",
       "--listen", "127.0.0.1:0", "--tls-name", "not a name"},
      {}, 20000);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--tls-name 'not a name'"), std::string::npos)
      << bad.err;
}

TEST(Tls, AnOperatorsCertificateIsUsedInsteadOfTheOwnCa) {
  if (access("/usr/bin/openssl", X_OK) != 0) {
    GTEST_SKIP() << "making an operator's CA needs /usr/bin/openssl";
  }
  Cluster c;
  const std::string d = c.dir();
  WriteAll(d + "/ext.cnf", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  const std::string script =
      "set -e; cd " + d +
      "; openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
      "-nodes -keyout opca.key -out opca.pem -days 2 -subj /CN=op-ca; "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
      "-keyout op.key -out op.csr -subj /CN=localhost; "
      "openssl x509 -req -in op.csr -CA opca.pem -CAkey opca.key "
      "-CAcreateserial -out op.pem -days 2 -extfile ext.cnf";
  Result made = Exec({"/bin/sh", "-c", script});
  ASSERT_EQ(made.code, 0) << made.err;

  // A key that is not the certificate's is refused at start.
  Result mismatched =
      Exec({BinDir() + "/dlbatch-scheduler", "--state-dir", d + "/bad-state",
            "--listen", "127.0.0.1:0", "--tls-cert", d + "/op.pem", "--tls-key",
            d + "/opca.key"},
           {}, 20000);
  EXPECT_NE(mismatched.code, 0);
  EXPECT_NE(mismatched.err.find("is not the key of --tls-cert"),
            std::string::npos)
      << mismatched.err;

  c.StartScheduler({"--tls-cert", d + "/op.pem", "--tls-key", d + "/op.key"},
                   "127.0.0.1:0");
  EXPECT_NE(access(c.ca_file().c_str(), F_OK), 0) << "no CA of its own is made";
  const std::string token = ReadAll(Token(c)).substr(0, 64);
  Result ok =
      CliWith(c.address(), {"profiles"},
              {{"DLBATCH_TOKEN", token}, {"DLBATCH_CA", d + "/opca.pem"}});
  EXPECT_EQ(ok.code, 0) << ok.err << c.Logs();
  // Another scheduler's own CA does not vouch for the operator's certificate.
  Cluster other;
  other.StartScheduler({}, "127.0.0.1:0");
  Result wrong =
      CliWith(c.address(), {"profiles"},
              {{"DLBATCH_TOKEN", token}, {"DLBATCH_CA", other.ca_file()}});
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.err.find(other.ca_file()), std::string::npos) << wrong.err;
}

}  // namespace
}  // namespace dlbatch::testing
