#include "common/tls_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace dlbatch {

std::string OpenSslErrors() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}
namespace {

// How the CA was chosen, for messages.
std::string CaLabel(const ChannelConfig& config) {
  return config.ca_file.empty() ? std::string("(no CA file)") : config.ca_file;
}

// Adds every PEM certificate in `pem` to `store`; how many.
int AddCerts(X509_STORE* store, const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  int n = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (store == nullptr || X509_STORE_add_cert(store, cert) == 1) ++n;
    X509_free(cert);
  }
  ERR_clear_error();
  return n;
}

// A connected blocking socket to host:port within `timeout_ms`, or -1 with
// `error` set.
int ConnectTcp(const Endpoint& ep, int timeout_ms, std::string* error) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  struct addrinfo* found = nullptr;
  const std::string port = std::to_string(ep.port);
  if (int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    *error = ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  *error = "no address";
  for (struct addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                  a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd p = {fd, POLLOUT, 0};
      int err = ETIMEDOUT;
      if (::poll(&p, 1, timeout_ms) == 1) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      *error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  return fd;
}

}  // namespace

absl::Status ResolveCa(ChannelConfig* config, const std::string& ca_flag,
                       const std::string& token_file) {
  return ResolveCa(config, ca_flag, token_file, [](const char* name) {
    return static_cast<const char*>(std::getenv(name));
  });
}

absl::Status ResolveCa(ChannelConfig* config, const std::string& ca_flag,
                       const std::string& token_file,
                       const std::function<const char*(const char*)>& getenv) {
  if (config->endpoint.is_unix) return absl::OkStatus();
  std::string path = ca_flag;
  std::string from = "--ca-file";
  if (path.empty()) {
    if (const char* env = getenv(kCaEnv); env != nullptr && *env) {
      path = env;
      from = kCaEnv;
    }
  }
  if (path.empty() && !token_file.empty()) {
    const size_t slash = token_file.rfind('/');
    std::string beside = slash == std::string::npos
                             ? std::string("ca.pem")
                             : token_file.substr(0, slash + 1) + "ca.pem";
    if (::access(beside.c_str(), F_OK) == 0) {
      path = beside;
      from = "the CA beside --token-file";
    }
  }
  if (path.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler at ", config->endpoint.original,
        " speaks TLS: pass --ca-file FILE or set ", kCaEnv,
        " (the CA it printed at start: its STATE_DIR/ca.pem, or the CA of "
        "its --tls-cert)"));
  }
  auto pem = ReadFile(path);
  if (!pem.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the CA file ", path, " (", from,
                     "): ", pem.status().message()));
  }
  if (AddCerts(nullptr, *pem) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CA file ", path, " (", from,
        ") holds no PEM certificate; pass the scheduler's STATE_DIR/ca.pem "
        "(or the CA of its --tls-cert)"));
  }
  config->ca_pem = *pem;
  config->ca_file = path;
  return absl::OkStatus();
}

absl::Status ProbeTls(const ChannelConfig& config, int timeout_ms) {
  const Endpoint& ep = config.endpoint;
  if (ep.is_unix) return absl::OkStatus();
  std::string error;
  const int fd = ConnectTcp(ep, timeout_ms, &error);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", ep.original, ": ", error));
  }
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(
      SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(nullptr, SSL_free);
  if (ctx) {
    SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
    AddCerts(SSL_CTX_get_cert_store(ctx.get()), config.ca_pem);
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    static const unsigned char kH2[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx.get(), kH2, sizeof kH2);
    ssl.reset(SSL_new(ctx.get()));
  }
  if (!ssl) {
    ::close(fd);
    return absl::InternalError("TLS: " + OpenSslErrors());
  }
  unsigned char ip[16];
  const bool is_ip = ::inet_pton(AF_INET, ep.host.c_str(), ip) == 1 ||
                     ::inet_pton(AF_INET6, ep.host.c_str(), ip) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(param, ep.host.c_str());
  } else {
    X509_VERIFY_PARAM_set1_host(param, ep.host.c_str(), 0);
    SSL_set_tlsext_host_name(ssl.get(), ep.host.c_str());
  }
  SSL_set_fd(ssl.get(), fd);
  const int rc = SSL_connect(ssl.get());
  const int ssl_error = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl.get(), rc);
  const long verify = SSL_get_verify_result(ssl.get());
  const std::string detail = OpenSslErrors();
  if (rc == 1) SSL_shutdown(ssl.get());
  ::close(fd);
  if (rc == 1 && verify == X509_V_OK) return absl::OkStatus();
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH ||
      verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler's TLS certificate (checked with CA file ",
        CaLabel(config), ") does not name ", ep.host,
        "; connect by a name it has, or start the scheduler with --tls-name ",
        ep.host));
  }
  if (verify != X509_V_OK) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler at ", ep.original,
        " presented a TLS certificate that the CA file ", CaLabel(config),
        " does not vouch for (", X509_verify_cert_error_string(verify),
        "); pass the CA it printed at start (its STATE_DIR/ca.pem, or the CA "
        "of its --tls-cert) with --ca-file or ",
        kCaEnv));
  }
  if (ssl_error != SSL_ERROR_SSL) {
    // Closed, reset or timed out mid-handshake: busy or restarting, not
    // untrusted.
    return absl::UnavailableError(
        absl::StrCat("the TLS handshake with ", ep.original, " did not finish",
                     detail.empty() ? "" : ": ", detail));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no TLS handshake with ", ep.original, " (CA file ",
                   CaLabel(config), "): ", detail.empty() ? "not TLS" : detail,
                   "; is it a dlbatch scheduler's TCP address?"));
}

}  // namespace dlbatch
