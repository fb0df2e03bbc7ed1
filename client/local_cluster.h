// The embedded local cluster: a scheduler and one worker of this machine,
// started in the background on a Unix socket in $XDG_STATE_HOME/dlbatch
// (mode 0700) the first time the CLI needs one, as MATLAB's `local` profile.
#ifndef DLBATCH_CLIENT_LOCAL_CLUSTER_H_
#define DLBATCH_CLIENT_LOCAL_CLUSTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/direct_call.h"
#include "grpcpp/channel.h"

namespace dlbatch::client {

class LocalCluster {
 public:
  // Finds the state folder ($XDG_STATE_HOME/dlbatch, else
  // ~/.local/state/dlbatch) and creates it with mode 0700.
  static absl::StatusOr<LocalCluster> Resolve();

  std::string address() const { return "unix:" + socket_path(); }
  std::string socket_path() const { return dir_ + "/scheduler.sock"; }
  const std::string& dir() const { return dir_; }

  // Starts what is not running (under a lock, so concurrent CLIs start one
  // cluster) and waits until the worker has joined. cpu_slots 0: default.
  absl::Status EnsureRunning(bool verbose, int cpu_slots = 0);
  absl::Status Stop();
  // Human status lines.
  std::string Status();
  bool SchedulerAnswers() const;
  // Whether something accepts connections on the socket (no call is made).
  // The connection is kept for TakeAcceptedSocket.
  bool SocketAccepts() const;
  // The connection of the last SocketAccepts that succeeded (null if none
  // did), handed over once: the command's direct call uses it instead of
  // connecting a second time (and the scheduler setting up a second
  // connection just as that call arrives).
  SharedSocket TakeAcceptedSocket() { return std::move(accepted_); }
  // The channel of the last probe that reached a running scheduler (null if
  // none did), handed over once: a command run right after EnsureRunning
  // makes its calls on the connection the probe opened instead of starting
  // gRPC and connecting a second time.
  std::shared_ptr<grpc::Channel> TakeAnsweredChannel() {
    return std::move(answered_);
  }

 private:
  explicit LocalCluster(std::string dir) : dir_(std::move(dir)) {}
  absl::Status StartProcess(const std::string& binary,
                            const std::vector<std::string>& args,
                            const std::string& log,
                            const std::string& pid_file);
  std::string dir_;
  // Set by SchedulerAnswers on success; a failed probe's channel is dropped
  // (it would wait out gRPC's reconnect backoff).
  mutable std::shared_ptr<grpc::Channel> answered_;
  mutable SharedSocket accepted_;  // set by SocketAccepts on success
};

// The folder of the running dlbatch executable, where its siblings
// dlbatch-scheduler and dlbatch-worker are looked for first.
std::string SelfDir();

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_LOCAL_CLUSTER_H_
