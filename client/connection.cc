#include "client/connection.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "client/local_cluster.h"
#include "common/status.h"

namespace dlbatch::client {

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(
    const GlobalFlags& flags) {
  auto conn = std::unique_ptr<Connection>(new Connection());
  std::string address = flags.scheduler;
  if (address.empty()) {
    if (const char* env = std::getenv("DLBATCH_SCHEDULER");
        env != nullptr && *env) {
      address = env;
    }
  }
  if (address.empty()) {
    ASSIGN_OR_RETURN(LocalCluster local, LocalCluster::Resolve());
    RETURN_IF_ERROR(local.EnsureRunning(/*verbose=*/false));
    address = local.address();
    conn->local_ = true;
  }
  ASSIGN_OR_RETURN(conn->config_.endpoint, ParseEndpoint(address));
  if (!flags.token_file.empty()) {
    ASSIGN_OR_RETURN(conn->config_.token, ReadTokenFile(flags.token_file));
  } else if (const char* env = std::getenv("DLBATCH_TOKEN");
             env != nullptr && *env) {
    conn->config_.token = env;
  }
  if (!conn->config_.endpoint.is_unix && conn->config_.token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the scheduler at ", address,
        " needs a token: pass --token-file FILE or set "
        "DLBATCH_TOKEN (the scheduler keeps it in STATE_DIR/token)"));
  }
  conn->stub_ = v1::Scheduler::NewStub(MakeChannel(conn->config_));
  return conn;
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

absl::Status Connection::Error(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
      status.error_message().find("connect") != std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the scheduler at ",
                     config_.endpoint.original, " (", status.error_message(),
                     "); is it running? Check --scheduler / DLBATCH_SCHEDULER",
                     local_ ? ", or run `dlbatch local status`" : ""));
  }
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the scheduler at ", config_.endpoint.original,
                     " refused us: ", status.error_message()));
  }
  return FromGrpcStatus(status);
}

}  // namespace dlbatch::client
