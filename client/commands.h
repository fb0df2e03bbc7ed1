// The CLI's commands. Each takes its parsed options, talks to the scheduler
// through a Connection, prints to stdout (errors are returned, and main
// prints them on stderr) and returns the process exit code.
#ifndef DLBATCH_CLIENT_COMMANDS_H_
#define DLBATCH_CLIENT_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/connection.h"

namespace dlbatch::client {

struct SubmitOptions {
  std::string job_file;  // empty: a command job from `command`
  // After `--`: the program and its arguments (a command job without a job
  // file; with one, it replaces the file's command).
  std::vector<std::string> command;
  std::optional<int> pool;
  std::optional<std::string> profile;
  std::optional<int> priority;
  std::optional<std::string> name;
  std::optional<std::string> time_limit;  // a duration: 90s, 30m, 2h
  std::vector<std::string> env;           // NAME=VALUE; over the file's env
  std::vector<std::string> attach;        // more to upload, relative to the cwd
  std::optional<int> max_nodes;
  std::optional<std::string> launch;  // per-node | per-slot
  // Once the job ends, its outputs are fetched here (waits as --follow).
  std::string output_dir;
  bool follow = false;  // a sweep: wait for all its jobs, then compare them
  bool quiet = false;   // print only the id (a sweep: its job ids, one a line)
  // Empty: a random one. A submit repeating a request id the scheduler has
  // seen makes no job and gets the first one's id.
  std::string request_id;
  std::vector<int64_t> after;  // --after: start after these finished well
  // A train job's absolute data paths are on a filesystem only the workers
  // mount: not looked for here (relative ones are still checked).
  bool data_on_workers = false;
};
absl::StatusOr<int> Submit(const GlobalFlags& flags,
                           const SubmitOptions& options);

struct JobsOptions {
  std::vector<std::string> states;
  bool json = false;
  int limit = 0;          // > 0: the newest this many, newest first
  int64_t sweep_id = 0;   // 0: every job
  std::string user;       // only this user's jobs
  bool mine = false;      // only the caller's own
  std::string name_glob;  // only names matching this glob
  std::string format;     // table columns, comma-separated; "": the default
};
absl::StatusOr<int> Jobs(Connection& conn, const JobsOptions& options);
absl::StatusOr<int> Show(Connection& conn, int64_t job_id, bool json);
struct DiaryOptions {
  bool follow = false;      // until the job ends
  bool timestamps = false;  // each line prefixed with its local time
  bool raw = false;         // the exact bytes, unescaped (diary_text.h)
  bool json = false;        // one DiaryLineJson object a line
  bool quiet = false;       // print nothing: only wait for the end
  int tail = 0;             // > 0: only the last this many lines, then -f
};
absl::StatusOr<int> Diary(Connection& conn, int64_t job_id,
                          const DiaryOptions& options);
// The diary's lines after line *after_n (updated as they come), each given
// to `take`; with options.follow until the job ends. Retries while the
// scheduler is unreachable. After each chunk, `pending` (if given) is
// written to stdout (unless options.quiet) and cleared.
absl::StatusOr<int> ReadDiaryLines(
    Connection& conn, int64_t job_id, const DiaryOptions& options,
    int64_t* after_n, const std::function<void(const v1::DiaryLine&)>& take,
    std::string* pending = nullptr);
// A diary line as `diary` prints it with `options` (json, timestamps, raw).
void AppendDiaryLine(const DiaryOptions& options, const v1::DiaryLine& line,
                     std::string* out);
absl::StatusOr<int> Cancel(Connection& conn,
                           const std::vector<int64_t>& job_ids);
// `wait`: 0 if every job finished, 1 if one did not (failed, cancelled), 2
// on timeout, kExitNoSuchJob if the scheduler knows no job of an id.
inline constexpr int kExitNoSuchJob = 4;
absl::StatusOr<int> Wait(Connection& conn, const std::vector<int64_t>& job_ids,
                         int64_t timeout_ms);
// `json`: list only, as {"job_id", "state", "files"} (json_out.h).
absl::StatusOr<int> FetchOutputs(Connection& conn, int64_t job_id,
                                 const std::string& dir, bool list_only,
                                 bool json = false);
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

// Exit code of `wait` for a job that ended in `state`.
int ExitCodeFor(v1::JobState state);
// Exit code of `submit --follow`: 0 if the job finished, its own exit code
// if it failed with one (1-255; a job killed by signal N has 128+N, as a
// shell says, its time limit included), kExitJobCancelled if it was
// cancelled, kExitJobFailed if it failed without one (its program never
// ran, or its worker was lost).
inline constexpr int kExitJobFailed = 125;
inline constexpr int kExitJobCancelled = 130;
int FollowExitCode(const v1::Job& job);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_H_
