// The store's diary tables, on the writer's connection: each job's lines
// (diary), numbered in its diary and kept with their endings, and where a
// capped diary was cut (diary_cuts). StoreReader reads the lines back on
// connections of its own.
#ifndef DLBATCH_SCHEDULER_STORE_DIARY_TABLES_H_
#define DLBATCH_SCHEDULER_STORE_DIARY_TABLES_H_

#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// Where a capped diary was cut: the first lines (head_bytes) come before
// the marker line, the last ones (tail_bytes) after it; what fell between
// is counted.
struct DiaryCut {
  int64_t marker_n = 0;  // the marker's diary.n; 0: not cut
  int64_t head_bytes = 0;
  int64_t tail_bytes = 0;
  int64_t dropped_lines = 0;
  int64_t dropped_bytes = 0;
};

class DiaryTables {
 public:
  DiaryTables(const DiaryTables&) = delete;
  DiaryTables& operator=(const DiaryTables&) = delete;

  // The caller holds a Transaction on the store's db().
  // seq < 0: a line of dlbatch's own (never deduplicated). Returns false if
  // the line (job, attempt, part, seq) was stored before. A stored line is
  // numbered after the job's newest one (DiaryLine.line). `rank`: the
  // global rank of the process that wrote it (DiaryLine.rank); none for
  // dlbatch's own lines.
  absl::StatusOr<bool> AddDiary(
      int64_t job_id, int attempt, int part, int64_t seq, int64_t time_ms,
      int stream, absl::string_view text,
      v1::DiaryLine::Ending ending = v1::DiaryLine::ENDING_NEWLINE,
      std::optional<int> rank = std::nullopt);

  // Diary cap bookkeeping (see DiaryCut).
  absl::StatusOr<std::optional<DiaryCut>> GetDiaryCut(int64_t job_id);
  absl::Status PutDiaryCut(int64_t job_id, const DiaryCut& cut);
  // Bytes of every line of the job's diary.
  absl::StatusOr<int64_t> DiaryBytes(int64_t job_id);
  // The newest seq per (attempt, part) among lines after diary.n `after`.
  absl::StatusOr<std::vector<std::tuple<int, int, int64_t>>> DiaryLastSeqs(
      int64_t job_id, int64_t after);
  // Deletes the oldest lines after diary.n `after` until at least `bytes`
  // are gone (never the newest line); returns {lines, bytes} deleted.
  absl::StatusOr<std::pair<int64_t, int64_t>> TrimDiary(int64_t job_id,
                                                        int64_t after,
                                                        int64_t bytes);
  absl::Status SetDiaryText(int64_t n, absl::string_view text);

 protected:
  explicit DiaryTables(Database* db) : db_(db) {}  // db outlives this
  ~DiaryTables() = default;

 private:
  Database* const db_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_DIARY_TABLES_H_
