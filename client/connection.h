// Which scheduler the CLI talks to, and how: --scheduler, DLBATCH_SCHEDULER,
// or the embedded local cluster (started on first use); and how long a call
// keeps trying while the scheduler cannot be reached (--retry-for).
#ifndef DLBATCH_CLIENT_CONNECTION_H_
#define DLBATCH_CLIENT_CONNECTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/direct_call.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "google/protobuf/message_lite.h"

namespace dlbatch::client {

struct GlobalFlags {
  std::string scheduler;   // empty: DLBATCH_SCHEDULER, else the local cluster
  std::string token_file;  // empty: DLBATCH_TOKEN, else the local state's token
  // TCP: the CA the scheduler's certificate must chain to; empty:
  // DLBATCH_CA, else ca.pem beside token_file.
  std::string ca_file;
  // How long a retried call keeps trying while the scheduler is unreachable
  // (a restart); 0: one try.
  int64_t retry_for_ms = 30000;
  // The profile of a submitted job whose file and flags name none
  // (--default-profile, or default_profile: in config.yaml); empty: the
  // scheduler's default.
  std::string default_profile;
};

class Connection {
 public:
  // Resolves the address and token. With no address configured it starts
  // the embedded local cluster if it is not running.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const GlobalFlags& flags);

  // The current channel's stub, made on first use (a command whose calls
  // all go direct never starts gRPC). Reconnect() replaces it (the old one
  // stays valid until the Connection is destroyed).
  v1::Scheduler::Stub* stub();
  const std::string& token() const { return config_.token; }
  const std::string& address() const { return config_.endpoint.original; }
  bool is_local() const { return local_; }

  // A context carrying the token, failing fast when the scheduler is down.
  std::unique_ptr<grpc::ClientContext> Context(
      int64_t deadline_ms = 60000) const;
  // Maps a failed call to a Status whose message says what to do; an
  // unreachable scheduler names the address tried, and a TCP scheduler
  // that is reached but not trusted names the CA file used.
  absl::Status Error(const grpc::Status& status) const;

  // ---- retrying while the scheduler is unreachable ----
  // Not thread-safe: only while no other thread uses stub().

  // True for a call that did not reach the scheduler or lost it mid-call
  // (UNAVAILABLE): the scheduler is down or restarting.
  static bool Unreachable(const grpc::Status& status);
  // After a try that began at `try_started_ms` (MonotonicMs) ended with
  // `status`: if the scheduler was unreachable, waits a moment (100 ms,
  // growing to 500 ms), opens a fresh channel (an old one may sit in its
  // reconnect backoff) and returns true, until --retry-for has passed since
  // the outage began; false for any other status (which ends the outage).
  // An outage begins at the first unreachable try after a success, or at
  // the end of a try that ran for seconds (a long wait or follow that
  // reached the scheduler and then lost it). Says once on stderr that it
  // retries. A TCP scheduler whose certificate is not trusted is not
  // retried.
  bool RetryAfter(const grpc::Status& status, int64_t try_started_ms);
  // A streaming call got data: the scheduler is reachable again.
  void Reached() { outage_start_ms_ = 0; }
  // Runs a unary call, each try with a fresh Context(deadline_ms), retrying
  // it while the scheduler is unreachable (RetryAfter). Only for calls that
  // are safe to repeat: reads, and submits carrying a request id.
  grpc::Status Call(const std::function<grpc::Status(
                        v1::Scheduler::Stub*, grpc::ClientContext*)>& call,
                    int64_t deadline_ms = 60000);
  // As Call(), for the unary call `method` of the Scheduler service
  // ("SubmitJob"): on a Unix socket it is first made without gRPC's
  // runtime (DirectUnaryCall), and through `call` only where that cannot
  // tell how it went. DLBATCH_DIRECT_CALLS=0 turns the direct way off.
  grpc::Status UnaryCall(std::string_view method,
                         const google::protobuf::MessageLite& request,
                         google::protobuf::MessageLite* reply,
                         const std::function<grpc::Status(
                             v1::Scheduler::Stub*, grpc::ClientContext*)>& call,
                         int64_t deadline_ms = 60000);
  // A fresh channel and stub.
  void Reconnect();
  static int64_t MonotonicMs();

 private:
  // For an UNAVAILABLE call over TCP: why the scheduler's TLS was not
  // accepted (a wrong CA, a certificate not naming the address), or OK
  // when it is not that.
  absl::Status TlsTrouble(const grpc::Status& status) const;

  ChannelConfig config_;
  bool local_ = false;
  int64_t retry_for_ms_ = 0;
  int retries_ = 0;              // in this outage, for the pause
  int64_t outage_start_ms_ = 0;  // 0: none
  bool told_retrying_ = false;
  std::unique_ptr<v1::Scheduler::Stub> stub_;  // null until first used
  // The local cluster's probe's channel, for the first stub, and its
  // check's connection, for the first direct call.
  std::shared_ptr<grpc::Channel> first_channel_;
  SharedSocket first_socket_;
  std::vector<std::unique_ptr<v1::Scheduler::Stub>> retired_;
};

// An error in the command line itself, found by the CLI before the scheduler
// is asked (a flag's bad value, a missing argument): INVALID_ARGUMENT,
// marked so that Report() exits kExitUsage (2) for it, as for what CLI11
// refuses.
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

// A command's exit code, or after printing why it failed ("dlbatch: ..."):
// kExitUsage for a UsageError, else 1.
int Report(const absl::StatusOr<int>& result);

// Runs `command` on a connection to the configured scheduler; its exit code
// as Report() gives it.
int WithConnection(
    const GlobalFlags& flags,
    const std::function<absl::StatusOr<int>(Connection&)>& command);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_CONNECTION_H_
