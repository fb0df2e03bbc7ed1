#include "scheduler/store/slurm_tables.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "scheduler/slurm/commands.h"

namespace dlbatch::scheduler {

absl::Status SlurmTables::PutPartEnd(const PartEnd& end) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT OR REPLACE INTO part_ends(job_id, attempt, part, "
                   "exit_code, failure) VALUES(?,?,?,?,?)"));
  return st->Bind(1, end.job_id)
      .Bind(2, end.attempt)
      .Bind(3, end.part)
      .Bind(4, end.exit_code)
      .Bind(5, end.failure)
      .Run();
}

absl::Status SlurmTables::DeletePartEnds(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM part_ends WHERE job_id=?"));
  return st->Bind(1, job_id).Run();
}

absl::StatusOr<std::vector<PartEnd>> SlurmTables::PartEnds() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT job_id, attempt, part, exit_code, "
                   "failure FROM part_ends ORDER BY job_id, part"));
  std::vector<PartEnd> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    PartEnd e;
    e.job_id = st->Int(0);
    e.attempt = static_cast<int>(st->Int(1));
    e.part = static_cast<int>(st->Int(2));
    e.exit_code = static_cast<int>(st->Int(3));
    e.failure = st->Text(4);
    out.push_back(std::move(e));
  }));
  return out;
}

absl::Status SlurmTables::PutSlurmResubmits(int64_t job_id, int count) {
  if (count <= 0) {
    ASSIGN_OR_RETURN(
        Statement * st,
        db_->Prepare("DELETE FROM slurm_resubmits WHERE job_id=?"));
    return st->Bind(1, job_id).Run();
  }
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT OR REPLACE INTO slurm_resubmits(job_id, count) "
                   "VALUES(?,?)"));
  return st->Bind(1, job_id).Bind(2, count).Run();
}

absl::StatusOr<std::map<int64_t, int>> SlurmTables::SlurmResubmits() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT job_id, count FROM slurm_resubmits"));
  std::map<int64_t, int> out;
  RETURN_IF_ERROR(
      st->ForEachRow([&] { out[st->Int(0)] = static_cast<int>(st->Int(1)); }));
  return out;
}

absl::StatusOr<std::string> SlurmTables::InstanceId() {
  ASSIGN_OR_RETURN(Statement * get,
                   db_->Prepare("SELECT value FROM meta WHERE key='instance'"));
  ASSIGN_OR_RETURN(bool found, get->Step());
  std::string id = found ? get->Text(0) : "";
  get->Reset();
  if (found) {
    if (!slurm::IsInstanceId(id)) {
      return absl::DataLossError(absl::StrCat(
          "the store's instance id '", id,
          "' is not 8 hex digits; restore the state folder from a backup"));
    }
    return id;
  }
  std::random_device random;
  id = absl::StrFormat("%08x", static_cast<uint32_t>(random()));
  ASSIGN_OR_RETURN(
      Statement * put,
      db_->Prepare("INSERT INTO meta(key, value) VALUES('instance', ?)"));
  RETURN_IF_ERROR(put->Bind(1, id).Run());
  return id;
}

absl::Status SlurmTables::PutSlurmJob(const slurm::SlurmJobRecord& record) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO slurm_jobs(job_id, attempt, slurm_id, "
                   "profile, submitted_ms, token_sha256) VALUES(?,?,?,?,?,?) "
                   "ON CONFLICT(job_id) DO UPDATE SET "
                   "attempt=excluded.attempt, slurm_id=excluded.slurm_id, "
                   "profile=excluded.profile, "
                   "submitted_ms=excluded.submitted_ms, "
                   "token_sha256=excluded.token_sha256"));
  return st->Bind(1, record.job_id)
      .Bind(2, record.attempt)
      .Bind(3, record.slurm_id)
      .Bind(4, record.profile)
      .Bind(5, record.submitted_ms)
      .Bind(6, record.token_sha256)
      .Run();
}

absl::Status SlurmTables::DeleteSlurmJob(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM slurm_jobs WHERE job_id=?"));
  return st->Bind(1, job_id).Run();
}

absl::StatusOr<std::vector<slurm::SlurmJobRecord>> SlurmTables::SlurmJobs() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT job_id, attempt, slurm_id, profile, "
                                "submitted_ms, token_sha256 FROM slurm_jobs "
                                "ORDER BY job_id"));
  std::vector<slurm::SlurmJobRecord> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    slurm::SlurmJobRecord r;
    r.job_id = st->Int(0);
    r.attempt = static_cast<int>(st->Int(1));
    r.slurm_id = st->Int(2);
    r.profile = st->Text(3);
    r.submitted_ms = st->Int(4);
    r.token_sha256 = st->Text(5);
    out.push_back(std::move(r));
  }));
  return out;
}

}  // namespace dlbatch::scheduler
