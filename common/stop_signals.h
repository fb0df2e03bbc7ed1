// Signals by name for jobs (a command job's `preempt_signal`), and the
// trainer's checkpoint-and-stop contract, which the worker (that sends it)
// and the trainer (that obeys it) share.
#ifndef DLBATCH_COMMON_STOP_SIGNALS_H_
#define DLBATCH_COMMON_STOP_SIGNALS_H_

#include <csignal>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace dlbatch {

// The trainer's "checkpoint and stop": its ranks agree on a step, write a
// checkpoint at its end and exit with kTrainerStoppedExitCode. SIGTERM
// still stops it at once, without a checkpoint, unless it runs with
// --stop-on-term (as a worker in a Slurm job starts it): SIGTERM is then a
// stop request too.
inline constexpr int kTrainerStopSignal = SIGUSR1;
// EX_TEMPFAIL: stopped on request with its work kept; run it again.
inline constexpr int kTrainerStoppedExitCode = 75;

// The number of a signal named without or with SIG, in any case ("TERM",
// "sigusr1", "INT"); nullopt for a name that is not one a job may be sent
// (KILL and STOP are not: they cannot be caught, and the kill at the grace
// follows anyway).
std::optional<int> StopSignalNumber(absl::string_view name);
// "TERM" for SIGTERM, as StopSignalNumber reads it; "signal N" for others.
std::string StopSignalName(int number);
// The names StopSignalNumber accepts, for an error's hint: "TERM, INT, ...".
std::string StopSignalNames();

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_STOP_SIGNALS_H_
