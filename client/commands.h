// The CLI's commands. Each takes its parsed options, talks to the scheduler
// through a Connection, prints to stdout (errors are returned, and main
// prints them on stderr) and returns the process exit code.
#ifndef DLBATCH_CLIENT_COMMANDS_H_
#define DLBATCH_CLIENT_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/connection.h"

namespace dlbatch::client {

struct SubmitOptions {
  std::string job_file;
  std::optional<int> pool;
  std::optional<std::string> profile;
  std::optional<int> priority;
  std::optional<std::string> name;
  bool follow = false;  // a sweep: wait for all its jobs, then compare them
  bool quiet = false;   // print only the id (a sweep: its job ids, one a line)
  // Empty: a random one. A submit repeating a request id the scheduler has
  // seen makes no job and gets the first one's id.
  std::string request_id;
  std::vector<int64_t> after;  // --after: start after these finished well
};
absl::StatusOr<int> Submit(const GlobalFlags& flags,
                           const SubmitOptions& options);

struct JobsOptions {
  std::vector<std::string> states;
  bool json = false;
  int limit = 0;
  int64_t sweep_id = 0;  // 0: every job
};
absl::StatusOr<int> Jobs(Connection& conn, const JobsOptions& options);
absl::StatusOr<int> Show(Connection& conn, int64_t job_id, bool json);
struct DiaryOptions {
  bool follow = false;      // until the job ends
  bool timestamps = false;  // each line prefixed with its local time
  bool raw = false;         // the exact bytes, unescaped (diary_text.h)
  bool json = false;        // one DiaryLineJson object a line
};
absl::StatusOr<int> Diary(Connection& conn, int64_t job_id,
                          const DiaryOptions& options);
absl::StatusOr<int> Cancel(Connection& conn,
                           const std::vector<int64_t>& job_ids);
absl::StatusOr<int> Wait(Connection& conn, const std::vector<int64_t>& job_ids,
                         int64_t timeout_ms);
absl::StatusOr<int> FetchOutputs(Connection& conn, int64_t job_id,
                                 const std::string& dir, bool list_only);
absl::StatusOr<int> Workers(Connection& conn, bool json);
absl::StatusOr<int> Profiles(Connection& conn, bool json);
// The live job monitor (monitor.cc); a plain snapshot with `once` or when
// stdin or stdout is not a terminal.
absl::StatusOr<int> Monitor(Connection& conn, bool once);

// Sweeps (commands_sweeps.cc). ShowSweep: the sweep's jobs compared, best
// first (--json: ListJobsReply in that order).
absl::StatusOr<int> ShowSweep(Connection& conn, int64_t sweep_id, bool json);
// What submit prints for a sweep: its id and its jobs' ids, or with `quiet`
// only the job ids, one a line.
void PrintSubmittedSweep(const v1::SubmitJobReply& reply, bool quiet);
// submit --follow of a sweep: waits for every job, then shows the
// comparison; the exit code is wait's.
absl::StatusOr<int> FollowSweep(Connection& conn,
                                const v1::SubmitJobReply& reply);

// Exit code of `wait` and `submit --follow` for a job that ended in `state`.
int ExitCodeFor(v1::JobState state);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_H_
