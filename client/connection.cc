#include "client/connection.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "client/direct_call.h"
#include "client/global_options.h"
#include "client/local_cluster.h"
#include "client/terminal_text.h"
#include "common/duration.h"
#include "common/status.h"
#include "common/tls_client.h"
#include "common/usage_exit.h"

namespace dlbatch::client {
namespace {

// A try that ran this long reached the scheduler before it lost it (a
// try at an unreachable one fails at its connect).
constexpr int64_t kLongTryMs = 5000;

// UNAVAILABLE from gRPC's transport (no connection, or one that broke), as
// opposed to a handler's own UNAVAILABLE, whose message says more.
bool LostTransport(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string& m = status.error_message();
  for (const char* word : {"onnect", "Socket closed", "reset", "Broken pipe",
                           "closed", "GOAWAY", "unavailable"}) {
    if (m.find(word) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(
    const GlobalFlags& flags) {
  auto conn = std::unique_ptr<Connection>(new Connection());
  const SchedulerChoice choice = ChooseScheduler(flags, [](const char* name) {
    return static_cast<const char*>(std::getenv(name));
  });
  std::string address = choice.address;
  std::shared_ptr<grpc::Channel> local_channel;
  if (address.empty()) {
    ASSIGN_OR_RETURN(LocalCluster local, LocalCluster::Resolve());
    RETURN_IF_ERROR(local.EnsureRunning(/*verbose=*/false));
    address = local.address();
    conn->local_ = true;
    // The probe's connection is this command's: the local socket needs no
    // token or CA, so its channel is the one MakeChannel would make.
    local_channel = local.TakeAnsweredChannel();
    conn->first_socket_ = local.TakeAcceptedSocket();
  }
  ASSIGN_OR_RETURN(conn->config_.endpoint, ParseEndpoint(address));
  if (!choice.token_file.empty()) {
    ASSIGN_OR_RETURN(conn->config_.token, ReadTokenFile(choice.token_file));
  } else {
    conn->config_.token = choice.token;
  }
  if (!conn->config_.endpoint.is_unix && conn->config_.token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the scheduler at ", address,
        " needs a token: pass --token-file FILE or set "
        "DLBATCH_TOKEN (the scheduler keeps it in STATE_DIR/token)"));
  }
  RETURN_IF_ERROR(ResolveCa(&conn->config_, flags.ca_file, flags.token_file));
  conn->retry_for_ms_ = std::max<int64_t>(0, flags.retry_for_ms);
  conn->first_channel_ = std::move(local_channel);
  return conn;
}

v1::Scheduler::Stub* Connection::stub() {
  if (stub_ == nullptr) {
    first_socket_.reset();  // gRPC makes its own connection
    stub_ = v1::Scheduler::NewStub(first_channel_ != nullptr
                                       ? std::move(first_channel_)
                                       : MakeChannel(config_));
  }
  return stub_.get();
}

grpc::Status Connection::UnaryCall(
    std::string_view method, const google::protobuf::MessageLite& request,
    google::protobuf::MessageLite* reply,
    const std::function<grpc::Status(v1::Scheduler::Stub*,
                                     grpc::ClientContext*)>& call,
    int64_t deadline_ms) {
  static const bool direct = [] {
    const char* env = std::getenv("DLBATCH_DIRECT_CALLS");
    return env == nullptr || std::string_view(env) != "0";
  }();
  if (direct && config_.endpoint.is_unix && stub_ == nullptr) {
    SharedSocket sock = first_socket_ != nullptr
                            ? std::move(first_socket_)
                            : ConnectUnix(config_.endpoint.path);
    std::optional<grpc::Status> status = DirectUnaryCall(
        std::move(sock),
        absl::StrCat("/", v1::Scheduler::service_full_name(), "/",
                     absl::string_view(method.data(), method.size())),
        config_.token, request, reply, deadline_ms);
    if (status.has_value()) {
      outage_start_ms_ = 0;
      return *std::move(status);
    }
  }
  return Call(call, deadline_ms);
}

void Connection::Reconnect() {
  retired_.push_back(std::move(stub_));
  stub_ = v1::Scheduler::NewStub(MakeChannel(config_));
}

int64_t Connection::MonotonicMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool Connection::Unreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

bool Connection::RetryAfter(const grpc::Status& status,
                            int64_t try_started_ms) {
  if (!Unreachable(status) || !TlsTrouble(status).ok()) {
    retries_ = 0;
    outage_start_ms_ = 0;
    return false;
  }
  const int64_t now = MonotonicMs();
  if (outage_start_ms_ == 0 || now - try_started_ms > kLongTryMs) {
    outage_start_ms_ = now;
    retries_ = 0;
  }
  const int64_t pause_ms =
      std::min<int64_t>(500, int64_t{100} << std::min(retries_, 3));
  if (now + pause_ms > outage_start_ms_ + retry_for_ms_) return false;
  if (!told_retrying_) {
    told_retrying_ = true;
    std::cerr << "dlbatch: cannot reach the scheduler at "
              << TerminalText(config_.endpoint.original) << " ("
              << TerminalText(status.error_message())
              << "); retrying for up to " << FormatDurationMs(retry_for_ms_)
              << " (--retry-for)" << std::endl;
  }
  ++retries_;
  usleep(static_cast<useconds_t>(pause_ms * 1000));
  Reconnect();
  return true;
}

grpc::Status Connection::Call(
    const std::function<grpc::Status(v1::Scheduler::Stub*,
                                     grpc::ClientContext*)>& call,
    int64_t deadline_ms) {
  for (;;) {
    const int64_t started = MonotonicMs();
    auto ctx = Context(deadline_ms);
    grpc::Status status = call(stub(), ctx.get());
    if (!RetryAfter(status, started)) return status;
  }
}

std::unique_ptr<grpc::ClientContext> Connection::Context(
    int64_t deadline_ms) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddToken(ctx.get(), config_.token);
  if (deadline_ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(deadline_ms));
  }
  return ctx;
}

absl::Status Connection::TlsTrouble(const grpc::Status& status) const {
  if (config_.endpoint.is_unix || !Unreachable(status)) {
    return absl::OkStatus();
  }
  absl::Status probe = ProbeTls(config_, 3000);
  // Unreachable is the outage RetryAfter waits out.
  return absl::IsFailedPrecondition(probe) ? probe : absl::OkStatus();
}

absl::Status Connection::Error(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  if (absl::Status tls = TlsTrouble(status); !tls.ok()) return tls;
  if (LostTransport(status)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the scheduler at ", config_.endpoint.original, " (",
        status.error_message(), ")",
        told_retrying_ ? absl::StrCat(" for ", FormatDurationMs(retry_for_ms_),
                                      " (--retry-for)")
                       : "",
        "; is it running? Check --scheduler / DLBATCH_SCHEDULER",
        local_ ? ", or run `dlbatch local status`" : ""));
  }
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the scheduler at ", config_.endpoint.original,
                     " refused us: ", status.error_message()));
  }
  return FromGrpcStatus(status);
}

namespace {
constexpr absl::string_view kUsagePayload = "dlbatch.usage";
}  // namespace

absl::Status UsageError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kUsagePayload, absl::Cord("1"));
  return s;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

int Report(const absl::StatusOr<int>& result) {
  if (!result.ok()) {
    // A message may quote what a user or a job wrote (a job's name, a
    // worker's): escaped, its own line breaks kept.
    const absl::string_view message = result.status().message();
    std::cerr << "dlbatch: "
              << TerminalText({message.data(), message.size()},
                              {.newline = true})
              << "\n";
    return IsUsageError(result.status()) ? kExitUsage : 1;
  }
  return *result;
}

int WithConnection(
    const GlobalFlags& flags,
    const std::function<absl::StatusOr<int>(Connection&)>& command) {
  auto conn = Connection::Open(flags);
  if (!conn.ok()) return Report(conn.status());
  return Report(command(**conn));
}

}  // namespace dlbatch::client
