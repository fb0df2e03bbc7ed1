// The trainer's checkpoint-and-stop (common/stop_signals.h): a process's
// kTrainerStopSignal sets a flag, and the training loop's ranks agree on
// it at iterations every rank reaches alike (trainer/training.cc), write a
// checkpoint at the end of that step and leave with
// kTrainerStoppedExitCode. SIGTERM keeps its meaning: stop at once.
#ifndef DLBATCH_TRAINER_STOP_REQUEST_H_
#define DLBATCH_TRAINER_STOP_REQUEST_H_

#include <atomic>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {

// Blocks kTrainerStopSignal in the calling thread (and the threads and
// processes it starts), so that one sent now waits for whoever takes it:
// InstallStopRequestHandler in a rank, or a launcher's forwarding
// (launcher.h). dlbatch-train calls it first thing.
void HoldStopRequests();

// Installs the handler of kTrainerStopSignal (it only sets the flag that
// StopRequestFlag returns; every thread of the process shares it) and then
// unblocks the signal. A process may be started with the signal blocked
// (the launcher starts its ranks so, a worker may too): one sent before
// the handler is in place then waits for it instead of ending the process.
// Call once, early, before threads start.
void InstallStopRequestHandler();

// Whether kTrainerStopSignal arrived since InstallStopRequestHandler, for
// TrainRequest::stop_requested. The handler's only state: a lock-free
// atomic, which a signal handler may set.
const std::atomic<bool>* StopRequestFlag();

// One collective, every rank of `comm` calling it at the same iteration:
// whether any rank was asked to stop (`asked` is this rank's own flag).
// `device_flag` is one float of `backend`'s memory (a collective's buffer
// on a GPU). One rank alone takes its flag without a collective.
absl::StatusOr<bool> AgreeToStop(bool asked, Communicator& comm,
                                 Backend& backend, float* device_flag);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_STOP_REQUEST_H_
