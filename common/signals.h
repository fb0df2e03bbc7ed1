// How a daemon takes its stop signals (SIGTERM, SIGINT): blocked in every
// thread and waited for by one, so that stopping runs as ordinary code on
// a thread of its own instead of in a signal handler.
#ifndef DLBATCH_COMMON_SIGNALS_H_
#define DLBATCH_COMMON_SIGNALS_H_

#include <functional>

namespace dlbatch {

// Blocks SIGTERM and SIGINT in the calling thread, and so in every thread
// it starts afterwards (the mask is inherited), and ignores SIGPIPE (a
// write to a closed socket or pipe fails with EPIPE instead of ending the
// daemon). Call it first in main, before any thread exists.
void BlockStopSignals();

// Starts a detached thread that waits for the first SIGTERM or SIGINT and
// then calls `on_signal` with its number, once. Whatever `on_signal` uses
// must outlive the process's wait (a daemon's main-scoped objects do).
// REQUIRES: BlockStopSignals() was called before any other thread started,
// or a signal may be delivered to a thread that does not wait for it.
void OnStopSignal(std::function<void(int)> on_signal);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_SIGNALS_H_
