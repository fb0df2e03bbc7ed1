// Starts the ranks of a local data-parallel run as processes, as torchrun
// does: `dlbatch-train --ranks 4 job.yaml` runs itself four times with
// --rank R --world 4 --rendezvous DIR added, and waits for them.
#ifndef DLBATCH_TRAINER_LAUNCHER_H_
#define DLBATCH_TRAINER_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlbatch::trainer {

// The ranks one launcher starts: [first, first + count) of `world`. A job
// spread over several machines has one launcher on each.
struct RankRange {
  int count = 1;
  int first = 0;
  int world = 1;
};

// Runs `program` with `args` plus "--rank R --world N" (and
// "--rendezvous DIR" unless `rendezvous_dir` is empty: the ranks then find
// their rendezvous themselves) for each R of `range`, each in the caller's
// process group with its stdout and stderr. If a rank fails, the others are
// sent SIGTERM (and SIGKILL after a grace period); SIGINT/SIGTERM to the
// launcher go to every rank. kTrainerStopSignal (common/stop_signals.h) to
// the launcher goes to every rank too, without a deadline, and does not end
// the launcher; a rank leaving with kTrainerStoppedExitCode is no failure
// the others are stopped for (they agreed to stop too). The ranks start
// with kTrainerStopSignal blocked, so `program` must take it
// (dlbatch-train does, on a thread of its own: stop_request.h). Returns the
// exit code to leave with: 0 if every rank succeeded, else the first other
// rank's code (128 + signal for a signal; kTrainerStoppedExitCode for a run
// stopped on request). Removes `rendezvous_dir` at the end.
//
// `stop_on_term` (dlbatch-train --stop-on-term, whose ranks get the flag
// in `args`): SIGTERM to the launcher is a stop request as
// kTrainerStopSignal is, forwarded as kTrainerStopSignal without a
// deadline; the ranks start with SIGTERM held too; a failed rank's peers
// are stopped at once with SIGINT instead (SIGTERM would ask them for a
// checkpoint). SIGINT still stops every rank at once.
absl::StatusOr<int> LaunchRanks(const std::string& program,
                                const std::vector<std::string>& args,
                                const RankRange& range,
                                const std::string& rendezvous_dir,
                                bool stop_on_term = false);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_LAUNCHER_H_
