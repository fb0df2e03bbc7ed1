// The commands people type every day (commands_daily.cc): `submit` with or
// without a job file, `jobs` with its filters and columns, and what an
// unknown command gets (the nearest known one).
#ifndef DLBATCH_CLIENT_COMMANDS_DAILY_H_
#define DLBATCH_CLIENT_COMMANDS_DAILY_H_

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/connection.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch::client {

// Registers `submit` and `jobs` on `app`. `flags` is read when a command
// runs; its exit code goes to *rc. `dlbatch submit [OPTIONS] -- PROGRAM
// ARGS...`: everything after the first `--` that follows `submit` is the
// job's command, cut from argv here (so *argc shrinks) before CLI11 sees
// it.
void AddDailyCommands(CLI::App& app, const GlobalFlags* flags, int* rc,
                      int* argc, char** argv);

// Parses the command line and runs the command. Returns the exit code of a
// failed parse, kExitUsage (2; common/usage_exit.h), after printing why (an
// unknown command also gets the nearest known name, "did you mean
// `diary`?"; no command at all gets the list --help prints, on stderr), or
// 0 after --help or --version; nullopt once the command ran (its code is in
// the *rc the commands were registered with).
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv);

// `local stop`: refuses while jobs run on the local cluster (naming how
// many) unless `force`. `local status`: prints the status; exit code 0 when
// the scheduler and the worker both run, 3 when not (as `systemctl status`).
absl::StatusOr<int> StopLocal(bool force);
absl::StatusOr<int> LocalStatus();

// The known name nearest `typed`: a common synonym (logs -> diary, ps ->
// jobs, kill -> cancel) or the closest by edit distance, if close enough;
// "" when nothing is.
std::string NearestCommand(std::string_view typed,
                           const std::vector<std::string>& known);

// `jobs --state`: the states asked of the scheduler (empty: every state),
// and whether a queued job is kept only if it is held. "held" names the held
// queued jobs, as the STATE column does; "queued" takes held ones too. An
// unknown name is a usage error listing the known ones.
struct JobStateFilter {
  std::vector<v1::JobState> states;
  bool queued_only_held = false;
  bool Keeps(const v1::Job& job) const;
};
absl::StatusOr<JobStateFilter> ParseJobStateFilter(
    const std::vector<std::string>& names);
// What --state takes, for its --help and its error.
inline constexpr char kJobStateNames[] =
    "queued, held, running, cancelling, finished, failed or cancelled";

// `jobs --format`: the columns by name, comma-separated. An unknown name is
// an error listing the known ones.
enum class JobColumn {
  kId,
  kName,
  kUser,
  kState,
  kPool,
  kProfile,
  kPriority,
  kSubmitted,
  kStarted,
  kEnded,
  kElapsed,
  kProgress,
  kExitCode,
  kAttempt,
  kSweep,
  kNote,
};
absl::StatusOr<std::vector<JobColumn>> ParseJobColumns(std::string_view text);
// The default: id,name,user,state,pool,profile,submitted,elapsed,progress,
// note.
std::vector<JobColumn> DefaultJobColumns();
// The table; NOTE is why a queued job waits (wait_reason), else why it
// failed or was cancelled (reason). `now_ms` times a running job.
std::string RenderJobsTable(const std::vector<v1::Job>& jobs,
                            const std::vector<JobColumn>& columns,
                            int64_t now_ms);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_DAILY_H_
