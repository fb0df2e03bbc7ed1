#include "trainer/stop_request.h"

#include <signal.h>
#include <time.h>

#include <mutex>
#include <thread>

#include "common/status.h"
#include "common/stop_signals.h"

namespace dlbatch::trainer {
namespace {

// The flag every thread of the process reads (StopRequestFlag).
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free,
              "a signal handler may only set a lock-free atomic");

sigset_t StopSet(bool sigterm_too) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kTrainerStopSignal);
  if (sigterm_too) sigaddset(&set, SIGTERM);
  return set;
}

// Only for a thread that does not hold the signal although it should (one
// a library started before HoldStopRequests): the request sets the flag
// there too, instead of ending the process by the signal's default action.
void RememberStopRequest(int) {
  g_stop_requested.store(true, std::memory_order_relaxed);
}

// The one thread that takes the requests: it waits for them with the
// signal held, so that no signal frame is ever written on a computing
// thread's stack (oneDNN's kernels point the stack register into heap
// buffers while they run: a frame written there corrupts the heap).
void WatchStopRequests(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0 && sigismember(&set, sig) == 1) {
      g_stop_requested.store(true, std::memory_order_relaxed);
    }
  }
}

}  // namespace

void HoldStopRequests(bool sigterm_too) {
  const sigset_t set = StopSet(sigterm_too);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void TakeStopRequests(bool sigterm_too) {
  static std::once_flag once;
  std::call_once(once, [sigterm_too] {
    struct sigaction sa {};
    sa.sa_handler = RememberStopRequest;
    sigemptyset(&sa.sa_mask);
    // A thread waiting in a socket or a sleep goes on waiting.
    sa.sa_flags = SA_RESTART;
    sigaction(kTrainerStopSignal, &sa, nullptr);
    if (sigterm_too) sigaction(SIGTERM, &sa, nullptr);
    // Held here for good, and so in every thread started from here on.
    HoldStopRequests(sigterm_too);
    // One sent while the process started (held until now) is taken before
    // this returns, so that the ranks' first agreement sees it; each
    // pending signal of the set is taken (one of each kind may wait).
    const sigset_t set = StopSet(sigterm_too);
    const timespec now = {0, 0};
    while (sigtimedwait(&set, nullptr, &now) > 0) {
      g_stop_requested.store(true, std::memory_order_relaxed);
    }
    // Blocked in sigwait until the process ends; it touches only the flag.
    std::thread(WatchStopRequests, set).detach();
  });
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
