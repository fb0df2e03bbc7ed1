// The store's side of job control and worker administration:
// drained workers and the control state of queued or running jobs.
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "scheduler/store/store.h"

namespace dlbatch::scheduler {

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

absl::Status Store::PutDrain(const WorkerDrain& drain) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("INSERT INTO worker_drains(name, reason, "
                                "since_ms) VALUES(?,?,?) ON CONFLICT(name) DO "
                                "UPDATE SET reason=excluded.reason"));
  return st->Bind(1, drain.name)
      .Bind(2, drain.reason)
      .Bind(3, drain.since_ms)
      .Run();
}

absl::Status Store::DeleteDrain(const std::string& name) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM worker_drains WHERE name=?"));
  return st->Bind(1, name).Run();
}

absl::StatusOr<std::vector<WorkerDrain>> Store::Drains() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT name, reason, since_ms FROM "
                                "worker_drains ORDER BY name"));
  std::vector<WorkerDrain> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    out.push_back({st->Text(0), st->Text(1), st->Int(2)});
  }));
  return out;
}

absl::Status Store::DeleteWorker(int64_t id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM workers WHERE id=?"));
  return st->Bind(1, id).Run();
}

absl::Status Store::PutJobControl(const JobControlRecord& control) {
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

absl::StatusOr<std::vector<JobControlRecord>> Store::JobControls() {
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
