#include "trainer/stop_request.h"

#include <signal.h>

#include "common/status.h"
#include "common/stop_signals.h"

namespace dlbatch::trainer {
namespace {

// The one global the handler needs: a signal handler reaches no object.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free,
              "a signal handler may only set a lock-free atomic");

void RememberStopRequest(int) {
  g_stop_requested.store(true, std::memory_order_relaxed);
}

}  // namespace

void HoldStopRequests() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kTrainerStopSignal);
  sigprocmask(SIG_BLOCK, &set, nullptr);
}

void InstallStopRequestHandler() {
  struct sigaction sa {};
  sa.sa_handler = RememberStopRequest;
  sigemptyset(&sa.sa_mask);
  // A rank waiting in a socket or a sleep goes on waiting; nothing it
  // waits for is cut short by the request.
  sa.sa_flags = SA_RESTART;
  sigaction(kTrainerStopSignal, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kTrainerStopSignal);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

const std::atomic<bool>* StopRequestFlag() { return &g_stop_requested; }

absl::StatusOr<bool> AgreeToStop(bool asked, Communicator& comm,
                                 Backend& backend, float* device_flag) {
  if (comm.size() == 1) return asked;
  float flag = asked ? 1.0f : 0.0f;
  backend.CopyToDevice(device_flag, &flag, sizeof(flag));
  RETURN_IF_ERROR(comm.AllreduceSum(device_flag, 1));
  backend.CopyToHost(&flag, device_flag, sizeof(flag));
  return flag > 0;
}

}  // namespace dlbatch::trainer
