#include "scheduler/store/job_tables.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "scheduler/store/job_rows.h"

namespace dlbatch::scheduler {

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

absl::StatusOr<int64_t> JobTables::InsertJob(const JobRecord& job) {
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

absl::Status JobTables::HoldBlob(int64_t job_id, const std::string& sha256) {
  if (sha256.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("INSERT OR IGNORE INTO job_blobs(sha256, "
                                "job_id) VALUES(?,?)"));
  return st->Bind(1, sha256).Bind(2, job_id).Run();
}

absl::Status JobTables::UpdateJob(const JobRecord& job) {
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

absl::Status JobTables::AddEvent(int64_t job_id, v1::JobState state,
                                 int attempt, int64_t time_ms,
                                 absl::string_view reason) {
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

absl::Status JobTables::PutOutputs(int64_t job_id,
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

absl::Status JobTables::PutProgress(int64_t job_id,
                                    const v1::TrainProgress& progress) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO train_state(job_id, progress) VALUES(?,?) "
          "ON CONFLICT(job_id) DO UPDATE SET progress=excluded.progress"));
  return st->Bind(1, job_id).BindBlob(2, progress.SerializeAsString()).Run();
}

absl::Status JobTables::PutCheckpoint(int64_t job_id,
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

absl::StatusOr<TrainState> JobTables::GetTrainState(int64_t job_id) {
  return ReadTrainState(db_, job_id);
}

absl::Status JobTables::PutKeptCheckpoint(
    int64_t job_id, const v1::CheckpointStored& checkpoint) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO job_checkpoints(job_id, part, iteration, "
                   "record) VALUES(?,?,?,?) ON CONFLICT(job_id, part, "
                   "iteration) DO UPDATE SET record=excluded.record"));
  RETURN_IF_ERROR(st->Bind(1, job_id)
                      .Bind(2, checkpoint.part())
                      .Bind(3, checkpoint.iteration())
                      .BindBlob(4, checkpoint.SerializeAsString())
                      .Run());
  for (const auto& f : checkpoint.files())
    RETURN_IF_ERROR(HoldBlob(job_id, f.sha256()));
  return absl::OkStatus();
}

absl::Status JobTables::DeleteKeptCheckpoint(int64_t job_id, int part,
                                             int64_t iteration) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM job_checkpoints WHERE job_id=? "
                                "AND part=? AND iteration=?"));
  return st->Bind(1, job_id).Bind(2, part).Bind(3, iteration).Run();
}

absl::StatusOr<std::vector<v1::CheckpointStored>> JobTables::KeptCheckpoints(
    int64_t job_id) {
  return ReadKeptCheckpoints(db_, job_id);
}

absl::StatusOr<std::optional<JobTables::RequestMatch>> JobTables::JobForRequest(
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

absl::StatusOr<std::optional<v1::JobState>> JobTables::JobState(
    int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT state FROM jobs WHERE id=?"));
  ASSIGN_OR_RETURN(bool found, st->Bind(1, job_id).Step());
  std::optional<v1::JobState> state;
  if (found) state = static_cast<v1::JobState>(st->Int(0));
  st->Reset();
  return state;
}

absl::StatusOr<std::vector<int64_t>> JobTables::EndedBefore(int64_t before_ms,
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

absl::StatusOr<PurgeCounts> JobTables::PurgeJobs(
    const std::vector<int64_t>& ids) {
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
      "DELETE FROM preemptions WHERE job_id=?",
      "DELETE FROM job_checkpoints WHERE job_id=?",
      "DELETE FROM progress_history WHERE job_id=?",
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

absl::StatusOr<std::vector<JobRecord>> JobTables::ActiveJobs() {
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

absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
JobTables::CountJobsByState() {
  return CountJobsOn(db_);
}

absl::StatusOr<int64_t> JobTables::CountJobs() {
  ASSIGN_OR_RETURN(Statement * st, db_->Prepare("SELECT COUNT(*) FROM jobs"));
  ASSIGN_OR_RETURN(bool row, st->Step());
  int64_t n = row ? st->Int(0) : 0;
  st->Reset();
  return n;
}

absl::StatusOr<int64_t> JobTables::NextSweepId() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT MAX(sweep_id) FROM jobs"));
  ASSIGN_OR_RETURN(bool row, st->Step());
  int64_t last = row && !st->IsNull(0) ? st->Int(0) : 0;
  st->Reset();
  return last + 1;
}

absl::StatusOr<int64_t> JobTables::SweepIdOf(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT sweep_id FROM jobs WHERE id=?"));
  ASSIGN_OR_RETURN(bool row, st->Bind(1, job_id).Step());
  int64_t sweep = row ? st->Int(0) : 0;
  st->Reset();
  return sweep;
}

absl::StatusOr<std::vector<int64_t>> JobTables::SweepJobIds(int64_t sweep_id) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT id FROM jobs WHERE sweep_id=? ORDER BY id"));
  st->Bind(1, sweep_id);
  std::vector<int64_t> ids;
  RETURN_IF_ERROR(st->ForEachRow([&] { ids.push_back(st->Int(0)); }));
  return ids;
}

absl::Status JobTables::PutPreemption(int64_t job_id, int seq,
                                      const v1::Preemption& preemption) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO preemptions(job_id, seq, record) "
                   "VALUES(?,?,?) ON CONFLICT(job_id, seq) DO UPDATE SET "
                   "record=excluded.record"));
  return st->Bind(1, job_id)
      .Bind(2, seq)
      .BindBlob(3, preemption.SerializeAsString())
      .Run();
}

absl::StatusOr<std::vector<v1::Preemption>> JobTables::Preemptions(
    int64_t job_id) {
  return ReadPreemptions(db_, job_id);
}

absl::Status JobTables::DeletePreemption(int64_t job_id, int seq) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("DELETE FROM preemptions WHERE job_id=? AND seq=?"));
  return st->Bind(1, job_id).Bind(2, seq).Run();
}

absl::StatusOr<std::map<int64_t, std::vector<v1::Preemption>>>
JobTables::ActivePreemptions() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT p.job_id, p.record FROM preemptions p JOIN jobs "
                   "ON jobs.id = p.job_id WHERE jobs.state IN (?,?,?) "
                   "ORDER BY p.job_id, p.seq"));
  st->Bind(1, static_cast<int64_t>(v1::JOB_STATE_QUEUED))
      .Bind(2, static_cast<int64_t>(v1::JOB_STATE_RUNNING))
      .Bind(3, static_cast<int64_t>(v1::JOB_STATE_CANCELLING));
  std::map<int64_t, std::vector<v1::Preemption>> out;
  int64_t corrupt = 0;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    absl::string_view r = st->Blob(1);
    v1::Preemption p;
    if (!p.ParseFromArray(r.data(), static_cast<int>(r.size()))) {
      corrupt = st->Int(0);
      return;
    }
    out[st->Int(0)].push_back(std::move(p));
  }));
  if (corrupt != 0) {
    return absl::DataLossError(
        absl::StrCat("job ", corrupt, ": a stored preemption is corrupt"));
  }
  return out;
}

absl::Status JobTables::PutJobControl(const JobControlRecord& control) {
  if (!control.held && control.after.empty() && !control.requeue) {
    ASSIGN_OR_RETURN(Statement * del,
                     db_->Prepare("DELETE FROM job_control WHERE job_id=?"));
    return del->Bind(1, control.job_id).Run();
  }
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO job_control(job_id, held, after, requeue) "
                   "VALUES(?,?,?,?) ON CONFLICT(job_id) DO UPDATE SET "
                   "held=excluded.held, after=excluded.after, "
                   "requeue=excluded.requeue"));
  return st->Bind(1, control.job_id)
      .Bind(2, control.held ? 1 : 0)
      .Bind(3, absl::StrJoin(control.after, ","))
      .Bind(4, control.requeue ? 1 : 0)
      .Run();
}

absl::StatusOr<std::vector<JobControlRecord>> JobTables::JobControls() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT job_id, held, after, requeue FROM "
                                "job_control ORDER BY job_id"));
  std::vector<JobControlRecord> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    JobControlRecord r;
    r.job_id = st->Int(0);
    r.held = st->Int(1) != 0;
    for (absl::string_view id :
         absl::StrSplit(st->Text(2), ',', absl::SkipEmpty())) {
      int64_t n;
      if (absl::SimpleAtoi(id, &n)) r.after.push_back(n);
    }
    r.requeue = st->Int(3) != 0;
    out.push_back(std::move(r));
  }));
  return out;
}

}  // namespace dlbatch::scheduler
