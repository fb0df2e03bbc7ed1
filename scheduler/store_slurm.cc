// The store's side of Slurm profiles (issue 23): each dlbatch job's Slurm
// job, written before sbatch runs (slurm_id 0) and once it answers.
#include "common/status.h"
#include "scheduler/store.h"

namespace dlbatch::scheduler {

absl::Status AddSlurmTable(Database* db) {
  return db->Exec(R"sql(
CREATE TABLE IF NOT EXISTS slurm_jobs(
  job_id INTEGER PRIMARY KEY,
  attempt INTEGER NOT NULL,
  slurm_id INTEGER NOT NULL,
  profile TEXT NOT NULL,
  submitted_ms INTEGER NOT NULL,
  token_sha256 TEXT NOT NULL);
)sql");
}

absl::Status Store::PutSlurmJob(const slurm::SlurmJobRecord& record) {
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

absl::Status Store::DeleteSlurmJob(int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM slurm_jobs WHERE job_id=?"));
  return st->Bind(1, job_id).Run();
}

absl::StatusOr<std::vector<slurm::SlurmJobRecord>> Store::SlurmJobs() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT job_id, attempt, slurm_id, profile, "
                                "submitted_ms, token_sha256 FROM slurm_jobs "
                                "ORDER BY job_id"));
  std::vector<slurm::SlurmJobRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st->Step());
    if (!row) break;
    slurm::SlurmJobRecord r;
    r.job_id = st->Int(0);
    r.attempt = static_cast<int>(st->Int(1));
    r.slurm_id = st->Int(2);
    r.profile = st->Text(3);
    r.submitted_ms = st->Int(4);
    r.token_sha256 = st->Text(5);
    out.push_back(std::move(r));
  }
  st->Reset();
  return out;
}

}  // namespace dlbatch::scheduler
