#include "scheduler/store/diary_tables.h"

#include "common/status.h"

namespace dlbatch::scheduler {

absl::StatusOr<bool> DiaryTables::AddDiary(int64_t job_id, int attempt,
                                           int part, int64_t seq,
                                           int64_t time_ms, int stream,
                                           absl::string_view text,
                                           v1::DiaryLine::Ending ending,
                                           std::optional<int> rank) {
  // The job's newest line is found backwards on diary_by_job; it is never
  // deleted (a capped diary keeps its newest line), so numbers only grow.
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT OR IGNORE INTO diary(job_id, attempt, part, "
                   "seq, time_ms, stream, text, ending, rank, line) "
                   "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,"
                   "COALESCE((SELECT line FROM diary WHERE job_id=?1 "
                   "ORDER BY n DESC LIMIT 1), 0) + 1)"));
  st->Bind(1, job_id).Bind(2, attempt).Bind(3, part);
  if (seq < 0) {
    st->BindNull(4);
  } else {
    st->Bind(4, seq);
  }
  // Bound as a BLOB: a job may print any bytes (NUL, invalid UTF-8), and
  // they come back exactly. Rows of older files hold TEXT, read alike.
  st->Bind(5, time_ms).Bind(6, stream).BindBlob(7, text);
  st->Bind(8, static_cast<int>(ending));
  if (rank) {
    st->Bind(9, *rank);
  } else {
    st->BindNull(9);
  }
  RETURN_IF_ERROR(st->Run());
  return db_->Changes() > 0;
}

absl::StatusOr<std::optional<DiaryCut>> DiaryTables::GetDiaryCut(
    int64_t job_id) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT marker_n, head_bytes, tail_bytes, dropped_lines, "
                   "dropped_bytes FROM diary_cuts WHERE job_id=?"));
  ASSIGN_OR_RETURN(bool found, st->Bind(1, job_id).Step());
  std::optional<DiaryCut> cut;
  if (found) {
    cut.emplace();
    cut->marker_n = st->Int(0);
    cut->head_bytes = st->Int(1);
    cut->tail_bytes = st->Int(2);
    cut->dropped_lines = st->Int(3);
    cut->dropped_bytes = st->Int(4);
  }
  st->Reset();
  return cut;
}

absl::Status DiaryTables::PutDiaryCut(int64_t job_id, const DiaryCut& cut) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT OR REPLACE INTO diary_cuts(job_id, marker_n, "
                   "head_bytes, tail_bytes, dropped_lines, dropped_bytes) "
                   "VALUES(?,?,?,?,?,?)"));
  return st->Bind(1, job_id)
      .Bind(2, cut.marker_n)
      .Bind(3, cut.head_bytes)
      .Bind(4, cut.tail_bytes)
      .Bind(5, cut.dropped_lines)
      .Bind(6, cut.dropped_bytes)
      .Run();
}

absl::StatusOr<int64_t> DiaryTables::DiaryBytes(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT TOTAL(LENGTH(CAST(text AS BLOB))) "
                                "FROM diary WHERE job_id=?"));
  ASSIGN_OR_RETURN(bool row, st->Bind(1, job_id).Step());
  int64_t bytes = row ? st->Int(0) : 0;
  st->Reset();
  return bytes;
}

absl::StatusOr<std::vector<std::tuple<int, int, int64_t>>>
DiaryTables::DiaryLastSeqs(int64_t job_id, int64_t after) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT attempt, part, MAX(seq) FROM diary "
                                "WHERE job_id=? AND n>? AND seq IS NOT NULL "
                                "GROUP BY attempt, part"));
  st->Bind(1, job_id).Bind(2, after);
  std::vector<std::tuple<int, int, int64_t>> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    out.emplace_back(static_cast<int>(st->Int(0)), static_cast<int>(st->Int(1)),
                     st->Int(2));
  }));
  return out;
}

absl::StatusOr<std::pair<int64_t, int64_t>> DiaryTables::TrimDiary(
    int64_t job_id, int64_t after, int64_t bytes) {
  ASSIGN_OR_RETURN(
      Statement * scan,
      db_->Prepare("SELECT n, LENGTH(CAST(text AS BLOB)) FROM diary "
                   "WHERE job_id=? AND n>? ORDER BY n"));
  scan->Bind(1, job_id).Bind(2, after);
  std::vector<std::pair<int64_t, int64_t>> doomed;  // n, bytes; oldest first
  int64_t freed = 0;
  bool newer_left = false;
  for (;;) {
    absl::StatusOr<bool> row = scan->Step();
    if (!row.ok()) {
      scan->Reset();
      return row.status();
    }
    if (!*row) break;
    if (freed >= bytes) {
      newer_left = true;
      break;
    }
    doomed.emplace_back(scan->Int(0), scan->Int(1));
    freed += scan->Int(1);
  }
  scan->Reset();
  if (!newer_left && !doomed.empty()) {
    // The newest line stays, whatever its size.
    freed -= doomed.back().second;
    doomed.pop_back();
  }
  if (doomed.empty()) return std::make_pair(int64_t{0}, int64_t{0});
  ASSIGN_OR_RETURN(
      Statement * del,
      db_->Prepare("DELETE FROM diary WHERE job_id=? AND n>? AND n<=?"));
  RETURN_IF_ERROR(
      del->Bind(1, job_id).Bind(2, after).Bind(3, doomed.back().first).Run());
  return std::make_pair(static_cast<int64_t>(doomed.size()), freed);
}

absl::Status DiaryTables::SetDiaryText(int64_t n, absl::string_view text) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("UPDATE diary SET text=? WHERE n=?"));
  return st->BindBlob(1, text).Bind(2, n).Run();
}

}  // namespace dlbatch::scheduler
