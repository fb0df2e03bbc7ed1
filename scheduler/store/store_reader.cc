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
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  // The spec (for sweep_point and array_task) only for one sweep's or
  // array's jobs: at most kMaxSweepJobs or kMaxArrayJobs rows, where a
  // listing of every job stays lean.
  std::string sql = absl::StrCat(
      "SELECT id, user, state, attempt, submit_ms, start_ms, end_ms, "
      "exit_code, reason, "
      "name, profile, pool, priority, train_state.progress, sweep_id, ",
      sweep_id != 0 ? "spec" : "NULL", ", parts",
      " FROM jobs LEFT JOIN train_state ON train_state.job_id = jobs.id");
  std::vector<std::string> where;
  if (!states.empty()) {
    where.push_back(
        absl::StrCat("state IN (",
                     absl::StrJoin(states, ",",
                                   [](std::string* o, v1::JobState s) {
                                     absl::StrAppend(o, static_cast<int>(s));
                                   }),
                     ")"));
  }
  if (sweep_id != 0) where.push_back(absl::StrCat("sweep_id = ", sweep_id));
  // Bound below, in this order: text from the caller never enters the SQL.
  if (!user.empty()) where.push_back("user = ?1");
  if (!name_glob.empty()) where.push_back("name GLOB ?2");
  if (!where.empty())
    absl::StrAppend(&sql, " WHERE ", absl::StrJoin(where, " AND "));
  absl::StrAppend(&sql, newest_first ? " ORDER BY id DESC" : " ORDER BY id");
  if (limit > 0) absl::StrAppend(&sql, " LIMIT ", limit);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db->raw(), sql.c_str(), -1, &st, nullptr) !=
      SQLITE_OK) {
    return db->Error("listing jobs");
  }
  Statement owner(nullptr, st);
  if (!user.empty()) {
    sqlite3_bind_text(st, 1, user.data(), static_cast<int>(user.size()),
                      SQLITE_TRANSIENT);
  }
  if (!name_glob.empty()) {
    sqlite3_bind_text(st, 2, name_glob.data(),
                      static_cast<int>(name_glob.size()), SQLITE_TRANSIENT);
  }
  auto text = [st](int col) {
    return absl::string_view(
        reinterpret_cast<const char*>(sqlite3_column_text(st, col)),
        static_cast<size_t>(sqlite3_column_bytes(st, col)));
  };
  for (;;) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) return db->Error("listing jobs");
    v1::Job* job = out->add_jobs();
    job->set_id(sqlite3_column_int64(st, 0));
    job->set_user(std::string(text(1)));
    job->set_state(static_cast<v1::JobState>(sqlite3_column_int(st, 2)));
    job->set_attempt(sqlite3_column_int(st, 3));
    job->set_submit_time_ms(sqlite3_column_int64(st, 4));
    job->set_start_time_ms(sqlite3_column_int64(st, 5));
    job->set_end_time_ms(sqlite3_column_int64(st, 6));
    job->set_exit_code(sqlite3_column_int(st, 7));
    if (sqlite3_column_bytes(st, 8) > 0) job->set_reason(std::string(text(8)));
    v1::JobSpec* spec = job->mutable_spec();
    spec->set_name(std::string(text(9)));
    spec->set_profile(std::string(text(10)));
    spec->set_pool(sqlite3_column_int(st, 11));
    spec->set_priority(sqlite3_column_int(st, 12));
    if (int n = sqlite3_column_bytes(st, 13); n > 0) {
      // A damaged row loses only its progress column.
      (void)job->mutable_progress()->ParseFromArray(sqlite3_column_blob(st, 13),
                                                    n);
    }
    job->set_sweep_id(sqlite3_column_int64(st, 14));
    if (int n = sqlite3_column_bytes(st, 15); n > 0) {
      v1::JobSpec full;
      if (full.ParseFromArray(sqlite3_column_blob(st, 15), n)) {
        *spec->mutable_sweep_point() = full.sweep_point();
        if (full.has_array_task()) {
          *spec->mutable_array_task() = full.array_task();
          SetJobArrayFields(full, job);
        }
      }
    }
    // The placement as GetJob has it (worker names are the caller's to
    // add): a few bytes a job.
    for (const Part& p : DecodeParts(text(16))) {
      v1::DevicePart* part = job->add_placement();
      part->set_worker_id(p.worker);
      part->mutable_devices()->Add(p.devices.begin(), p.devices.end());
    }
  }
  return absl::OkStatus();
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

absl::StatusOr<int64_t> StoreReader::DiaryCount(int64_t job_id) {
  return FirstInt("SELECT COUNT(*) FROM diary WHERE job_id=?", {job_id});
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
