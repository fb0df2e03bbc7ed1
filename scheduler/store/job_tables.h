// The store's job tables, on the writer's connection: jobs and their
// request ids, state history (job_events), outputs, train state and kept
// checkpoints (job_checkpoints), the blobs
// each job holds (job_blobs) and each job's control state (job_control).
// Store is made of this and the other tables' classes (store.h says who
// may call them, and on which thread).
#ifndef DLBATCH_SCHEDULER_STORE_JOB_TABLES_H_
#define DLBATCH_SCHEDULER_STORE_JOB_TABLES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/placement.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

struct JobRecord {
  int64_t id = 0;
  // The submit's request id (unique per user) and the SHA-256 of what it
  // asked for (RequestDigest): kept with the first job a submit made.
  std::string request_id;
  std::string request_sha256;
  std::string user;
  v1::JobSpec spec;
  v1::JobState state = v1::JOB_STATE_QUEUED;
  int attempt = 0;  // 0 until first started
  int64_t submit_ms = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  std::vector<Part> parts;  // placement of the current attempt
  int exit_code = 0;
  std::string reason;
  int64_t sweep_id = 0;  // 0: not part of a sweep
};

// A train job's latest progress and stored checkpoint (empty messages where
// none was reported).
struct TrainState {
  v1::TrainProgress progress;
  v1::CheckpointStored checkpoint;
};

// What deleting jobs removed.
struct PurgeCounts {
  int64_t jobs = 0;
  std::vector<std::string> unreferenced_blobs;  // held by no job left
};

// A queued or running job's control state (schema version 6): held, the
// jobs it starts after, a requeue asked for while it runs.
struct JobControlRecord {
  int64_t job_id = 0;
  bool held = false;
  std::vector<int64_t> after;
  bool requeue = false;
};

// "3:0,1;7:2" <-> parts (jobs.parts).
std::string EncodeParts(const std::vector<Part>& parts);
std::vector<Part> DecodeParts(absl::string_view text);

class JobTables {
 public:
  JobTables(const JobTables&) = delete;
  JobTables& operator=(const JobTables&) = delete;

  // Writes; the caller holds a Transaction on the store's db().
  absl::StatusOr<int64_t> InsertJob(const JobRecord& job);
  absl::Status UpdateJob(const JobRecord& job);
  absl::Status AddEvent(int64_t job_id, v1::JobState state, int attempt,
                        int64_t time_ms, absl::string_view reason);
  absl::Status PutOutputs(int64_t job_id,
                          const std::vector<v1::OutputFile>& files);
  absl::Status PutProgress(int64_t job_id, const v1::TrainProgress& progress);
  // Appends a committed progress report to the job's history (schema
  // version 14; progress_history.cc) under the next seq. A job keeps at
  // most kMaxProgressHistory points: when full, every other point of the
  // older half goes, so the history spans the whole run at a resolution
  // that halves where it is oldest, and seqs are never reused.
  static constexpr int64_t kMaxProgressHistory = 10000;
  absl::Status AppendProgress(int64_t job_id,
                              const v1::TrainProgress& progress);
  absl::Status PutCheckpoint(int64_t job_id,
                             const v1::CheckpointStored& checkpoint);
  absl::StatusOr<TrainState> GetTrainState(int64_t job_id);
  // The stored checkpoints kept of a job (schema version 13), one per
  // (part, iteration): stored anew or replaced, holding its blobs (which
  // stay held by the job, as every blob it held, until it is purged).
  absl::Status PutKeptCheckpoint(int64_t job_id,
                                 const v1::CheckpointStored& checkpoint);
  absl::Status DeleteKeptCheckpoint(int64_t job_id, int part,
                                    int64_t iteration);
  // By part, then iteration; DataLoss where one does not parse.
  absl::StatusOr<std::vector<v1::CheckpointStored>> KeptCheckpoints(
      int64_t job_id);

  // Ended jobs (finished, failed, cancelled) with end_ms < before_ms,
  // oldest first.
  absl::StatusOr<std::vector<int64_t>> EndedBefore(int64_t before_ms,
                                                   int limit);
  // Deletes ended jobs and everything of theirs, in every table; a job not
  // ended (or absent) is skipped. Blob files are the caller's to delete.
  absl::StatusOr<PurgeCounts> PurgeJobs(const std::vector<int64_t>& ids);

  // Reads on the writer connection (recovery and submit de-duplication).
  // The first job `user`'s submit with `request_id` made, and the digest
  // of what it asked for (empty for a submit stored before version 9,
  // which kept none).
  struct RequestMatch {
    int64_t job_id = 0;
    std::string request_sha256;
  };
  absl::StatusOr<std::optional<RequestMatch>> JobForRequest(
      const std::string& user, const std::string& request_id);
  // The job's state, or nullopt if there is no such job.
  absl::StatusOr<std::optional<v1::JobState>> JobState(int64_t job_id);
  absl::StatusOr<std::vector<JobRecord>> ActiveJobs();
  // How many jobs each (profile, state) has: the metrics' starting counts.
  absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
  CountJobsByState();
  absl::StatusOr<int64_t> CountJobs();
  // Sweeps: ids are allocated as MAX+1 under the writer, so the caller
  // must insert the sweep's jobs in the same transaction.
  absl::StatusOr<int64_t> NextSweepId();
  // 0 for a job outside any sweep (or no such job).
  absl::StatusOr<int64_t> SweepIdOf(int64_t job_id);
  absl::StatusOr<std::vector<int64_t>> SweepJobIds(int64_t sweep_id);

  // Preemptions: the job's `seq`th (0, 1, ...), stored anew or replaced.
  absl::Status PutPreemption(int64_t job_id, int seq,
                             const v1::Preemption& preemption);
  absl::StatusOr<std::vector<v1::Preemption>> Preemptions(int64_t job_id);
  absl::Status DeletePreemption(int64_t job_id, int seq);
  // The preemptions of every queued or running job, by job, oldest first.
  absl::StatusOr<std::map<int64_t, std::vector<v1::Preemption>>>
  ActivePreemptions();

  // Job control. PutJobControl of a record with nothing set deletes it.
  absl::Status PutJobControl(const JobControlRecord& control);
  absl::StatusOr<std::vector<JobControlRecord>> JobControls();

 protected:
  // On `db`, which outlives this; last_event: the newest job_events.ev
  // stored (0 in a new file).
  JobTables(Database* db, int64_t last_event)
      : db_(db), last_event_(last_event) {}
  ~JobTables() = default;

 private:
  // Records that `job_id` holds blob `sha256` (attachments, outputs,
  // checkpoints), so a purge knows which blobs are still held.
  absl::Status HoldBlob(int64_t job_id, const std::string& sha256);

  Database* const db_;
  int64_t last_event_;  // job_events.ev, increasing across all jobs
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_JOB_TABLES_H_
