// The store's Slurm tables, on the writer's connection: each dlbatch job's
// Slurm job (slurm_jobs, schema version 7), written before sbatch runs
// (slurm_id 0) and once it answers; the parts whose end was reported
// (part_ends, version 8); the resubmissions of a job whose Slurm job failed
// before it ran (slurm_resubmits, version 8); and the scheduler's instance
// id (in meta), which its Slurm jobs' names carry.
#ifndef DLBATCH_SCHEDULER_STORE_SLURM_TABLES_H_
#define DLBATCH_SCHEDULER_STORE_SLURM_TABLES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/slurm/launcher.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// One part's end as its worker reported it (SlurmTables::PutPartEnd).
struct PartEnd {
  int64_t job_id = 0;
  int attempt = 0;
  int part = 0;
  int exit_code = 0;
  std::string failure;  // empty: it finished
};

class SlurmTables {
 public:
  SlurmTables(const SlurmTables&) = delete;
  SlurmTables& operator=(const SlurmTables&) = delete;

  // Writes; the caller holds a Transaction on the store's db().
  // Each job's Slurm job: one record a job, replaced by each Put; slurm_id
  // 0 while sbatch has not answered.
  absl::Status PutSlurmJob(const slurm::SlurmJobRecord& record);
  absl::Status DeleteSlurmJob(int64_t job_id);
  absl::StatusOr<std::vector<slurm::SlurmJobRecord>> SlurmJobs();
  // The parts of running jobs whose end was reported: a Slurm job's worker
  // leaves once its part has ended, so after a restart its part is known
  // ended without it. Deleted as the job ends or is queued again.
  absl::Status PutPartEnd(const PartEnd& end);
  absl::Status DeletePartEnds(int64_t job_id);
  absl::StatusOr<std::vector<PartEnd>> PartEnds();
  // This scheduler's instance id (slurm::IsInstanceId): made at random on
  // the first call and kept in the meta table, so it outlives restarts and
  // travels with `dlbatch admin backup` (a copy of the database). Its Slurm
  // jobs carry it in their names. The caller holds a Transaction.
  absl::StatusOr<std::string> InstanceId();
  // How often a queued job's Slurm job failed before it started (it is
  // submitted again within max_attempts); deleted by count 0.
  absl::Status PutSlurmResubmits(int64_t job_id, int count);
  absl::StatusOr<std::map<int64_t, int>> SlurmResubmits();

 protected:
  explicit SlurmTables(Database* db) : db_(db) {}  // db outlives this
  ~SlurmTables() = default;

 private:
  Database* const db_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_SLURM_TABLES_H_
