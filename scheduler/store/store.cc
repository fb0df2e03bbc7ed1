#include "scheduler/store/store.h"

#include <sys/stat.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace dlbatch::scheduler {
namespace {

// Version 2 added jobs.sweep_id; version 3 diary_cuts, job_blobs and
// jobs_by_end; version 4 user_limits and user_usage; version 5
// credentials; version 6 worker_drains and job_control (store_control.cc);
// version 7 slurm_jobs (store_slurm.cc); version 8 part_ends and
// slurm_resubmits (store_slurm.cc); version 9 job_requests (request ids
// per user, with the digest of what each asked for); version 10 diary.line
// and diary.ending (store_diary.cc).
// Older files are migrated on open.
constexpr int kSchemaVersion = 10;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS credentials(
  name TEXT NOT NULL,
  worker INTEGER NOT NULL,
  admin INTEGER NOT NULL,
  token_sha256 TEXT NOT NULL UNIQUE,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY(name, worker));
CREATE TABLE IF NOT EXISTS profiles(
  name TEXT PRIMARY KEY,
  max_pool INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS workers(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  host TEXT NOT NULL,
  profile TEXT NOT NULL,
  devices BLOB NOT NULL,
  last_seen_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  id INTEGER PRIMARY KEY,
  request_id TEXT UNIQUE,
  user TEXT NOT NULL,
  spec BLOB NOT NULL,
  name TEXT NOT NULL,
  profile TEXT NOT NULL,
  pool INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  state INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  submit_ms INTEGER NOT NULL,
  start_ms INTEGER NOT NULL,
  end_ms INTEGER NOT NULL,
  parts TEXT NOT NULL,
  exit_code INTEGER NOT NULL,
  reason TEXT NOT NULL,
  sweep_id INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS job_events(
  job_id INTEGER NOT NULL,
  ev INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  state INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY(job_id, ev)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS diary(
  n INTEGER PRIMARY KEY,
  job_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  part INTEGER NOT NULL,
  seq INTEGER,
  time_ms INTEGER NOT NULL,
  stream INTEGER NOT NULL,
  text BLOB NOT NULL,
  line INTEGER,
  ending INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS diary_by_line ON diary(job_id, attempt, part, seq);
CREATE INDEX IF NOT EXISTS diary_by_job ON diary(job_id, n);
CREATE TABLE IF NOT EXISTS outputs(
  job_id INTEGER NOT NULL,
  path TEXT NOT NULL,
  size INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  mode INTEGER NOT NULL,
  PRIMARY KEY(job_id, path));
CREATE TABLE IF NOT EXISTS train_state(
  job_id INTEGER PRIMARY KEY,
  progress BLOB,
  checkpoint BLOB);
CREATE TABLE IF NOT EXISTS diary_cuts(
  job_id INTEGER PRIMARY KEY,
  marker_n INTEGER NOT NULL,
  head_bytes INTEGER NOT NULL,
  tail_bytes INTEGER NOT NULL,
  dropped_lines INTEGER NOT NULL,
  dropped_bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS job_blobs(
  sha256 TEXT NOT NULL,
  job_id INTEGER NOT NULL,
  PRIMARY KEY(sha256, job_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_blobs_by_job ON job_blobs(job_id);
)sql";

// From `jobs` (unaliased): a job's request id is in job_requests.
constexpr char kJobColumns[] =
    "id, (SELECT request_id FROM job_requests WHERE job_id=jobs.id), user, "
    "spec, state, attempt, submit_ms, start_ms, end_ms, parts, exit_code, "
    "reason, name, profile, pool, priority, sweep_id";

absl::StatusOr<JobRecord> ReadJobRow(const Statement& row, bool with_spec) {
  JobRecord job;
  job.id = row.Int(0);
  job.request_id = row.Text(1);
  job.user = row.Text(2);
  if (with_spec) {
    absl::string_view blob = row.Blob(3);
    if (!job.spec.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
      return absl::DataLossError(
          absl::StrCat("job ", job.id, ": stored spec is corrupt"));
    }
  } else {
    job.spec.set_name(row.Text(12));
    job.spec.set_profile(row.Text(13));
    job.spec.set_pool(static_cast<int>(row.Int(14)));
    job.spec.set_priority(static_cast<int>(row.Int(15)));
  }
  job.state = static_cast<v1::JobState>(row.Int(4));
  job.attempt = static_cast<int>(row.Int(5));
  job.submit_ms = row.Int(6);
  job.start_ms = row.Int(7);
  job.end_ms = row.Int(8);
  job.parts = DecodeParts(row.Text(9));
  job.exit_code = static_cast<int>(row.Int(10));
  job.reason = row.Text(11);
  job.sweep_id = row.Int(16);
  return job;
}

// Version 1 -> 2: jobs.sweep_id and its index. Idempotent; run on every
// open, after kSchema (which makes new files with the column already).
absl::Status AddSweepColumn(Database* db) {
  ASSIGN_OR_RETURN(Statement * columns,
                   db->Prepare("SELECT 1 FROM pragma_table_info('jobs') "
                               "WHERE name='sweep_id'"));
  ASSIGN_OR_RETURN(bool present, columns->Step());
  columns->Reset();
  if (!present) {
    RETURN_IF_ERROR(db->Exec(
        "ALTER TABLE jobs ADD COLUMN sweep_id INTEGER NOT NULL DEFAULT 0"));
  }
  return db->Exec("CREATE INDEX IF NOT EXISTS jobs_by_sweep ON jobs(sweep_id)");
}

// outputs.symlink: a symlink output's target, kept as text (sha256 empty).
// Added by the migration to version 3 (a file made before has none).
// Idempotent.
absl::Status AddOutputSymlinkColumn(Database* db) {
  ASSIGN_OR_RETURN(Statement * columns,
                   db->Prepare("SELECT 1 FROM pragma_table_info('outputs') "
                               "WHERE name='symlink'"));
  ASSIGN_OR_RETURN(bool present, columns->Step());
  columns->Reset();
  if (present) return absl::OkStatus();
  return db->Exec(
      "ALTER TABLE outputs ADD COLUMN symlink TEXT NOT NULL DEFAULT ''");
}

// Calls fn(id, message) for each row of `sql`, which selects an id and a
// serialized Message; rows that do not parse are skipped.
template <typename Message, typename Fn>
absl::Status ForEachStoredMessage(Database* db, const char* sql, Fn fn) {
  ASSIGN_OR_RETURN(Statement * rows, db->Prepare(sql));
  return rows->ForEachRow([&] {
    Message message;
    absl::string_view blob = rows->Blob(1);
    if (message.ParseFromArray(blob.data(), static_cast<int>(blob.size())))
      fn(rows->Int(0), message);
  });
}

// Version 2 -> 3: job_blobs from what the jobs hold already (attachments
// in specs, outputs, checkpoints). Idempotent.
absl::Status FillJobBlobs(Database* db) {
  RETURN_IF_ERROR(
      db->Exec("INSERT OR IGNORE INTO job_blobs(sha256, job_id) "
               "SELECT sha256, job_id FROM outputs WHERE sha256 != ''"));
  RETURN_IF_ERROR(
      db->Exec("CREATE INDEX IF NOT EXISTS jobs_by_end ON jobs(end_ms)"));
  ASSIGN_OR_RETURN(Statement * hold,
                   db->Prepare("INSERT OR IGNORE INTO job_blobs(sha256, "
                               "job_id) VALUES(?,?)"));
  std::vector<std::pair<std::string, int64_t>> held;
  RETURN_IF_ERROR(ForEachStoredMessage<v1::JobSpec>(
      db, "SELECT id, spec FROM jobs",
      [&](int64_t job, const v1::JobSpec& spec) {
        for (const auto& a : spec.attach()) held.emplace_back(a.sha256(), job);
      }));
  RETURN_IF_ERROR(ForEachStoredMessage<v1::CheckpointStored>(
      db,
      "SELECT job_id, checkpoint FROM train_state WHERE checkpoint IS NOT NULL",
      [&](int64_t job, const v1::CheckpointStored& checkpoint) {
        for (const auto& f : checkpoint.files())
          held.emplace_back(f.sha256(), job);
      }));
  for (const auto& [sha, job] : held) {
    if (sha.empty()) continue;
    hold->Reset();
    RETURN_IF_ERROR(hold->Bind(1, sha).Bind(2, job).Run());
  }
  return absl::OkStatus();
}

// Version 3 -> 4: per-user limits (kNoLimit: -1) and each user's usage of
// ended jobs (slot-ms decayed as of at_ms). Idempotent; new files get the
// tables here too.
absl::Status AddUserLimitsAndUsage(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS user_limits(
  user TEXT NOT NULL,
  profile TEXT NOT NULL,
  max_slots INTEGER NOT NULL,
  max_queued INTEGER NOT NULL,
  PRIMARY KEY(user, profile));
CREATE TABLE IF NOT EXISTS user_usage(
  user TEXT PRIMARY KEY,
  slot_ms INTEGER NOT NULL,
  at_ms INTEGER NOT NULL);
)sql");
}

// Version 9: request ids move to job_requests, keyed by user (one
// user's id is not another's request) and kept with the digest of what the
// submit asked for; jobs.request_id, UNIQUE across users, is written NULL
// from then on (older rows keep theirs, read no more). Requests stored before
// keep an empty digest. Idempotent.
absl::Status AddJobRequests(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS job_requests(
  user TEXT NOT NULL,
  request_id TEXT NOT NULL,
  job_id INTEGER NOT NULL,
  request_sha256 TEXT NOT NULL,
  PRIMARY KEY(user, request_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_requests_by_job ON job_requests(job_id);
INSERT OR IGNORE INTO job_requests(user, request_id, job_id, request_sha256)
  SELECT user, request_id, id, '' FROM jobs WHERE request_id IS NOT NULL;
)sql");
}

}  // namespace

std::string EncodeParts(const std::vector<Part>& parts) {
  return absl::StrJoin(parts, ";", [](std::string* out, const Part& p) {
    absl::StrAppend(out, p.worker, ":", absl::StrJoin(p.devices, ","));
  });
}

std::vector<Part> DecodeParts(absl::string_view text) {
  std::vector<Part> parts;
  if (text.empty()) return parts;
  for (absl::string_view piece : absl::StrSplit(text, ';')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(piece, absl::MaxSplits(':', 1));
    Part part;
    if (!absl::SimpleAtoi(kv.first, &part.worker)) continue;
    for (absl::string_view d :
         absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
      int index;
      if (absl::SimpleAtoi(d, &index)) part.devices.push_back(index);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path,
                                                   bool sync_full) {
  ASSIGN_OR_RETURN(auto db,
                   Database::Open(path, /*read_only=*/false, sync_full));
  // The version is checked before the schema is applied: a file of another
  // version may hold tables this one's statements fail on or would alter.
  RETURN_IF_ERROR(
      db->Exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value "
               "TEXT NOT NULL)"));
  ASSIGN_OR_RETURN(Statement * get,
                   db->Prepare("SELECT value FROM meta WHERE key='schema'"));
  ASSIGN_OR_RETURN(bool found, get->Step());
  if (found) {
    int version = 0;
    if (!absl::SimpleAtoi(get->Text(0), &version) || version < 1 ||
        version > kSchemaVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " has schema version ", get->Text(0),
                       "; this scheduler reads version ", kSchemaVersion));
    }
  }
  const bool current = found && get->Text(0) == std::to_string(kSchemaVersion);
  get->Reset();
  // A current file is opened without writing, so a scheduler whose disk is
  // full still starts (and serves reads).
  if (!current) {
    // One transaction: a crash mid-migration leaves the old version whole.
    Transaction txn(db.get());
    RETURN_IF_ERROR(txn.status());
    RETURN_IF_ERROR(db->Exec(kSchema));
    RETURN_IF_ERROR(AddSweepColumn(db.get()));
    RETURN_IF_ERROR(AddOutputSymlinkColumn(db.get()));
    RETURN_IF_ERROR(FillJobBlobs(db.get()));
    RETURN_IF_ERROR(AddUserLimitsAndUsage(db.get()));
    RETURN_IF_ERROR(AddControlTables(db.get()));
    RETURN_IF_ERROR(AddSlurmTable(db.get()));
    RETURN_IF_ERROR(AddJobRequests(db.get()));
    RETURN_IF_ERROR(AddDiaryLineColumns(db.get()));
    RETURN_IF_ERROR(db->Exec(absl::StrCat(
        "INSERT INTO meta(key, value) VALUES('schema', '", kSchemaVersion,
        "') ON CONFLICT(key) DO UPDATE SET value=excluded.value")));
    RETURN_IF_ERROR(txn.Commit());
  }
  auto store = std::unique_ptr<Store>(new Store(std::move(db)));
  ASSIGN_OR_RETURN(Statement * last,
                   store->db_->Prepare("SELECT MAX(ev) FROM job_events"));
  ASSIGN_OR_RETURN(bool row, last->Step());
  store->last_event_ = row ? last->Int(0) : 0;
  last->Reset();
  // Commits are made under the scheduler's lock: checkpoints, which take
  // tens of milliseconds, run beside them instead of inside them.
  RETURN_IF_ERROR(store->db_->CheckpointInBackground());
  return store;
}

absl::Status Store::PutCredential(const CredentialRecord& record) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO credentials(name, worker, admin, "
                   "token_sha256, created_ms) VALUES(?,?,?,?,?) "
                   "ON CONFLICT(name, worker) DO UPDATE SET "
                   "admin=excluded.admin, token_sha256=excluded.token_sha256, "
                   "created_ms=excluded.created_ms"));
  return st->Bind(1, record.name)
      .Bind(2, record.worker ? 1 : 0)
      .Bind(3, record.admin ? 1 : 0)
      .Bind(4, record.token_sha256)
      .Bind(5, record.created_ms)
      .Run();
}

absl::StatusOr<bool> Store::DeleteCredential(const std::string& name,
                                             bool worker) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("DELETE FROM credentials WHERE name=? AND worker=?"));
  RETURN_IF_ERROR(st->Bind(1, name).Bind(2, worker ? 1 : 0).Run());
  return db_->Changes() > 0;
}

absl::StatusOr<std::vector<CredentialRecord>> Store::Credentials() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT name, worker, admin, token_sha256, "
                                "created_ms FROM credentials "
                                "ORDER BY worker, name"));
  std::vector<CredentialRecord> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    CredentialRecord r;
    r.name = st->Text(0);
    r.worker = st->Int(1) != 0;
    r.admin = st->Int(2) != 0;
    r.token_sha256 = st->Text(3);
    r.created_ms = st->Int(4);
    out.push_back(std::move(r));
  }));
  return out;
}

absl::StatusOr<int64_t> Store::InsertJob(const JobRecord& job) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO jobs(request_id, user, spec, name, profile, pool, "
          "priority, state, attempt, submit_ms, start_ms, end_ms, parts, "
          "exit_code, reason, sweep_id) "
          "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"));
  st->BindNull(1);  // in job_requests since version 9
  st->Bind(2, job.user)
      .BindBlob(3, job.spec.SerializeAsString())
      .Bind(4, job.spec.name())
      .Bind(5, job.spec.profile())
      .Bind(6, job.spec.pool())
      .Bind(7, job.spec.priority())
      .Bind(8, static_cast<int>(job.state))
      .Bind(9, job.attempt)
      .Bind(10, job.submit_ms)
      .Bind(11, job.start_ms)
      .Bind(12, job.end_ms)
      .Bind(13, EncodeParts(job.parts))
      .Bind(14, job.exit_code)
      .Bind(15, job.reason)
      .Bind(16, job.sweep_id);
  RETURN_IF_ERROR(st->Run());
  const int64_t id = db_->LastInsertId();
  if (!job.request_id.empty()) {
    // A request id the user used already: AlreadyExists (the caller's
    // transaction drops the job row with it).
    ASSIGN_OR_RETURN(Statement * request,
                     db_->Prepare("INSERT INTO job_requests(user, request_id, "
                                  "job_id, request_sha256) VALUES(?,?,?,?)"));
    RETURN_IF_ERROR(request->Bind(1, job.user)
                        .Bind(2, job.request_id)
                        .Bind(3, id)
                        .Bind(4, job.request_sha256)
                        .Run());
  }
  for (const auto& a : job.spec.attach())
    RETURN_IF_ERROR(HoldBlob(id, a.sha256()));
  return id;
}

absl::Status Store::HoldBlob(int64_t job_id, const std::string& sha256) {
  if (sha256.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("INSERT OR IGNORE INTO job_blobs(sha256, "
                                "job_id) VALUES(?,?)"));
  return st->Bind(1, sha256).Bind(2, job_id).Run();
}

absl::Status Store::UpdateJob(const JobRecord& job) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("UPDATE jobs SET state=?, attempt=?, start_ms=?, end_ms=?, "
                   "parts=?, exit_code=?, reason=? WHERE id=?"));
  st->Bind(1, static_cast<int>(job.state))
      .Bind(2, job.attempt)
      .Bind(3, job.start_ms)
      .Bind(4, job.end_ms)
      .Bind(5, EncodeParts(job.parts))
      .Bind(6, job.exit_code)
      .Bind(7, job.reason)
      .Bind(8, job.id);
  return st->Run();
}

absl::Status Store::AddEvent(int64_t job_id, v1::JobState state, int attempt,
                             int64_t time_ms, absl::string_view reason) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO job_events(job_id, ev, time_ms, state, "
                   "attempt, reason) VALUES(?,?,?,?,?,?)"));
  st->Bind(1, job_id)
      .Bind(2, ++last_event_)
      .Bind(3, time_ms)
      .Bind(4, static_cast<int>(state))
      .Bind(5, attempt)
      .Bind(6, reason);
  return st->Run();
}

absl::StatusOr<bool> Store::AddDiary(int64_t job_id, int attempt, int part,
                                     int64_t seq, int64_t time_ms, int stream,
                                     absl::string_view text,
                                     v1::DiaryLine::Ending ending) {
  // The job's newest line is found backwards on diary_by_job; it is never
  // deleted (a capped diary keeps its newest line), so numbers only grow.
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT OR IGNORE INTO diary(job_id, attempt, part, "
                   "seq, time_ms, stream, text, ending, line) "
                   "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,"
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
  RETURN_IF_ERROR(st->Run());
  return db_->Changes() > 0;
}

absl::Status Store::PutOutputs(int64_t job_id,
                               const std::vector<v1::OutputFile>& files) {
  ASSIGN_OR_RETURN(Statement * del,
                   db_->Prepare("DELETE FROM outputs WHERE job_id=?"));
  RETURN_IF_ERROR(del->Bind(1, job_id).Run());
  for (const auto& f : files) {
    ASSIGN_OR_RETURN(
        Statement * st,
        db_->Prepare("INSERT OR REPLACE INTO outputs(job_id, path, size, "
                     "sha256, mode, symlink) VALUES(?,?,?,?,?,?)"));
    st->Bind(1, job_id)
        .Bind(2, f.path())
        .Bind(3, f.size())
        .Bind(4, f.sha256())
        .Bind(5, static_cast<int64_t>(f.mode()))
        .Bind(6, f.symlink());
    RETURN_IF_ERROR(st->Run());
    RETURN_IF_ERROR(HoldBlob(job_id, f.sha256()));
  }
  return absl::OkStatus();
}

absl::Status Store::PutProgress(int64_t job_id,
                                const v1::TrainProgress& progress) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO train_state(job_id, progress) VALUES(?,?) "
          "ON CONFLICT(job_id) DO UPDATE SET progress=excluded.progress"));
  return st->Bind(1, job_id).BindBlob(2, progress.SerializeAsString()).Run();
}

absl::Status Store::PutCheckpoint(int64_t job_id,
                                  const v1::CheckpointStored& checkpoint) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO train_state(job_id, checkpoint) VALUES(?,?) "
                   "ON CONFLICT(job_id) DO UPDATE SET "
                   "checkpoint=excluded.checkpoint"));
  RETURN_IF_ERROR(
      st->Bind(1, job_id).BindBlob(2, checkpoint.SerializeAsString()).Run());
  for (const auto& f : checkpoint.files())
    RETURN_IF_ERROR(HoldBlob(job_id, f.sha256()));
  return absl::OkStatus();
}

static absl::StatusOr<TrainState> ReadTrainState(Database* db, int64_t job_id) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare(
          "SELECT progress, checkpoint FROM train_state WHERE job_id=?"));
  st->Bind(1, job_id);
  TrainState state;
  absl::StatusOr<bool> row = st->Step();
  if (row.ok() && *row) {
    absl::string_view p = st->Blob(0), c = st->Blob(1);
    if (!state.progress.ParseFromArray(p.data(), static_cast<int>(p.size())) ||
        !state.checkpoint.ParseFromArray(c.data(),
                                         static_cast<int>(c.size()))) {
      st->Reset();
      return absl::DataLossError(
          absl::StrCat("job ", job_id, ": stored progress is corrupt"));
    }
  }
  st->Reset();
  if (!row.ok()) return row.status();
  return state;
}

absl::StatusOr<TrainState> Store::GetTrainState(int64_t job_id) {
  return ReadTrainState(db_.get(), job_id);
}

absl::StatusOr<int64_t> Store::UpsertWorker(const WorkerRecord& worker) {
  v1::WorkerInfo devices;  // only its devices are serialised
  for (const auto& d : worker.devices) *devices.add_devices() = d;
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO workers(name, host, profile, devices, last_seen_ms) "
          "VALUES(?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
          "host=excluded.host, profile=excluded.profile, "
          "devices=excluded.devices, last_seen_ms=excluded.last_seen_ms"));
  st->Bind(1, worker.name)
      .Bind(2, worker.host)
      .Bind(3, worker.profile)
      .BindBlob(4, devices.SerializeAsString())
      .Bind(5, worker.last_seen_ms);
  RETURN_IF_ERROR(st->Run());
  ASSIGN_OR_RETURN(Statement * get,
                   db_->Prepare("SELECT id FROM workers WHERE name=?"));
  ASSIGN_OR_RETURN(bool found, get->Bind(1, worker.name).Step());
  if (!found) return absl::InternalError("worker vanished after upsert");
  int64_t id = get->Int(0);
  get->Reset();
  return id;
}

absl::Status Store::UpsertProfile(const std::string& name, int max_pool) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO profiles(name, max_pool) VALUES(?,?) "
          "ON CONFLICT(name) DO UPDATE SET max_pool=excluded.max_pool"));
  return st->Bind(1, name).Bind(2, max_pool).Run();
}

absl::StatusOr<std::optional<Store::RequestMatch>> Store::JobForRequest(
    const std::string& user, const std::string& request_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT job_id, request_sha256 FROM "
                                "job_requests WHERE user=? AND request_id=?"));
  ASSIGN_OR_RETURN(bool found, st->Bind(1, user).Bind(2, request_id).Step());
  std::optional<RequestMatch> match;
  if (found) match = RequestMatch{st->Int(0), st->Text(1)};
  st->Reset();
  return match;
}

absl::StatusOr<std::optional<v1::JobState>> Store::JobState(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT state FROM jobs WHERE id=?"));
  ASSIGN_OR_RETURN(bool found, st->Bind(1, job_id).Step());
  std::optional<v1::JobState> state;
  if (found) state = static_cast<v1::JobState>(st->Int(0));
  st->Reset();
  return state;
}

absl::StatusOr<std::optional<DiaryCut>> Store::GetDiaryCut(int64_t job_id) {
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

absl::Status Store::PutDiaryCut(int64_t job_id, const DiaryCut& cut) {
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

absl::StatusOr<int64_t> Store::DiaryBytes(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT TOTAL(LENGTH(CAST(text AS BLOB))) "
                                "FROM diary WHERE job_id=?"));
  ASSIGN_OR_RETURN(bool row, st->Bind(1, job_id).Step());
  int64_t bytes = row ? st->Int(0) : 0;
  st->Reset();
  return bytes;
}

absl::StatusOr<std::vector<std::tuple<int, int, int64_t>>> Store::DiaryLastSeqs(
    int64_t job_id, int64_t after) {
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

absl::StatusOr<std::pair<int64_t, int64_t>> Store::TrimDiary(int64_t job_id,
                                                             int64_t after,
                                                             int64_t bytes) {
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

absl::Status Store::SetDiaryText(int64_t n, absl::string_view text) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("UPDATE diary SET text=? WHERE n=?"));
  return st->BindBlob(1, text).Bind(2, n).Run();
}

absl::StatusOr<std::vector<int64_t>> Store::EndedBefore(int64_t before_ms,
                                                        int limit) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT id FROM jobs WHERE end_ms > 0 AND end_ms < ? AND "
                   "state IN (4,5,6) ORDER BY end_ms LIMIT ?"));
  st->Bind(1, before_ms).Bind(2, limit);
  std::vector<int64_t> ids;
  RETURN_IF_ERROR(st->ForEachRow([&] { ids.push_back(st->Int(0)); }));
  return ids;
}

absl::StatusOr<PurgeCounts> Store::PurgeJobs(const std::vector<int64_t>& ids) {
  static constexpr const char* kDeletes[] = {
      "DELETE FROM job_blobs WHERE job_id=?",
      "DELETE FROM diary WHERE job_id=?",
      "DELETE FROM job_events WHERE job_id=?",
      "DELETE FROM outputs WHERE job_id=?",
      "DELETE FROM train_state WHERE job_id=?",
      "DELETE FROM diary_cuts WHERE job_id=?",
      "DELETE FROM job_control WHERE job_id=?",
      "DELETE FROM slurm_jobs WHERE job_id=?",
      "DELETE FROM part_ends WHERE job_id=?",
      "DELETE FROM slurm_resubmits WHERE job_id=?",
      "DELETE FROM job_requests WHERE job_id=?",
      "DELETE FROM jobs WHERE id=?",
  };
  PurgeCounts counts;
  std::set<std::string> held;
  for (int64_t id : ids) {
    ASSIGN_OR_RETURN(std::optional<v1::JobState> state, JobState(id));
    if (!state ||
        (*state != v1::JOB_STATE_FINISHED && *state != v1::JOB_STATE_FAILED &&
         *state != v1::JOB_STATE_CANCELLED)) {
      continue;
    }
    ASSIGN_OR_RETURN(Statement * blobs,
                     db_->Prepare("SELECT sha256 FROM job_blobs WHERE "
                                  "job_id=?"));
    blobs->Bind(1, id);
    RETURN_IF_ERROR(blobs->ForEachRow([&] { held.insert(blobs->Text(0)); }));
    for (const char* sql : kDeletes) {
      ASSIGN_OR_RETURN(Statement * del, db_->Prepare(sql));
      RETURN_IF_ERROR(del->Bind(1, id).Run());
    }
    ++counts.jobs;
  }
  ASSIGN_OR_RETURN(
      Statement * still,
      db_->Prepare("SELECT 1 FROM job_blobs WHERE sha256=? LIMIT 1"));
  for (const std::string& sha : held) {
    still->Reset();
    ASSIGN_OR_RETURN(bool row, still->Bind(1, sha).Step());
    if (!row) counts.unreferenced_blobs.push_back(sha);
  }
  still->Reset();
  return counts;
}

absl::StatusOr<std::vector<JobRecord>> Store::ActiveJobs() {
  static const std::string sql = absl::StrCat(
      "SELECT ", kJobColumns, " FROM jobs WHERE state IN (1,2,3) ORDER BY id");
  ASSIGN_OR_RETURN(Statement * st, db_->Prepare(sql.c_str()));
  std::vector<JobRecord> jobs;
  RETURN_IF_ERROR(st->ForEachRow([&]() -> absl::Status {
    ASSIGN_OR_RETURN(JobRecord job, ReadJobRow(*st, /*with_spec=*/true));
    jobs.push_back(std::move(job));
    return absl::OkStatus();
  }));
  return jobs;
}

absl::StatusOr<std::vector<WorkerRecord>> Store::Workers() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT id, name, host, profile, devices, last_seen_ms "
                   "FROM workers ORDER BY id"));
  std::vector<WorkerRecord> workers;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    WorkerRecord w;
    w.id = st->Int(0);
    w.name = st->Text(1);
    w.host = st->Text(2);
    w.profile = st->Text(3);
    v1::WorkerInfo devices;
    absl::string_view blob = st->Blob(4);
    devices.ParseFromArray(blob.data(), static_cast<int>(blob.size()));
    w.devices.assign(devices.devices().begin(), devices.devices().end());
    w.last_seen_ms = st->Int(5);
    workers.push_back(std::move(w));
  }));
  return workers;
}

absl::StatusOr<std::vector<std::pair<std::string, int>>> Store::Profiles() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT name, max_pool FROM profiles ORDER BY name"));
  std::vector<std::pair<std::string, int>> out;
  RETURN_IF_ERROR(st->ForEachRow(
      [&] { out.emplace_back(st->Text(0), static_cast<int>(st->Int(1))); }));
  return out;
}

absl::Status Store::PutUserLimit(const LimitEntry& entry) {
  if (entry.limit == UserLimit{}) {
    ASSIGN_OR_RETURN(
        Statement * del,
        db_->Prepare("DELETE FROM user_limits WHERE user=? AND profile=?"));
    return del->Bind(1, entry.user).Bind(2, entry.profile).Run();
  }
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO user_limits(user, profile, max_slots, "
                   "max_queued) VALUES(?,?,?,?) ON CONFLICT(user, profile) "
                   "DO UPDATE SET max_slots=excluded.max_slots, "
                   "max_queued=excluded.max_queued"));
  return st->Bind(1, entry.user)
      .Bind(2, entry.profile)
      .Bind(3, entry.limit.max_slots)
      .Bind(4, entry.limit.max_queued)
      .Run();
}

absl::StatusOr<std::vector<LimitEntry>> Store::UserLimits() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT user, profile, max_slots, max_queued "
                                "FROM user_limits ORDER BY profile, user"));
  std::vector<LimitEntry> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    LimitEntry e;
    e.user = st->Text(0);
    e.profile = st->Text(1);
    e.limit.max_slots = static_cast<int>(st->Int(2));
    e.limit.max_queued = static_cast<int>(st->Int(3));
    out.push_back(std::move(e));
  }));
  return out;
}

absl::Status Store::PutUsage(const StoredUsage& usage) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO user_usage(user, slot_ms, at_ms) VALUES(?,?,?) "
                   "ON CONFLICT(user) DO UPDATE SET slot_ms=excluded.slot_ms, "
                   "at_ms=excluded.at_ms"));
  return st->Bind(1, usage.user)
      .Bind(2, usage.slot_ms)
      .Bind(3, usage.at_ms)
      .Run();
}

absl::StatusOr<std::vector<StoredUsage>> Store::Usages() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "SELECT user, slot_ms, at_ms FROM user_usage ORDER BY user"));
  std::vector<StoredUsage> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    out.push_back({st->Text(0), st->Int(1), st->Int(2)});
  }));
  return out;
}

namespace {

// Jobs by (profile, state), on any connection to the store.
absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
CountJobsOn(Database* db) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT profile, state, COUNT(*) FROM jobs GROUP BY 1, 2"));
  std::map<std::pair<std::string, v1::JobState>, int64_t> counts;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    counts[{st->Text(0), static_cast<v1::JobState>(st->Int(1))}] = st->Int(2);
  }));
  return counts;
}

}  // namespace

int64_t StoreFileBytes(const std::string& db_path) {
  int64_t total = 0;
  for (const char* suffix : {"", "-wal"}) {
    struct stat st;
    if (::stat((db_path + suffix).c_str(), &st) == 0) total += st.st_size;
  }
  return total;
}

absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
Store::CountJobsByState() {
  return CountJobsOn(db_.get());
}

absl::StatusOr<int64_t> Store::CountJobs() {
  ASSIGN_OR_RETURN(Statement * st, db_->Prepare("SELECT COUNT(*) FROM jobs"));
  ASSIGN_OR_RETURN(bool row, st->Step());
  int64_t n = row ? st->Int(0) : 0;
  st->Reset();
  return n;
}

absl::StatusOr<int64_t> Store::NextSweepId() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT MAX(sweep_id) FROM jobs"));
  ASSIGN_OR_RETURN(bool row, st->Step());
  int64_t last = row && !st->IsNull(0) ? st->Int(0) : 0;
  st->Reset();
  return last + 1;
}

absl::StatusOr<int64_t> Store::SweepIdOf(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT sweep_id FROM jobs WHERE id=?"));
  ASSIGN_OR_RETURN(bool row, st->Bind(1, job_id).Step());
  int64_t sweep = row ? st->Int(0) : 0;
  st->Reset();
  return sweep;
}

absl::StatusOr<std::vector<int64_t>> Store::SweepJobIds(int64_t sweep_id) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT id FROM jobs WHERE sweep_id=? ORDER BY id"));
  st->Bind(1, sweep_id);
  std::vector<int64_t> ids;
  RETURN_IF_ERROR(st->ForEachRow([&] { ids.push_back(st->Int(0)); }));
  return ids;
}

// ---- StoreReader ----

absl::StatusOr<std::unique_ptr<Database>> StoreReader::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto db = std::move(idle_.back());
      idle_.pop_back();
      return db;
    }
  }
  return Database::Open(path_, /*read_only=*/true, /*sync_full=*/false);
}

void StoreReader::Release(std::unique_ptr<Database> db) {
  std::lock_guard<std::mutex> lock(mu_);
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
  // The spec (for sweep_point) only for one sweep's jobs: at most
  // kMaxSweepJobs rows, where a listing of every job stays lean.
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

absl::StatusOr<std::vector<v1::DiaryLine>> StoreReader::ReadDiary(
    int64_t job_id, int64_t after, int limit) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT n, time_ms, stream, text, attempt, seq, line, "
                  "ending FROM diary WHERE job_id=? AND n>? ORDER BY n "
                  "LIMIT ?"));
  st->Bind(1, job_id).Bind(2, after).Bind(3, limit);
  std::vector<v1::DiaryLine> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
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
    out.push_back(std::move(line));
  }));
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

absl::StatusOr<int64_t> StoreReader::DiaryTailStart(int64_t job_id,
                                                    int64_t tail) {
  // Walks the (job_id, n) index backwards past `tail` lines.
  return FirstInt(
      "SELECT n FROM diary WHERE job_id=? ORDER BY n DESC LIMIT 1 OFFSET ?",
      {job_id, tail});
}

absl::StatusOr<TrainState> StoreReader::GetTrainState(int64_t job_id) {
  ASSIGN_OR_RETURN(auto raw, Acquire());
  Lease db(this, std::move(raw));
  return ReadTrainState(db.get(), job_id);
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
