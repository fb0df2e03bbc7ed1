// The trainer's checkpoint-and-stop (common/stop_signals.h): a process's
// kTrainerStopSignal sets a flag, and the training loop's ranks agree on
// it at iterations every rank reaches alike (trainer/training.cc), write a
// checkpoint at the end of that step and leave with
// kTrainerStoppedExitCode. SIGTERM keeps its meaning, stop at once,
// unless the process makes it a stop request too (`sigterm_too` below:
// dlbatch-train --stop-on-term, as a worker inside a Slurm allocation
// starts it, since Slurm's preemption sends SIGTERM to every process of the
// job and SIGKILL only at its GraceTime).
#ifndef DLBATCH_TRAINER_STOP_REQUEST_H_
#define DLBATCH_TRAINER_STOP_REQUEST_H_

#include <atomic>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {

// Blocks kTrainerStopSignal (and SIGTERM with `sigterm_too`) in the
// calling thread (and the threads and processes it starts), so that one
// sent now waits for whoever takes it: TakeStopRequests in a rank, or a
// launcher's forwarding (launcher.h). dlbatch-train calls it first thing,
// and again with `sigterm_too` once it has read --stop-on-term.
void HoldStopRequests(bool sigterm_too = false);

// Takes kTrainerStopSignal from now on: the flag that StopRequestFlag
// returns is set by one thread of its own, which waits for the signal
// while every other thread holds it. No thread that computes ever runs a
// handler: a signal frame written on its stack while a oneDNN kernel has
// pointed the stack register into a heap buffer corrupts the heap. A
// request already pending (the process may be started with the signal
// blocked: the launcher starts its ranks so, a worker may too) sets the
// flag before this returns. Call early, before the threads that compute
// start (they must inherit the held signal); later calls do nothing.
// With `sigterm_too`, SIGTERM is a stop request as kTrainerStopSignal is
// (each sets the flag, and the process goes on to its checkpoint); without
// it SIGTERM keeps its default action. REQUIRES: SIGTERM is held only where
// `sigterm_too` (HoldStopRequests(true)): none else would ever take it.
void TakeStopRequests(bool sigterm_too = false);

// Whether a stop request arrived since TakeStopRequests, for
// TrainRequest::stop_requested. Set by another thread (or, on a thread
// that should have held the signal, by its handler): a lock-free atomic.
const std::atomic<bool>* StopRequestFlag();

// One collective, every rank of `comm` calling it at the same iteration:
// whether any rank was asked to stop (`asked` is this rank's own flag).
// `device_flag` is one float of `backend`'s memory (a collective's buffer
// on a GPU). One rank alone takes its flag without a collective.
absl::StatusOr<bool> AgreeToStop(bool asked, Communicator& comm,
                                 Backend& backend, float* device_flag);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_STOP_REQUEST_H_
