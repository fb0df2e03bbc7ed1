// Scheduler addresses (`unix:PATH` or `HOST:PORT`), the tokens that guard
// TCP listeners, and channels that present them. TCP is always TLS: a
// channel to a TCP address verifies the scheduler against a CA
// (tls_client.h finds it); a Unix socket is plain.
#ifndef DLBATCH_COMMON_ENDPOINT_H_
#define DLBATCH_COMMON_ENDPOINT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlbatch {

struct Endpoint {
  bool is_unix = false;
  std::string path;  // unix socket path
  std::string host;  // TCP
  int port = 0;
  std::string original;

  // The address as gRPC takes it.
  std::string GrpcTarget() const;
  bool IsLoopback() const;
};

// Accepts "unix:/path", "unix:relative/path", "host:port", "[::1]:port".
absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view address);

// `s` with gRPC's percent-escapes ("%5B", "%25") decoded; a '%' not followed
// by two hex digits stays as it is. gRPC writes them in a grpc-message and
// in an IPv6 peer's name ("ipv6:%5B::1%5D:40000").
std::string PercentDecoded(absl::string_view s);

// The metadata key and scheme the token travels under.
inline constexpr char kAuthMetadataKey[] = "authorization";

// 32 random bytes, hex.
absl::StatusOr<std::string> GenerateToken();
// Reads the token in `path`, whitespace trimmed; an empty file is an error.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
// Reads STATE_DIR/token, creating it (mode 0600) on first use.
absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir);

// The token a call presents (`authorization: Bearer TOKEN`); empty if none.
std::string PresentedToken(const grpc::ServerContextBase& context);

// Whether a and b are equal, in time that depends only on their lengths:
// how much of a secret matched must not show in the time a refusal takes.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b);

// Connection settings of a client or worker.
struct ChannelConfig {
  Endpoint endpoint;
  std::string token;  // empty: none presented
  // TCP: the PEM certificates the scheduler's certificate must chain to,
  // and the file they came from (named in errors).
  std::string ca_pem;
  std::string ca_file;
};

std::shared_ptr<grpc::Channel> MakeChannel(const ChannelConfig& config);
// Puts the token on an outgoing call.
void AddToken(grpc::ClientContext* context, const std::string& token);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_ENDPOINT_H_
