// The scheduler's durable state in one SQLite file (WAL): jobs and their
// state history, diary lines, workers, profiles and output metadata.
//
// Store is the single writer: the scheduler calls it under its own lock and
// wraps every acknowledged change in one Transaction, committed before the
// reply. StoreReader serves reads on separate connections, so listing
// 100,000 jobs never holds the writer up.
#ifndef DLBATCH_SCHEDULER_STORE_STORE_H_
#define DLBATCH_SCHEDULER_STORE_STORE_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/placement.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/slurm/launcher.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// One part's end as its worker reported it (Store::PutPartEnd).
struct PartEnd {
  int64_t job_id = 0;
  int attempt = 0;
  int part = 0;
  int exit_code = 0;
  std::string failure;  // empty: it finished
};

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

struct WorkerRecord {
  int64_t id = 0;
  std::string name;
  std::string host;
  std::string profile;
  std::vector<v1::Device> devices;
  int64_t last_seen_ms = 0;
};

// A train job's latest progress and stored checkpoint (empty messages where
// none was reported).
struct TrainState {
  v1::TrainProgress progress;
  v1::CheckpointStored checkpoint;
};

// Where a capped diary was cut: the first lines (head_bytes) come before
// the marker line, the last ones (tail_bytes) after it; what fell between
// is counted.
struct DiaryCut {
  int64_t marker_n = 0;  // the marker's diary.n; 0: not cut
  int64_t head_bytes = 0;
  int64_t tail_bytes = 0;
  int64_t dropped_lines = 0;
  int64_t dropped_bytes = 0;
};

// What deleting jobs removed.
// A user's fair-share usage of ended jobs: slot_ms, decayed as of at_ms.
struct StoredUsage {
  std::string user;
  int64_t slot_ms = 0;
  int64_t at_ms = 0;
};

struct PurgeCounts {
  int64_t jobs = 0;
  std::vector<std::string> unreferenced_blobs;  // held by no job left
};

// A drained worker, by name (table worker_drains, schema version 6 on).
struct WorkerDrain {
  std::string name;
  std::string reason;
  int64_t since_ms = 0;
};

// A queued or running job's control state (schema version 6): held, the
// jobs it starts after, a requeue asked for while it runs.
struct JobControlRecord {
  int64_t job_id = 0;
  bool held = false;
  std::vector<int64_t> after;
  bool requeue = false;
};

// Bytes of the store at `db_path` on disk: the database and its WAL.
int64_t StoreFileBytes(const std::string& db_path);

// Version 5 -> 6: worker_drains and job_control. Idempotent.
absl::Status AddControlTables(Database* db);
// Version 6 -> 7: slurm_jobs (store_slurm.cc). Idempotent.
absl::Status AddSlurmTable(Database* db);
// Version 9 -> 10: diary.line (each line's number in its job's diary, filled
// in for the lines already stored) and diary.ending (store_diary.cc).
// Idempotent.
absl::Status AddDiaryLineColumns(Database* db);

// "3:0,1;7:2" <-> parts.
std::string EncodeParts(const std::vector<Part>& parts);
std::vector<Part> DecodeParts(absl::string_view text);

class Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                                     bool sync_full);
  Database* db() { return db_.get(); }

  // Writes; the caller holds a Transaction on db().
  absl::StatusOr<int64_t> InsertJob(const JobRecord& job);
  absl::Status UpdateJob(const JobRecord& job);
  absl::Status AddEvent(int64_t job_id, v1::JobState state, int attempt,
                        int64_t time_ms, absl::string_view reason);
  // seq < 0: a line of dlbatch's own (never deduplicated). Returns false if
  // the line (job, attempt, part, seq) was stored before. A stored line is
  // numbered after the job's newest one (DiaryLine.line).
  absl::StatusOr<bool> AddDiary(
      int64_t job_id, int attempt, int part, int64_t seq, int64_t time_ms,
      int stream, absl::string_view text,
      v1::DiaryLine::Ending ending = v1::DiaryLine::ENDING_NEWLINE);
  absl::Status PutOutputs(int64_t job_id,
                          const std::vector<v1::OutputFile>& files);
  absl::Status PutProgress(int64_t job_id, const v1::TrainProgress& progress);
  absl::Status PutCheckpoint(int64_t job_id,
                             const v1::CheckpointStored& checkpoint);
  absl::StatusOr<TrainState> GetTrainState(int64_t job_id);
  absl::StatusOr<int64_t> UpsertWorker(const WorkerRecord& worker);

  // Tokens, by their hash (credentials.h). Put replaces the name's token;
  // Delete returns whether there was one.
  absl::Status PutCredential(const CredentialRecord& record);
  absl::StatusOr<bool> DeleteCredential(const std::string& name, bool worker);
  absl::StatusOr<std::vector<CredentialRecord>> Credentials();

  // Diary cap bookkeeping (see DiaryCut).
  absl::StatusOr<std::optional<DiaryCut>> GetDiaryCut(int64_t job_id);
  absl::Status PutDiaryCut(int64_t job_id, const DiaryCut& cut);
  // Bytes of every line of the job's diary.
  absl::StatusOr<int64_t> DiaryBytes(int64_t job_id);
  // The newest seq per (attempt, part) among lines after diary.n `after`.
  absl::StatusOr<std::vector<std::tuple<int, int, int64_t>>> DiaryLastSeqs(
      int64_t job_id, int64_t after);
  // Deletes the oldest lines after diary.n `after` until at least `bytes`
  // are gone (never the newest line); returns {lines, bytes} deleted.
  absl::StatusOr<std::pair<int64_t, int64_t>> TrimDiary(int64_t job_id,
                                                        int64_t after,
                                                        int64_t bytes);
  absl::Status SetDiaryText(int64_t n, absl::string_view text);
  int64_t LastInsertId() { return db_->LastInsertId(); }

  // Ended jobs (finished, failed, cancelled) with end_ms < before_ms,
  // oldest first.
  absl::StatusOr<std::vector<int64_t>> EndedBefore(int64_t before_ms,
                                                   int limit);
  // Deletes ended jobs and everything of theirs; a job not ended (or
  // absent) is skipped. Blob files are the caller's to delete.
  absl::StatusOr<PurgeCounts> PurgeJobs(const std::vector<int64_t>& ids);
  absl::Status UpsertProfile(const std::string& name, int max_pool);

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
  absl::StatusOr<std::vector<WorkerRecord>> Workers();
  absl::StatusOr<std::vector<std::pair<std::string, int>>> Profiles();
  absl::StatusOr<int64_t> CountJobs();
  // Sweeps: ids are allocated as MAX+1 under the writer, so the caller
  // must insert the sweep's jobs in the same transaction.
  absl::StatusOr<int64_t> NextSweepId();
  // 0 for a job outside any sweep (or no such job).
  absl::StatusOr<int64_t> SweepIdOf(int64_t job_id);
  absl::StatusOr<std::vector<int64_t>> SweepJobIds(int64_t sweep_id);

  // Per-user limits and fair-share usage (schema version 4). A limit that
  // is unlimited in both is deleted.
  absl::Status PutUserLimit(const LimitEntry& entry);
  absl::StatusOr<std::vector<LimitEntry>> UserLimits();
  absl::Status PutUsage(const StoredUsage& usage);
  absl::StatusOr<std::vector<StoredUsage>> Usages();

  // Drains and job control (store_control.cc). PutJobControl of a record
  // with nothing set deletes it.
  absl::Status PutDrain(const WorkerDrain& drain);
  absl::Status DeleteDrain(const std::string& name);
  absl::StatusOr<std::vector<WorkerDrain>> Drains();
  absl::Status DeleteWorker(int64_t id);
  absl::Status PutJobControl(const JobControlRecord& control);
  absl::StatusOr<std::vector<JobControlRecord>> JobControls();

  // Each job's Slurm job (store_slurm.cc; schema version 7): one record a
  // job, replaced by each Put; slurm_id 0 while sbatch has not answered.
  absl::Status PutSlurmJob(const slurm::SlurmJobRecord& record);
  absl::Status DeleteSlurmJob(int64_t job_id);
  absl::StatusOr<std::vector<slurm::SlurmJobRecord>> SlurmJobs();
  // The parts of running jobs whose end was reported (schema version 8): a
  // Slurm job's worker leaves once its part has ended, so after a restart
  // its part is known ended without it. Deleted as the job ends or is
  // queued again.
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

 private:
  explicit Store(std::unique_ptr<Database> db) : db_(std::move(db)) {}
  // Records that `job_id` holds blob `sha256` (attachments, outputs,
  // checkpoints), so a purge knows which blobs are still held.
  absl::Status HoldBlob(int64_t job_id, const std::string& sha256);
  std::unique_ptr<Database> db_;
  int64_t last_event_ = 0;  // job_events.ev, increasing across all jobs
};

// Read-only access on pooled connections. Thread-safe.
class StoreReader {
 public:
  explicit StoreReader(std::string path) : path_(std::move(path)) {}

  absl::StatusOr<std::optional<JobRecord>> GetJob(int64_t id);
  absl::StatusOr<std::vector<v1::StateChange>> History(int64_t id);
  // Summaries (no spec beyond name, profile, pool, priority) straight into
  // `out`, for listings of every job. sweep_id != 0: only that sweep's
  // jobs, with their spec's sweep_point too. `user` non-empty: only that
  // user's; `name_glob` non-empty: only names it matches (SQLite's GLOB).
  absl::Status ListJobSummaries(const std::vector<v1::JobState>& states,
                                int limit, bool newest_first,
                                v1::ListJobsReply* out, int64_t sweep_id = 0,
                                const std::string& user = "",
                                const std::string& name_glob = "");
  absl::StatusOr<std::vector<v1::DiaryLine>> ReadDiary(int64_t job_id,
                                                       int64_t after,
                                                       int limit);
  absl::StatusOr<int64_t> DiaryCount(int64_t job_id);
  // The `n` after which a job's last `tail` lines begin; 0 where it has
  // no more than `tail` lines.
  absl::StatusOr<int64_t> DiaryTailStart(int64_t job_id, int64_t tail);
  absl::StatusOr<std::vector<v1::OutputFile>> Outputs(int64_t job_id);
  absl::StatusOr<TrainState> GetTrainState(int64_t job_id);
  // The user a job was submitted by; NotFound for an unknown job.
  absl::StatusOr<std::string> JobUser(int64_t job_id);
  // Jobs by (profile, state), as Store::CountJobsByState.
  absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
  CountJobsByState();
  // Whether some job of `user` holds blob `sha256` (an attachment, an
  // output, a checkpoint).
  absl::StatusOr<bool> UserHoldsBlob(const std::string& user,
                                     const std::string& sha256);

 private:
  class Lease;
  // The first column of the first row of `sql` with `binds` bound in
  // order, or 0 where it returns no row.
  absl::StatusOr<int64_t> FirstInt(const char* sql,
                                   std::initializer_list<int64_t> binds);
  absl::StatusOr<std::unique_ptr<Database>> Acquire();
  void Release(std::unique_ptr<Database> db);

  std::string path_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Database>> idle_;  // guarded by mu_
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_STORE_H_
