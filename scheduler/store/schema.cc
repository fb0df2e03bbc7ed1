// The store's schema (kSchema, for a new file) and the migrations from
// each older version, all run on every open of a file that is not current.
#include "scheduler/store/schema.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::scheduler {
namespace {

// Version 2 added jobs.sweep_id; version 3 diary_cuts, job_blobs and
// jobs_by_end; version 4 user_limits and user_usage; version 5
// credentials; version 6 worker_drains and job_control; version 7
// slurm_jobs; version 8 part_ends and slurm_resubmits; version 9
// job_requests (request ids per user, with the digest of what each asked
// for); version 10 diary.line and diary.ending; version 11 preemptions
// (each job's preemptions, a v1.Preemption per row); version 12 diary.rank
// (the global rank of the process that wrote a line); version 13
// job_checkpoints (the stored checkpoints kept of each job's parts);
// version 14 progress_history (each job's progress reports, thinned) and
// the indexes the web face's sorted job pages use; version 15 the
// indexes that cover each (filter, sort) pair of a page of jobs. Older
// files are migrated on open.
constexpr int kSchemaVersion = 15;

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
  ending INTEGER NOT NULL DEFAULT 0,
  rank INTEGER);
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

// Version 5 -> 6: worker_drains and job_control. Idempotent.
absl::Status AddControlTables(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS worker_drains(
  name TEXT PRIMARY KEY,
  reason TEXT NOT NULL,
  since_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS job_control(
  job_id INTEGER PRIMARY KEY,
  held INTEGER NOT NULL,
  after TEXT NOT NULL,
  requeue INTEGER NOT NULL);
)sql");
}

// Version 6 -> 7: slurm_jobs; version 7 -> 8: part_ends and
// slurm_resubmits (new files get them here too). Idempotent.
absl::Status AddSlurmTable(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS slurm_jobs(
  job_id INTEGER PRIMARY KEY,
  attempt INTEGER NOT NULL,
  slurm_id INTEGER NOT NULL,
  profile TEXT NOT NULL,
  submitted_ms INTEGER NOT NULL,
  token_sha256 TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS part_ends(
  job_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  part INTEGER NOT NULL,
  exit_code INTEGER NOT NULL,
  failure TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt, part)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS slurm_resubmits(
  job_id INTEGER PRIMARY KEY,
  count INTEGER NOT NULL);
)sql");
}

// Version 9 -> 10: diary.line (each line's number in its job's diary, filled
// in for the lines already stored) and diary.ending. Idempotent.
absl::Status AddDiaryLineColumns(Database* db) {
  ASSIGN_OR_RETURN(Statement * columns,
                   db->Prepare("SELECT 1 FROM pragma_table_info('diary') "
                               "WHERE name='line'"));
  ASSIGN_OR_RETURN(bool present, columns->Step());
  columns->Reset();
  if (present) return absl::OkStatus();
  // Lines stored before had their newline dropped (ending 0 says so) and no
  // number: they are numbered in their order, once, in the migration's
  // transaction (one pass over the table, however many jobs it holds).
  return db->Exec(R"sql(
ALTER TABLE diary ADD COLUMN line INTEGER;
ALTER TABLE diary ADD COLUMN ending INTEGER NOT NULL DEFAULT 0;
UPDATE diary SET line = numbered.line
  FROM (SELECT n, ROW_NUMBER() OVER (PARTITION BY job_id ORDER BY n) AS line
        FROM diary) AS numbered
  WHERE diary.n = numbered.n;
)sql");
}

// Version 10 -> 11: preemptions. Idempotent.
absl::Status AddPreemptionsTable(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS preemptions(
  job_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  record BLOB NOT NULL,
  PRIMARY KEY(job_id, seq)) WITHOUT ROWID;
)sql");
}

// Version 11 -> 12: diary.rank, NULL for dlbatch's own lines (stream 0).
// Lines stored before came from one process per part, so each takes its
// part's number (exact for command jobs and for every part 0; a train job's
// later parts are labelled since with their first rank instead).
// Idempotent.
absl::Status AddDiaryRankColumn(Database* db) {
  ASSIGN_OR_RETURN(Statement * columns,
                   db->Prepare("SELECT 1 FROM pragma_table_info('diary') "
                               "WHERE name='rank'"));
  ASSIGN_OR_RETURN(bool present, columns->Step());
  columns->Reset();
  if (present) return absl::OkStatus();
  return db->Exec(R"sql(
ALTER TABLE diary ADD COLUMN rank INTEGER;
UPDATE diary SET rank = part WHERE stream != 0;
)sql");
}

// Version 12 -> 13: job_checkpoints, a v1.CheckpointStored per row: the
// newest few of each part (train_state.checkpoint stays the one a resume
// uses). A file made before kept one checkpoint per job, in train_state: it
// becomes the job's first kept row (its blobs are held already).
// Idempotent.
absl::Status AddCheckpointsTable(Database* db) {
  RETURN_IF_ERROR(db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS job_checkpoints(
  job_id INTEGER NOT NULL,
  part INTEGER NOT NULL,
  iteration INTEGER NOT NULL,
  record BLOB NOT NULL,
  PRIMARY KEY(job_id, part, iteration)) WITHOUT ROWID;
)sql"));
  std::vector<std::pair<int64_t, v1::CheckpointStored>> stored;
  RETURN_IF_ERROR(ForEachStoredMessage<v1::CheckpointStored>(
      db,
      "SELECT job_id, checkpoint FROM train_state WHERE checkpoint IS NOT NULL",
      [&](int64_t job, const v1::CheckpointStored& checkpoint) {
        if (checkpoint.files_size() > 0) stored.emplace_back(job, checkpoint);
      }));
  ASSIGN_OR_RETURN(
      Statement * put,
      db->Prepare("INSERT OR IGNORE INTO job_checkpoints(job_id, part, "
                  "iteration, record) VALUES(?,?,?,?)"));
  for (const auto& [job, checkpoint] : stored) {
    put->Reset();
    RETURN_IF_ERROR(put->Bind(1, job)
                        .Bind(2, checkpoint.part())
                        .Bind(3, checkpoint.iteration())
                        .BindBlob(4, checkpoint.SerializeAsString())
                        .Run());
  }
  return absl::OkStatus();
}

// Version 13 -> 14: progress_history, each committed progress report of a
// job under an increasing seq (thinned by JobTables::AppendProgress), and
// an index per column a page of jobs sorts or filters by, each ending in
// id (the tie-break), so that a page of 100 among 100,000 jobs reads about
// 100 rows; and diary lines by their number in the job's diary (a range of
// a 1,000,000-line diary is found without a scan). Idempotent.
absl::Status AddProgressHistoryAndJobIndexes(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS progress_history(
  job_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  progress BLOB NOT NULL,
  PRIMARY KEY(job_id, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, id);
CREATE INDEX IF NOT EXISTS jobs_by_user ON jobs(user, id);
CREATE INDEX IF NOT EXISTS jobs_by_name ON jobs(name, id);
CREATE INDEX IF NOT EXISTS jobs_by_submit ON jobs(submit_ms, id);
CREATE INDEX IF NOT EXISTS jobs_by_priority ON jobs(priority, id);
CREATE INDEX IF NOT EXISTS diary_by_job_line ON diary(job_id, line);
)sql");
}

// Version 14 -> 15: a page of jobs first picks its ids on one index that
// holds every column its filter and sort read (JobListingSql), so that an
// offset of 90,000 skips 90,000 index entries of a few bytes instead of
// whole rows. jobs_by_id: the id order (the rowid table's rows hold the
// spec); (state, column, id) and (user, column, id): each sort within the
// state and user filters. The columns a job never changes (user, name,
// submit_ms, priority) cost only at submit; state is updated in each of
// the state indexes. diary_by_rank: a rank's lines counted on an index, not
// by reading each line's row. Idempotent.
absl::Status AddJobPageIndexes(Database* db) {
  return db->Exec(R"sql(
CREATE INDEX IF NOT EXISTS jobs_by_id ON jobs(id);
CREATE INDEX IF NOT EXISTS jobs_by_state_name ON jobs(state, name, id);
CREATE INDEX IF NOT EXISTS jobs_by_state_submit ON jobs(state, submit_ms, id);
CREATE INDEX IF NOT EXISTS jobs_by_state_priority ON jobs(state, priority, id);
CREATE INDEX IF NOT EXISTS jobs_by_state_user ON jobs(state, user, id);
CREATE INDEX IF NOT EXISTS jobs_by_user_name ON jobs(user, name, id);
CREATE INDEX IF NOT EXISTS jobs_by_user_submit ON jobs(user, submit_ms, id);
CREATE INDEX IF NOT EXISTS jobs_by_user_priority ON jobs(user, priority, id);
CREATE INDEX IF NOT EXISTS jobs_by_user_state ON jobs(user, state, id);
CREATE INDEX IF NOT EXISTS diary_by_rank ON diary(job_id, rank);
)sql");
}

}  // namespace

absl::Status MigrateSchema(Database* db, const std::string& path) {
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
    Transaction txn(db);
    RETURN_IF_ERROR(txn.status());
    RETURN_IF_ERROR(db->Exec(kSchema));
    RETURN_IF_ERROR(AddSweepColumn(db));
    RETURN_IF_ERROR(AddOutputSymlinkColumn(db));
    RETURN_IF_ERROR(FillJobBlobs(db));
    RETURN_IF_ERROR(AddUserLimitsAndUsage(db));
    RETURN_IF_ERROR(AddControlTables(db));
    RETURN_IF_ERROR(AddSlurmTable(db));
    RETURN_IF_ERROR(AddJobRequests(db));
    RETURN_IF_ERROR(AddDiaryLineColumns(db));
    RETURN_IF_ERROR(AddPreemptionsTable(db));
    RETURN_IF_ERROR(AddDiaryRankColumn(db));
    RETURN_IF_ERROR(AddCheckpointsTable(db));
    RETURN_IF_ERROR(AddProgressHistoryAndJobIndexes(db));
    RETURN_IF_ERROR(AddJobPageIndexes(db));
    RETURN_IF_ERROR(db->Exec(absl::StrCat(
        "INSERT INTO meta(key, value) VALUES('schema', '", kSchemaVersion,
        "') ON CONFLICT(key) DO UPDATE SET value=excluded.value")));
    RETURN_IF_ERROR(txn.Commit());
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler
