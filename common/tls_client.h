// The client side of the scheduler's TLS (TCP is always TLS): which CA a
// client or worker trusts, and a handshake of its own that says plainly why
// the scheduler's certificate was not accepted (gRPC only says that the
// connection failed).
#ifndef DLBATCH_COMMON_TLS_CLIENT_H_
#define DLBATCH_COMMON_TLS_CLIENT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/endpoint.h"

namespace dlbatch {

// The environment variable naming the CA file.
inline constexpr char kCaEnv[] = "DLBATCH_CA";
// The CA certificates themselves (PEM), as a worker hands them to a train
// job's ranks for the scheduler rendezvous over TCP: a job may run as a user
// who cannot read the worker's CA file.
inline constexpr char kRendezvousCaEnv[] = "DLBATCH_RENDEZVOUS_CA";

// For a TCP endpoint, fills config->ca_pem and ca_file from the first of:
// `ca_flag` (--ca-file), DLBATCH_CA, ca.pem beside `token_file` (the
// scheduler's state folder holds both). None of them, or a file holding no
// PEM certificate, is an error saying what to pass. A Unix socket needs
// none: nothing happens.
absl::Status ResolveCa(ChannelConfig* config, const std::string& ca_flag,
                       const std::string& token_file);
// As above, with DLBATCH_CA read through `getenv` (null: unset).
absl::Status ResolveCa(ChannelConfig* config, const std::string& ca_flag,
                       const std::string& token_file,
                       const std::function<const char*(const char*)>& getenv);

// Connects to config.endpoint (TCP) and does a TLS handshake that verifies
// the scheduler against config.ca_pem and its address, within
// `timeout_ms`. OK when it would be trusted; UNAVAILABLE when it cannot be
// reached; FAILED_PRECONDITION, with a message naming the CA file and what
// to change, when it is reached but not trusted or does not speak TLS.
absl::Status ProbeTls(const ChannelConfig& config, int timeout_ms);

// OpenSSL's error queue as text ("; " between entries), emptied; empty if
// it held nothing.
std::string OpenSslErrors();

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_TLS_CLIENT_H_
