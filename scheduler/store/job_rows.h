// Rows of the job tables as both sides read them: the writer's connection
// (recovery) and StoreReader's (the services' queries) read the same
// columns the same way. Internal to the store.
#ifndef DLBATCH_SCHEDULER_STORE_JOB_ROWS_H_
#define DLBATCH_SCHEDULER_STORE_JOB_ROWS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/store/job_tables.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// What ReadJobRow reads, selected from `jobs` (unaliased): a job's request
// id is in job_requests.
inline constexpr char kJobColumns[] =
    "id, (SELECT request_id FROM job_requests WHERE job_id=jobs.id), user, "
    "spec, state, attempt, submit_ms, start_ms, end_ms, parts, exit_code, "
    "reason, name, profile, pool, priority, sweep_id";

// The job in `row` (kJobColumns); without with_spec, its spec holds only
// the name, profile, pool and priority. DataLoss for a spec that does not
// parse.
absl::StatusOr<JobRecord> ReadJobRow(const Statement& row, bool with_spec);

// The job's train state on `db` (empty where none was stored); DataLoss
// where what was stored does not parse.
absl::StatusOr<TrainState> ReadTrainState(Database* db, int64_t job_id);

// The job's kept checkpoints on `db` (job_checkpoints), by part and then
// iteration; DataLoss where one stored does not parse.
absl::StatusOr<std::vector<v1::CheckpointStored>> ReadKeptCheckpoints(
    Database* db, int64_t job_id);

// The job's preemptions on `db`, oldest first (none: empty); DataLoss
// where one stored does not parse.
absl::StatusOr<std::vector<v1::Preemption>> ReadPreemptions(Database* db,
                                                            int64_t job_id);

// Jobs by (profile, state), on `db`.
absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
CountJobsOn(Database* db);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_JOB_ROWS_H_
