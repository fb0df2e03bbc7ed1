// Which scheduler the CLI talks to, and how: --scheduler, DLBATCH_SCHEDULER,
// or the embedded local cluster (started on first use).
#ifndef DLBATCH_CLIENT_CONNECTION_H_
#define DLBATCH_CLIENT_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch::client {

struct GlobalFlags {
  std::string scheduler;   // empty: DLBATCH_SCHEDULER, else the local cluster
  std::string token_file;  // empty: DLBATCH_TOKEN, else the local state's token
};

class Connection {
 public:
  // Resolves the address and token. With no address configured it starts
  // the embedded local cluster if it is not running.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const GlobalFlags& flags);

  v1::Scheduler::Stub* stub() { return stub_.get(); }
  const std::string& token() const { return config_.token; }
  const std::string& address() const { return config_.endpoint.original; }
  bool is_local() const { return local_; }

  // A context carrying the token, failing fast when the scheduler is down.
  std::unique_ptr<grpc::ClientContext> Context(
      int64_t deadline_ms = 60000) const;
  // Maps a failed call to a Status whose message says what to do; an
  // unreachable scheduler names the address tried.
  absl::Status Error(const grpc::Status& status) const;

 private:
  ChannelConfig config_;
  bool local_ = false;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_CONNECTION_H_
