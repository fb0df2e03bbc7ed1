// Reads of the store on connections of their own, so that listing 100,000
// jobs never holds the writer (Store) up. store.h tells the threads' story.
#ifndef DLBATCH_SCHEDULER_STORE_STORE_READER_H_
#define DLBATCH_SCHEDULER_STORE_STORE_READER_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/store/job_tables.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// A listing of job summaries, filtered, sorted and paged by the store
// (ListJobsRequest's fields, checked by the caller).
struct JobListQuery {
  std::vector<v1::JobState> states;  // empty: all
  int limit = 0;                     // 0: all
  int offset = 0;
  // One of the columns "id", "submit_ms", "name", "user", "state",
  // "priority" (the caller maps ListJobsRequest.sort); ties by id.
  std::string sort_column = "id";
  bool descending = false;
  int64_t sweep_id = 0;       // != 0: only that sweep's jobs, with sweep_point
  std::string user;           // non-empty: only that user's
  std::string name_glob;      // non-empty: SQLite's GLOB on the name
  std::string name_contains;  // non-empty: names holding it (ASCII any case)
  bool count_total = false;   // set ListJobsReply.total
};

// The statement that lists `query`'s jobs (its text bound as ?1 user, ?2
// name_glob, ?3 the contains pattern): a page picks its ids on a covering
// index first. Public for the tests of its query plans; InvalidArgument
// for an unknown sort column.
absl::StatusOr<std::string> JobListingSql(const JobListQuery& query);

// Read-only access on pooled connections. Thread-safe: each read leases a
// connection of its own, so reads run side by side and see only committed
// transactions.
class StoreReader {
 public:
  explicit StoreReader(std::string path) : path_(std::move(path)) {}

  absl::StatusOr<std::optional<JobRecord>> GetJob(int64_t id);
  absl::StatusOr<std::vector<v1::StateChange>> History(int64_t id);
  // Summaries (no spec beyond name, profile, pool, priority) straight into
  // `out`, for listings of every job. sweep_id != 0: only that sweep's
  // jobs, with their spec's sweep_point too. `user` non-empty: only that
  // user's; `name_glob` non-empty: only names it matches (SQLite's GLOB).
  absl::Status ListJobSummaries(const std::vector<v1::JobState>& states,
                                int limit, bool newest_first,
                                v1::ListJobsReply* out, int64_t sweep_id = 0,
                                const std::string& user = "",
                                const std::string& name_glob = "");
  // The same by a query: one page of a sorted listing, with the count of
  // every job that matches when asked. Indexes cover each sort column.
  absl::Status ListJobSummaries(const JobListQuery& query,
                                v1::ListJobsReply* out);
  // A job's progress reports as committed (schema version 14), after
  // `after_seq`, at most `limit`, ascending; each with its seq.
  struct ProgressPoint {
    int64_t seq = 0;
    v1::TrainProgress progress;
  };
  absl::StatusOr<std::vector<ProgressPoint>> ProgressHistory(int64_t job_id,
                                                             int64_t after_seq,
                                                             int limit);
  // At most `limit` of the job's lines after diary.n `after`, ascending;
  // `ranks` non-empty: only the lines of those ranks (DiaryLine.rank).
  // `scanned` (if given) is set to the n up to which lines were looked at:
  // the last line returned, or with `ranks` a later line of another rank
  // (the job's newest where fewer than `limit` came), `after` where none
  // was, so that a reader going on from it skips what it passed over.
  absl::StatusOr<std::vector<v1::DiaryLine>> ReadDiary(
      int64_t job_id, int64_t after, int limit,
      const std::vector<int32_t>& ranks = {}, int64_t* scanned = nullptr);
  // The job's stored lines (of `ranks`, where non-empty): a capped diary's
  // cut lines are not counted.
  absl::StatusOr<int64_t> DiaryCount(int64_t job_id,
                                     const std::vector<int32_t>& ranks = {});
  // The store cursor (diary.n) after which the job's offset-th stored line
  // (from 0; of `ranks`, where non-empty) follows, for ReadDiary: 0 for
  // offset 0; past the job's newest line where it has no more. Positions,
  // unlike line numbers, have no gaps where a capped diary was cut. Found
  // on the (job_id, line) index for all ranks; with `ranks`, their lines
  // are counted up to the offset.
  absl::StatusOr<int64_t> DiaryCursorForOffset(
      int64_t job_id, int64_t offset, const std::vector<int32_t>& ranks = {});
  // The store cursor (diary.n) of the job's newest line numbered <= `line`
  // (DiaryLine.line), for reading on after it; 0 where none is.
  absl::StatusOr<int64_t> DiaryCursorForLine(int64_t job_id, int64_t line);
  // The `n` after which a job's last `tail` lines (of `ranks`, where
  // non-empty) begin; 0 where it has no more than `tail` of them.
  absl::StatusOr<int64_t> DiaryTailStart(
      int64_t job_id, int64_t tail, const std::vector<int32_t>& ranks = {});
  absl::StatusOr<std::vector<v1::OutputFile>> Outputs(int64_t job_id);
  absl::StatusOr<TrainState> GetTrainState(int64_t job_id);
  // As Store::KeptCheckpoints.
  absl::StatusOr<std::vector<v1::CheckpointStored>> KeptCheckpoints(
      int64_t job_id);
  absl::StatusOr<std::vector<v1::Preemption>> Preemptions(int64_t job_id);
  // The user a job was submitted by; NotFound for an unknown job.
  absl::StatusOr<std::string> JobUser(int64_t job_id);
  // Jobs by (profile, state), as Store::CountJobsByState.
  absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
  CountJobsByState();
  // Whether some job of `user` holds blob `sha256` (an attachment, an
  // output, a checkpoint).
  absl::StatusOr<bool> UserHoldsBlob(const std::string& user,
                                     const std::string& sha256);

 private:
  class Lease;
  // The first column of the first row of `sql` with `binds` bound in
  // order, or 0 where it returns no row.
  absl::StatusOr<int64_t> FirstInt(const char* sql,
                                   std::initializer_list<int64_t> binds);
  // An idle connection, or a new one where none is idle.
  absl::StatusOr<std::unique_ptr<Database>> Acquire() ABSL_LOCKS_EXCLUDED(mu_);
  // Back to the pool (at most 8 kept idle; the rest are closed).
  void Release(std::unique_ptr<Database> db) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  // Held only to take a connection from the pool or put one back, never
  // across a read.
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Database>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_STORE_READER_H_
