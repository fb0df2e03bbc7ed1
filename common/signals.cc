#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace dlbatch {
namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockStopSignals() {
  const sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void OnStopSignal(std::function<void(int)> on_signal) {
  std::thread([on_signal = std::move(on_signal)] {
    const sigset_t set = StopSignals();
    int sig = 0;
    sigwait(&set, &sig);
    on_signal(sig);
  }).detach();
}

}  // namespace dlbatch
