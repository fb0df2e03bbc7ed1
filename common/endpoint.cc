#include "common/endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch {

std::string Endpoint::GrpcTarget() const {
  if (is_unix) {
    return path.starts_with('/') ? absl::StrCat("unix://", path)
                                 : absl::StrCat("unix:", path);
  }
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool Endpoint::IsLoopback() const {
  if (is_unix || host == "localhost" || host == "::1") return true;
  // Only a numeric 127.0.0.0/8 address: a name like 127.example.com can
  // resolve to any machine.
  in_addr addr;
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1 &&
         (ntohl(addr.s_addr) >> 24) == 127;
}

std::string PercentDecoded(absl::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 &&
        hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view address) {
  Endpoint ep;
  ep.original = std::string(address);
  if (absl::StartsWith(address, "unix:")) {
    absl::string_view path = address.substr(5);
    while (absl::StartsWith(path, "//")) path.remove_prefix(1);
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address,
                       "' names no socket path; use unix:/path/to/socket"));
    }
    ep.is_unix = true;
    ep.path = std::string(path);
    return ep;
  }
  size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address '", address, "' is neither unix:PATH nor HOST:PORT"));
  }
  absl::string_view host = address.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address,
                     "' has no valid port (0-65535) after the last ':'"));
  }
  ep.host = host.empty() ? "127.0.0.1" : std::string(host);
  ep.port = port;
  return ep;
}

absl::StatusOr<std::string> GenerateToken() {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open", "/dev/urandom");
  unsigned char raw[32];
  ssize_t n = ::read(fd, raw, sizeof raw);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof raw)) {
    return absl::InternalError("short read from /dev/urandom");
  }
  std::string hex;
  for (unsigned char c : raw) absl::StrAppendFormat(&hex, "%02x", c);
  return hex;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto contents = ReadFile(path);
  if (!contents.ok()) {
    return Annotate(contents.status(), "reading the token file");
  }
  std::string token(absl::StripAsciiWhitespace(*contents));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " is empty"));
  }
  return token;
}

absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir) {
  std::string path = state_dir + "/token";
  if (::access(path.c_str(), F_OK) == 0) return ReadTokenFile(path);
  auto token = GenerateToken();
  if (!token.ok()) return token.status();
  if (auto s = WriteFileAtomic(path, *token + "\n", 0600); !s.ok()) return s;
  return token;
}

std::string PresentedToken(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find(kAuthMetadataKey);
  if (it == md.end()) return "";
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) return "";
  return std::string(value);
}

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

std::shared_ptr<grpc::Channel> MakeChannel(const ChannelConfig& config) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Reconnect quickly after a scheduler restart: retries start 100 ms
  // after a refused connection and never wait more than 500 ms. gRPC also
  // reads the minimum backoff as the least time one attempt may take to
  // reach the server's SETTINGS frame; 100 ms there made attempts against a
  // scheduler busy starting up time out again and again ("connection
  // attempt timed out before receiving SETTINGS frame"), so it is 1 s.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  if (config.endpoint.is_unix) {
    return grpc::CreateCustomChannel(config.endpoint.GrpcTarget(),
                                     grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = config.ca_pem;
  return grpc::CreateCustomChannel(config.endpoint.GrpcTarget(),
                                   grpc::SslCredentials(tls), args);
}

void AddToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) {
    context->AddMetadata(kAuthMetadataKey, absl::StrCat("Bearer ", token));
  }
}

}  // namespace dlbatch
