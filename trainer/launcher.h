// Starts the ranks of a local data-parallel run as processes, as torchrun
// does: `dlbatch-train --ranks 4 job.yaml` runs itself four times with
// --rank R --world 4 --rendezvous DIR added, and waits for them.
#ifndef DLBATCH_TRAINER_LAUNCHER_H_
#define DLBATCH_TRAINER_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlbatch::trainer {

// Runs `program` with `args` plus "--rank R --world N --rendezvous DIR" for
// R in [0, N), each in the caller's process group with its stdout and
// stderr. If a rank fails, the others are sent SIGTERM (and SIGKILL after
// a grace period); SIGINT/SIGTERM to the launcher go to every rank.
// Returns the exit code to leave with: 0 if every rank succeeded, else the
// first failing rank's code (128 + signal for a signal).
absl::StatusOr<int> LaunchRanks(const std::string& program,
                                const std::vector<std::string>& args, int world,
                                const std::string& rendezvous_dir);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_LAUNCHER_H_
