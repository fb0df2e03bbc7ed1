// Each job's progress history (schema version 14): the reports as they were
// committed, bounded per job by thinning the oldest.
#include "common/status.h"
#include "scheduler/store/job_tables.h"

namespace dlbatch::scheduler {

absl::Status JobTables::AppendProgress(int64_t job_id,
                                       const v1::TrainProgress& progress) {
  ASSIGN_OR_RETURN(Statement * stat,
                   db_->Prepare("SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM "
                                "progress_history WHERE job_id=?"));
  stat->Bind(1, job_id);
  ASSIGN_OR_RETURN(bool row, stat->Step());
  const int64_t count = row ? stat->Int(0) : 0;
  const int64_t last = row ? stat->Int(1) : 0;
  stat->Reset();
  if (count >= kMaxProgressHistory) {
    // Every other point of the older half (the 2nd, 4th, ... by seq).
    ASSIGN_OR_RETURN(
        Statement * thin,
        db_->Prepare("DELETE FROM progress_history WHERE job_id=?1 AND seq IN "
                     "(SELECT seq FROM (SELECT seq, row_number() OVER (ORDER "
                     "BY seq) AS r FROM progress_history WHERE job_id=?1) "
                     "WHERE r % 2 = 0 AND r <= ?2)"));
    RETURN_IF_ERROR(thin->Bind(1, job_id).Bind(2, count / 2).Run());
  }
  ASSIGN_OR_RETURN(Statement * put,
                   db_->Prepare("INSERT INTO progress_history(job_id, seq, "
                                "progress) VALUES(?,?,?)"));
  return put->Bind(1, job_id)
      .Bind(2, last + 1)
      .BindBlob(3, progress.SerializeAsString())
      .Run();
}

}  // namespace dlbatch::scheduler
