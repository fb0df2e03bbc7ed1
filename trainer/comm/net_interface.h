// Which network interface of this machine a rank's peers reach it on, so
// that NCCL's sockets take the interface Gloo's take: the one holding the
// address the worker was given (--host).
//
// Thread safety: free functions, safe from any thread.
#ifndef DLBATCH_TRAINER_COMM_NET_INTERFACE_H_
#define DLBATCH_TRAINER_COMM_NET_INTERFACE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace dlbatch::trainer {

// The name of the interface of this machine that holds `host` (an IPv4 or
// IPv6 address, or a name resolved to one): "lo" for 127.0.0.1.
// InvalidArgument where `host` does not resolve; NotFound where no
// interface holds it, listing the interfaces and their addresses.
absl::StatusOr<std::string> InterfaceWithAddress(const std::string& host);

// What NCCL_SOCKET_IFNAME should be for a rank listening on `host`:
// "=<interface>" (an exact name, not NCCL's default prefix match) where
// the ranks span machines (`host` is not a loopback address) and the
// variable is not set (`current` null: the user's setting wins); nullopt
// otherwise, leaving NCCL's own choice. An error where `host` is on no
// interface of this machine (the caller may leave NCCL's choice then).
absl::StatusOr<std::optional<std::string>> NcclSocketInterface(
    const std::string& host, const char* current);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMM_NET_INTERFACE_H_
