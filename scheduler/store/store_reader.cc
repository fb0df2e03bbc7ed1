#include "scheduler/store/store_reader.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "proto/array_spec.h"
#include "scheduler/store/job_rows.h"

namespace dlbatch::scheduler {

absl::StatusOr<std::unique_ptr<Database>> StoreReader::Acquire() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      auto db = std::move(idle_.back());
      idle_.pop_back();
      return db;
    }
  }
  return Database::Open(path_, /*read_only=*/true, /*sync_full=*/false);
}

void StoreReader::Release(std::unique_ptr<Database> db) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < 8) idle_.push_back(std::move(db));
}

// Returns the connection to the pool when the read is done.
class StoreReader::Lease {
 public:
  Lease(StoreReader* reader, std::unique_ptr<Database> db)
      : reader_(reader), db_(std::move(db)) {}
  ~Lease() { reader_->Release(std::move(db_)); }
  Database* operator->() { return db_.get(); }
  Database* get() { return db_.get(); }

 private:
  StoreReader* reader_;
  std::unique_ptr<Database> db_;
};

absl::StatusOr<std::optional<JobRecord>> StoreReader::GetJob(int64_t id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  static const std::string sql =
      absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id=?");
  ASSIGN_OR_RETURN(Statement * st, db->Prepare(sql.c_str()));
  ASSIGN_OR_RETURN(bool found, st->Bind(1, id).Step());
  std::optional<JobRecord> out;
  if (found) {
    ASSIGN_OR_RETURN(JobRecord job, ReadJobRow(*st, /*with_spec=*/true));
    out = std::move(job);
  }
  st->Reset();
  return out;
}

absl::StatusOr<std::vector<v1::StateChange>> StoreReader::History(int64_t id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT state, time_ms, attempt, reason FROM job_events "
                  "WHERE job_id=? ORDER BY ev"));
  st->Bind(1, id);
  std::vector<v1::StateChange> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    v1::StateChange c;
    c.set_state(static_cast<v1::JobState>(st->Int(0)));
    c.set_time_ms(st->Int(1));
    c.set_attempt(static_cast<int>(st->Int(2)));
    c.set_reason(st->Text(3));
    out.push_back(std::move(c));
  }));
  return out;
}

absl::Status StoreReader::ListJobSummaries(
    const std::vector<v1::JobState>& states, int limit, bool newest_first,
    v1::ListJobsReply* out, int64_t sweep_id, const std::string& user,
    const std::string& name_glob) {
  JobListQuery query;
  query.states = states;
  query.limit = limit;
  query.descending = newest_first;
  query.sweep_id = sweep_id;
  query.user = user;
  query.name_glob = name_glob;
  return ListJobSummaries(query, out);
}

namespace {

// name LIKE's pattern for text anywhere in the name, with LIKE's own
// characters (and the escape) taken literally.
std::string ContainsPattern(const std::string& text) {
  std::string out = "%";
  for (char c : text) {
    if (c == '%' || c == '_' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('%');
  return out;
}

// A prepared statement of dynamic SQL with the query's text bound: ?1 the
// user, ?2 the glob, ?3 the contains pattern (text from the caller never
// enters the SQL).
absl::StatusOr<std::unique_ptr<Statement>> PrepareListing(
    Database* db, const std::string& sql, const JobListQuery& query) {
  sqlite3_stmt* raw = nullptr;
  if (sqlite3_prepare_v2(db->raw(), sql.c_str(), -1, &raw, nullptr) !=
      SQLITE_OK) {
    sqlite3_finalize(raw);
    return db->Error("listing jobs");
  }
  auto st = std::make_unique<Statement>(db, raw);
  if (!query.user.empty()) st->Bind(1, query.user);
  if (!query.name_glob.empty()) st->Bind(2, query.name_glob);
  if (!query.name_contains.empty())
    st->Bind(3, ContainsPattern(query.name_contains));
  return st;
}

// The WHERE clause of the query's filter ("" for none), its text bound by
// PrepareListing.
std::string JobListingFilter(const JobListQuery& query) {
  std::vector<std::string> where;
  if (!query.states.empty()) {
    where.push_back(
        absl::StrCat("state IN (",
                     absl::StrJoin(query.states, ",",
                                   [](std::string* o, v1::JobState s) {
                                     absl::StrAppend(o, static_cast<int>(s));
                                   }),
                     ")"));
  }
  if (query.sweep_id != 0)
    where.push_back(absl::StrCat("sweep_id = ", query.sweep_id));
  if (!query.user.empty()) where.push_back("user = ?1");
  if (!query.name_glob.empty()) where.push_back("name GLOB ?2");
  if (!query.name_contains.empty()) where.push_back("name LIKE ?3 ESCAPE '\\'");
  return where.empty() ? ""
                       : absl::StrCat(" WHERE ", absl::StrJoin(where, " AND "));
}

}  // namespace

absl::StatusOr<std::string> JobListingSql(const JobListQuery& query) {
  static constexpr const char* kSortColumns[] = {
      "id", "submit_ms", "name", "user", "state", "priority"};
  bool known = false;
  for (const char* c : kSortColumns) known |= query.sort_column == c;
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot sort jobs by '", query.sort_column, "'"));
  }
  const std::string filter = JobListingFilter(query);
  const char* dir = query.descending ? " DESC" : "";
  std::string order = absl::StrCat(" ORDER BY jobs.", query.sort_column, dir);
  if (query.sort_column != "id") absl::StrAppend(&order, ", jobs.id", dir);
  // The spec (for sweep_point and array_task) only for one sweep's or
  // array's jobs (at most kMaxSweepJobs or kMaxArrayJobs rows), or for the
  // sweeps' and arrays' jobs of a page of at most kPageWithSpecs rows (so
  // that a page tells an array's jobs from a sweep's), where a listing of
  // every job stays lean.
  constexpr int kPageWithSpecs = 1000;
  const char* spec = "NULL";
  if (query.sweep_id != 0) {
    spec = "spec";
  } else if (query.limit > 0 && query.limit <= kPageWithSpecs) {
    spec = "CASE WHEN jobs.sweep_id != 0 THEN spec END";
  }
  std::string sql = absl::StrCat(
      "SELECT id, user, state, attempt, submit_ms, start_ms, end_ms, "
      "exit_code, reason, "
      "name, profile, pool, priority, train_state.progress, sweep_id, ",
      spec, ", parts",
      " FROM jobs LEFT JOIN train_state ON train_state.job_id = jobs.id");
  if (query.limit <= 0 && query.offset <= 0) {
    absl::StrAppend(&sql, filter, order);
    return sql;
  }
  // A page: its ids first, sorted, skipped and cut on an index that holds
  // every column the filter and the sort read (schema version 15), so the
  // offset walks index entries, not rows; then only the page's rows.
  absl::StrAppend(&sql, " WHERE jobs.id IN (SELECT id FROM jobs", filter, order,
                  " LIMIT ", query.limit > 0 ? query.limit : -1);
  if (query.offset > 0) absl::StrAppend(&sql, " OFFSET ", query.offset);
  absl::StrAppend(&sql, ")", order);
  return sql;
}

absl::Status StoreReader::ListJobSummaries(const JobListQuery& query,
                                           v1::ListJobsReply* out) {
  ASSIGN_OR_RETURN(const std::string sql, JobListingSql(query));
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  if (query.count_total) {
    ASSIGN_OR_RETURN(auto count,
                     PrepareListing(db.get(),
                                    absl::StrCat("SELECT COUNT(*) FROM jobs",
                                                 JobListingFilter(query)),
                                    query));
    ASSIGN_OR_RETURN(bool row, count->Step());
    out->set_total(row ? count->Int(0) : 0);
  }
  ASSIGN_OR_RETURN(auto listing, PrepareListing(db.get(), sql, query));
  Statement& st = *listing;
  return st.ForEachRow([&] {
    v1::Job* job = out->add_jobs();
    job->set_id(st.Int(0));
    job->set_user(st.Text(1));
    job->set_state(static_cast<v1::JobState>(st.Int(2)));
    job->set_attempt(static_cast<int>(st.Int(3)));
    job->set_submit_time_ms(st.Int(4));
    job->set_start_time_ms(st.Int(5));
    job->set_end_time_ms(st.Int(6));
    job->set_exit_code(static_cast<int>(st.Int(7)));
    if (std::string reason = st.Text(8); !reason.empty())
      job->set_reason(std::move(reason));
    v1::JobSpec* spec = job->mutable_spec();
    spec->set_name(st.Text(9));
    spec->set_profile(st.Text(10));
    spec->set_pool(static_cast<int>(st.Int(11)));
    spec->set_priority(static_cast<int>(st.Int(12)));
    if (absl::string_view p = st.Blob(13); !p.empty()) {
      // A damaged row loses only its progress column.
      (void)job->mutable_progress()->ParseFromArray(p.data(),
                                                    static_cast<int>(p.size()));
    }
    job->set_sweep_id(st.Int(14));
    if (absl::string_view b = st.Blob(15); !b.empty()) {
      v1::JobSpec full;
      if (full.ParseFromArray(b.data(), static_cast<int>(b.size()))) {
        *spec->mutable_sweep_point() = full.sweep_point();
        if (full.has_array_task()) {
          *spec->mutable_array_task() = full.array_task();
          SetJobArrayFields(full, job);
        }
      }
    }
    // The placement as GetJob has it (worker names are the caller's to
    // add): a few bytes a job.
    for (const Part& p : DecodeParts(st.Text(16))) {
      v1::DevicePart* part = job->add_placement();
      part->set_worker_id(p.worker);
      part->mutable_devices()->Add(p.devices.begin(), p.devices.end());
    }
  });
}

absl::StatusOr<std::vector<StoreReader::ProgressPoint>>
StoreReader::ProgressHistory(int64_t job_id, int64_t after_seq, int limit) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT seq, progress FROM progress_history WHERE job_id=? "
                  "AND seq>? ORDER BY seq LIMIT ?"));
  st->Bind(1, job_id).Bind(2, after_seq).Bind(3, limit);
  std::vector<ProgressPoint> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    ProgressPoint point;
    point.seq = st->Int(0);
    absl::string_view blob = st->Blob(1);
    // A damaged row is a point without values, keeping its place.
    (void)point.progress.ParseFromArray(blob.data(),
                                        static_cast<int>(blob.size()));
    out.push_back(std::move(point));
  }));
  return out;
}

namespace {

// Ranks as the JSON array json_each reads, so that one cached statement
// serves any list.
std::string RanksJson(const std::vector<int32_t>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
}

}  // namespace

absl::StatusOr<std::vector<v1::DiaryLine>> StoreReader::ReadDiary(
    int64_t job_id, int64_t after, int limit, const std::vector<int32_t>& ranks,
    int64_t* scanned) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  Statement* st = nullptr;
  if (ranks.empty()) {
    ASSIGN_OR_RETURN(
        st, db->Prepare("SELECT n, time_ms, stream, text, attempt, seq, line, "
                        "ending, part, rank, 1 FROM diary WHERE job_id=? AND "
                        "n>? ORDER BY n LIMIT ?"));
    st->Bind(1, job_id).Bind(2, after).Bind(3, limit);
  } else {
    // The job's newest line comes too (its last column says whether it is
    // of `ranks`): one statement sees one snapshot, so where it is reached
    // every line up to it was looked at, however few were of `ranks`.
    ASSIGN_OR_RETURN(
        st,
        db->Prepare(
            "SELECT n, time_ms, stream, text, attempt, seq, line, ending, "
            "part, rank, rank IN (SELECT value FROM json_each(?4)) FROM diary "
            "WHERE job_id=?1 AND n>?2 AND (rank IN (SELECT value FROM "
            "json_each(?4)) OR n=(SELECT MAX(n) FROM diary WHERE "
            "job_id=?1)) ORDER BY n LIMIT ?3"));
    st->Bind(1, job_id).Bind(2, after).Bind(3, limit).Bind(4, RanksJson(ranks));
  }
  std::vector<v1::DiaryLine> out;
  int64_t last = after;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    last = st->Int(0);
    if (st->Int(10) == 0) return;  // the newest line, of another rank
    v1::DiaryLine line;
    line.set_n(st->Int(0));
    line.set_time_ms(st->Int(1));
    line.set_stream(static_cast<int>(st->Int(2)));
    line.set_text(std::string(st->Blob(3)));
    line.set_attempt(static_cast<int>(st->Int(4)));
    line.set_seq(st->IsNull(5) ? -1 : st->Int(5));
    line.set_line(st->IsNull(6) ? 0 : st->Int(6));
    const int64_t ending = st->Int(7);
    if (v1::DiaryLine::Ending_IsValid(static_cast<int>(ending))) {
      line.set_ending(static_cast<v1::DiaryLine::Ending>(ending));
    }
    line.set_part(static_cast<int>(st->Int(8)));
    if (!st->IsNull(9)) line.set_rank(static_cast<int>(st->Int(9)));
    out.push_back(std::move(line));
  }));
  if (scanned != nullptr) *scanned = last;
  return out;
}

absl::StatusOr<int64_t> StoreReader::FirstInt(
    const char* sql, std::initializer_list<int64_t> binds) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(Statement * st, db->Prepare(sql));
  int index = 1;
  for (int64_t value : binds) st->Bind(index++, value);
  ASSIGN_OR_RETURN(bool row, st->Step());
  int64_t n = row ? st->Int(0) : 0;
  st->Reset();
  return n;
}

absl::StatusOr<int64_t> StoreReader::DiaryCount(
    int64_t job_id, const std::vector<int32_t>& ranks) {
  if (ranks.empty()) {
    // Lines are numbered 1, 2, ... as stored, and only a capped diary loses
    // any: one run right after its cut's marker (as DiaryCursorForOffset
    // says). So the count is the newest line's number less the numbers
    // between the marker and the first line kept after it: three lookups
    // on indexes, one statement (one snapshot), however long the diary.
    return FirstInt(
        "SELECT COALESCE((SELECT MAX(line) FROM diary WHERE job_id=?1), 0) - "
        "COALESCE((SELECT d.line FROM diary d, diary_cuts c WHERE "
        "c.job_id=?1 AND d.job_id=?1 AND d.n > c.marker_n ORDER BY d.n "
        "LIMIT 1) - (SELECT d.line FROM diary_cuts c JOIN diary d ON d.n = "
        "c.marker_n WHERE c.job_id=?1) - 1, 0)",
        {job_id});
  }
  // A rank's lines are spread among the others': counted, on
  // diary_by_rank (job_id, rank), which holds both, without reading a row.
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT COUNT(*) FROM diary WHERE job_id=? AND rank IN "
                  "(SELECT value FROM json_each(?))"));
  ASSIGN_OR_RETURN(bool row,
                   st->Bind(1, job_id).Bind(2, RanksJson(ranks)).Step());
  const int64_t count = row ? st->Int(0) : 0;
  st->Reset();
  return count;
}

absl::StatusOr<int64_t> StoreReader::DiaryCursorForOffset(
    int64_t job_id, int64_t offset, const std::vector<int32_t>& ranks) {
  if (offset <= 0) return 0;
  if (!ranks.empty()) {
    // A rank's lines are spread among the others': counted on the way.
    ASSIGN_OR_RETURN(auto raw, Acquire());
    Lease db(this, std::move(raw));
    ASSIGN_OR_RETURN(
        Statement * st,
        db->Prepare("SELECT n FROM diary WHERE job_id=? AND rank IN (SELECT "
                    "value FROM json_each(?)) ORDER BY n LIMIT 1 OFFSET ?"));
    st->Bind(1, job_id).Bind(2, RanksJson(ranks)).Bind(3, offset - 1);
    ASSIGN_OR_RETURN(bool row, st->Step());
    const int64_t n = row ? st->Int(0) : 0;
    st->Reset();
    if (row) return n;
    // Past the last: after the job's newest line, where nothing follows.
    return FirstInt("SELECT COALESCE(MAX(n), 0) FROM diary WHERE job_id=?",
                    {job_id});
  }
  // Lines are numbered 1, 2, ... as stored, and only a capped diary loses
  // any: one run right after its cut's marker (diary_cuts). So the stored
  // lines are 1..M (M the marker's number), then G, G+1, ... (G the first
  // kept after it), and the offset-th is found on diary_by_job_line.
  ASSIGN_OR_RETURN(
      int64_t marker_line,
      FirstInt("SELECT d.line FROM diary_cuts c JOIN diary d ON d.n = "
               "c.marker_n WHERE c.job_id=?",
               {job_id}));
  if (marker_line <= 0 || offset <= marker_line)
    return DiaryCursorForLine(job_id, offset);
  ASSIGN_OR_RETURN(
      int64_t resumed,
      FirstInt("SELECT d.line FROM diary d, diary_cuts c WHERE c.job_id=?1 "
               "AND d.job_id=?1 AND d.n > c.marker_n ORDER BY d.n LIMIT 1",
               {job_id}));
  if (resumed <= 0) return DiaryCursorForLine(job_id, INT64_MAX);
  // The line before the offset-th: in the run lost where offset is the
  // first after the cut (the marker's n is found then).
  return DiaryCursorForLine(job_id, resumed + (offset - marker_line) - 1);
}

absl::StatusOr<int64_t> StoreReader::DiaryCursorForLine(int64_t job_id,
                                                        int64_t line) {
  if (line <= 0) return 0;
  return FirstInt(
      "SELECT n FROM diary WHERE job_id=? AND line<=? ORDER BY line DESC "
      "LIMIT 1",
      {job_id, line});
}

absl::StatusOr<int64_t> StoreReader::DiaryTailStart(
    int64_t job_id, int64_t tail, const std::vector<int32_t>& ranks) {
  // Walks the (job_id, n) index backwards past `tail` lines.
  if (ranks.empty()) {
    return FirstInt(
        "SELECT n FROM diary WHERE job_id=? ORDER BY n DESC LIMIT 1 OFFSET ?",
        {job_id, tail});
  }
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT n FROM diary WHERE job_id=? AND rank IN (SELECT "
                  "value FROM json_each(?)) ORDER BY n DESC LIMIT 1 OFFSET ?"));
  st->Bind(1, job_id).Bind(2, RanksJson(ranks)).Bind(3, tail);
  ASSIGN_OR_RETURN(bool row, st->Step());
  const int64_t n = row ? st->Int(0) : 0;
  st->Reset();
  return n;
}

absl::StatusOr<TrainState> StoreReader::GetTrainState(int64_t job_id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  return ReadTrainState(db.get(), job_id);
}

absl::StatusOr<std::vector<v1::CheckpointStored>> StoreReader::KeptCheckpoints(
    int64_t job_id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  return ReadKeptCheckpoints(db.get(), job_id);
}

absl::StatusOr<std::vector<v1::Preemption>> StoreReader::Preemptions(
    int64_t job_id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  return ReadPreemptions(db.get(), job_id);
}

absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
StoreReader::CountJobsByState() {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  return CountJobsOn(db.get());
}

absl::StatusOr<std::string> StoreReader::JobUser(int64_t job_id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(Statement * st,
                   db->Prepare("SELECT user FROM jobs WHERE id=?"));
  st->Bind(1, job_id);
  ASSIGN_OR_RETURN(bool row, st->Step());
  std::string user = row ? st->Text(0) : "";
  st->Reset();
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("no job ", job_id, "; `dlbatch jobs` lists the jobs"));
  }
  return user;
}

absl::StatusOr<bool> StoreReader::UserHoldsBlob(const std::string& user,
                                                const std::string& sha256) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT 1 FROM job_blobs b JOIN jobs j ON j.id=b.job_id "
                  "WHERE b.sha256=? AND j.user=? LIMIT 1"));
  st->Bind(1, sha256).Bind(2, user);
  ASSIGN_OR_RETURN(bool row, st->Step());
  st->Reset();
  return row;
}

absl::StatusOr<std::vector<v1::OutputFile>> StoreReader::Outputs(
    int64_t job_id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(Statement * st,
                   db->Prepare("SELECT path, size, sha256, mode, symlink "
                               "FROM outputs WHERE job_id=? ORDER BY path"));
  st->Bind(1, job_id);
  std::vector<v1::OutputFile> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    v1::OutputFile f;
    f.set_path(st->Text(0));
    f.set_size(st->Int(1));
    f.set_sha256(st->Text(2));
    f.set_mode(static_cast<uint32_t>(st->Int(3)));
    f.set_symlink(st->Text(4));
    out.push_back(std::move(f));
  }));
  return out;
}

}  // namespace dlbatch::scheduler
