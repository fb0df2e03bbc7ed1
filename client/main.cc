// dlbatch: the command line of the batch system. The process's own
// settings are made here; the command line itself is client/app.h's.
#include <grpc/support/log.h>
#include <signal.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "client/app.h"
#include "common/malloc_tuning.h"

namespace {

// gRPC's own log lines ("Handshake failed with fatal error ...") would come
// before the CLI's message, which says the same with what to change (the CA
// file used, the address tried). GRPC_VERBOSITY set brings them back.
void QuietGrpcLog(gpr_log_func_args* /*args*/) {}

}  // namespace

int main(int argc, char** argv) {
  dlbatch::KeepChunkBuffersInProcess();
  // gRPC's mutexes are abseil's: lock-order checking cost a graph lookup
  // on every lock, a few percent of a short command's CPU.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  signal(SIGPIPE, SIG_IGN);
  if (std::getenv("GRPC_VERBOSITY") == nullptr) {
    gpr_set_log_function(QuietGrpcLog);
  }
  return dlbatch::client::RunCommandLine(argc, argv);
}
