// systemd's readiness protocol (sd_notify(3)) without libsystemd: one
// datagram of "KEY=VALUE" lines to the AF_UNIX socket named by
// $NOTIFY_SOCKET, a path or, starting with '@', an abstract name.
#ifndef DLBATCH_COMMON_SD_NOTIFY_H_
#define DLBATCH_COMMON_SD_NOTIFY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dlbatch {

// Sends `state` (e.g. "READY=1\nMAINPID=123") to `socket_name` as one
// datagram. Thread-safe (a socket per call).
absl::Status SendNotify(const std::string& socket_name,
                        absl::string_view state);

// Sends `state` to $NOTIFY_SOCKET. Not started by systemd (no
// NOTIFY_SOCKET): does nothing and returns OK. Failures are returned for the
// caller to log; a daemon keeps running without them.
absl::Status Notify(absl::string_view state);

// "READY=1\nSTATUS=<status>\nMAINPID=<this pid>", for a daemon once it
// serves.
std::string ReadyState(absl::string_view status);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_SD_NOTIFY_H_
