// The worker's jobs as a pure state machine (the worker's counterpart of the
// scheduler's PlacementCore): fed events, it returns what to do and what to
// tell the scheduler. No threads, no I/O, no clock reads: time arrives as an
// argument.
//
// A job moves preparing -> running -> finishing -> ended:
//   preparing  its folder is made and its attachments fetched (a transfer),
//              then its process is asked for;
//   running    its process runs; lines become diary lines;
//   finishing  every process of it is gone; its outputs are uploaded;
//   ended      its end report (v1::JobEnded) is built - here, in one place -
//              and kept by the link until the scheduler acknowledges it.
// A job that cannot run (a fetch failed, a cancel came first, its program
// does not exist) goes from preparing straight to ended.
//
// Not thread-safe: the worker calls it under its lock.
#ifndef DLBATCH_WORKER_JOB_TABLE_H_
#define DLBATCH_WORKER_JOB_TABLE_H_

#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "worker/command_progress.h"
#include "worker/job_ref.h"
#include "worker/subprocess.h"

namespace dlbatch::worker {

// What the worker does for the table. Executing one never calls back into
// the table synchronously; results come back as events.
struct JobAction {
  enum Kind {
    kPrepare,           // make `dir`, fetch attachments -> Prepared()
    kStart,             // start `process` under `key` -> Started()
    kTerminate,         // `signal` to the job's processes, KILL after grace_ms
    kUploadOutputs,     // upload dir/output -> OutputsUploaded()
    kUploadCheckpoint,  // store `iteration`'s checkpoint -> CheckpointStored()
    kRemove,            // the job is forgotten: remove `dir`
  };
  Kind kind = kPrepare;
  int64_t key = 0;
  JobRef ref;
  std::string dir;
  int64_t grace_ms = 0;
  // kTerminate's first signal: SIGTERM, or a preempted job's stop signal
  // (a train job's kTrainerStopSignal, a command job's CancelJob.signal).
  int signal = SIGTERM;
  int64_t iteration = 0;
  // kTerminate of a command job: the file its stop request is written to
  // ($DLBATCH_STOP_FILE, what dlbatch.should_stop() looks for) before the
  // signal, saying why ("cancelled", "preempted", "time_limit").
  std::string stop_file;
  std::string stop_why;
  // kUploadCheckpoint of a command job: the folder it wrote the checkpoint
  // into ($DLBATCH_CHECKPOINT_DIR), stored whole as the job's checkpoint
  // (within max_output_bytes). Empty: a train job's trainer files.
  std::string checkpoint_dir;
  // kUploadOutputs of a command job that reported progress: the history
  // files to add to its outputs first (those it did not write itself).
  trainer::TrainingHistory history;
  std::string history_title;
  v1::StartJob start;         // kPrepare
  SubprocessOptions process;  // kStart
  int64_t max_output_bytes = 0;
};

// An event's consequences: actions in order, and records for the scheduler
// (diary lines, progress, checkpoints, end reports) in the order they must
// reach it.
struct JobEffects {
  std::vector<JobAction> actions;
  std::vector<v1::WorkerMessage> records;
};

enum class JobPhase { kPreparing, kRunning, kFinishing, kEnded };

// The global rank a part's lines are labelled with in the diary
// (DiaryLine.rank) when its process gives none (SubprocessOptions::rank
// unset): a train job's trainer, one process for the part's ranks whose
// output cannot be told apart, its first rank; a command job's one
// process per part, the part. dlbatch's own lines (kWorkerStream) carry
// no rank.
int PartRank(const v1::StartJob& start);

class JobTable {
 public:
  // Stream numbers of v1::DiaryLine and OutputLine.
  static constexpr int kWorkerStream = 0;  // lines dlbatch writes
  static constexpr int kStderr = 2;
  static constexpr int kChannelStream = 3;  // the trainer's progress channel
  // Grace between TERM and KILL when a job reaches its time limit.
  static constexpr int64_t kTimeLimitGraceMs = 10000;
  // A command job's progress reaches the scheduler at most this often
  // (latest wins; Tick sends what waited).
  static constexpr int64_t kProgressIntervalMs = 200;
  // Bad progress lines noted in the diary one by one; later ones are
  // counted and summed up when the job ends.
  static constexpr int kBadProgressNoted = 3;
  // In a command job's folder: its stop request (kTerminate's stop_file).
  static constexpr char kStopFile[] = ".dlbatch-stop";
  // In a command job's folder: $DLBATCH_CHECKPOINT_DIR.
  static constexpr char kCheckpointDir[] = "checkpoint";

  // `work_dir`: jobs run in WORK_DIR/jobs/<id>-<attempt>-<part>.
  explicit JobTable(std::string work_dir);

  // The scheduler placed a job here. A job already known is ignored.
  JobEffects Assign(const v1::StartJob& start, int64_t now_ms);
  // The scheduler asks a job to stop. A preempting cancel (`preempt`) sends
  // a train job's trainer kTrainerStopSignal (it checkpoints and exits) and
  // a command job's processes `signal` (0: SIGTERM) instead of SIGTERM;
  // SIGKILL follows grace_ms later either way. A job stopped by a cancel
  // ends CANCELLED with its reason however its processes exit; a job whose
  // processes had gone before (or, for a preemption, that had reached its
  // time limit) ends as it would have.
  JobEffects Cancel(const v1::CancelJob& cancel, int64_t now_ms);
  // Slurm is ending the Slurm job this worker serves (its `signal`, a
  // preemption's or scancel's, reached the worker): every job not ended
  // yet is stopped as a preempting cancel would (a trainer checkpoints),
  // and its end is reported as an end by that signal (128 + signal), which
  // the scheduler settles with Slurm's word on why the Slurm job ended.
  JobEffects SlurmStopping(int signal, int64_t grace_ms, int64_t now_ms);
  // A plain (not preempting) cancel.
  JobEffects Cancel(const JobRef& ref, int64_t grace_ms,
                    const std::string& reason, int64_t now_ms);
  // kPrepare's result: the process to start, or why the job cannot run;
  // `notes` become diary lines.
  JobEffects Prepared(int64_t key, absl::StatusOr<SubprocessOptions> process,
                      const std::vector<std::string>& notes, int64_t now_ms);
  // kStart's result. `now_mono_ms` starts the job's time limit.
  JobEffects Started(int64_t key, absl::Status status, int64_t now_ms,
                     int64_t now_mono_ms);
  JobEffects Line(int64_t key, const OutputLine& line);
  // Every process of the job is gone.
  JobEffects Exited(int64_t key, const ExitInfo& info, int64_t now_ms);
  // kUploadOutputs' result; `notes` (files skipped, ...) become diary lines.
  // The end report follows once every checkpoint the trainer announced is
  // stored (or failed to be): the scheduler requeues a job from the newest
  // checkpoint it was told of, so the CheckpointStored records come first.
  JobEffects OutputsUploaded(int64_t key,
                             absl::StatusOr<std::vector<v1::OutputFile>> files,
                             const std::vector<std::string>& notes,
                             int64_t now_ms);
  // kUploadCheckpoint's result. A store that failed is noted in the diary
  // (a requeue resumes from the previous checkpoint); one given up because
  // the worker stops (kCancelled) is not, and ends nothing.
  JobEffects CheckpointStored(int64_t key, int64_t iteration,
                              absl::StatusOr<std::vector<v1::OutputFile>> files,
                              int64_t now_ms);
  // Time passed: jobs past their time limit are stopped.
  JobEffects Tick(int64_t now_ms, int64_t now_mono_ms);
  // The scheduler has the end report: the job is forgotten (kRemove).
  JobEffects EndedAcked(const JobRef& ref);

  // Every job the table holds, for a registration: the scheduler keeps them.
  std::vector<JobRef> Jobs() const;
  std::optional<JobPhase> Phase(const JobRef& ref) const;
  size_t size() const { return jobs_.size(); }
  // Slots (devices) held by jobs that have not ended yet.
  int BusySlots() const;

 private:
  struct Job {
    int64_t key = 0;
    JobRef ref;
    v1::StartJob start;
    std::string dir;
    JobPhase phase = JobPhase::kPreparing;
    bool start_asked = false;  // kStart was returned
    int64_t next_seq = 0;      // last diary seq assigned
    bool cancel_requested = false;
    std::string cancel_reason;
    int64_t cancel_grace_ms = 0;
    int cancel_signal = SIGTERM;  // kTerminate's first signal for the cancel
    bool cancel_preempts = false;
    bool time_limit_hit = false;
    int slurm_signal = 0;  // SlurmStopping's signal: the end is reported so
    int64_t deadline_mono_ms = 0;  // 0: no time limit
    std::optional<ExitInfo> exit;
    std::string trainer_error;  // the trainer's first error line
    v1::TrainProgress progress;
    // A command job's $DLBATCH_PROGRESS, read once its process started.
    std::optional<CommandProgress> command_progress;
    int64_t progress_sent_ms = 0;
    bool progress_pending = false;   // a report waits for the interval
    bool checkpoint_busy = false;    // a kUploadCheckpoint is out
    int64_t checkpoint_wanted = -1;  // a newer one to store after it
    // kUploadOutputs' result, kept while a checkpoint is still stored.
    std::optional<absl::StatusOr<std::vector<v1::OutputFile>>> outputs;
  };

  Job* Find(int64_t key);
  // `rank`: the process's that wrote it; none for dlbatch's own lines.
  void AddDiary(Job& job, int stream, const std::string& text, int64_t time_ms,
                JobEffects* fx,
                v1::DiaryLine::Ending ending = v1::DiaryLine::ENDING_NEWLINE,
                std::optional<int> rank = std::nullopt);
  // Builds the job's kTerminate action with its cancel's signal and grace.
  static JobAction TerminateAction(const Job& job);
  // A command job's line on its progress channel.
  void CommandProgressLine(Job& job, const OutputLine& line, JobEffects* fx);
  void SendProgress(Job& job, int64_t now_ms, JobEffects* fx);
  // Stores the checkpoint of `iteration` (one store at a time; one asked
  // for meanwhile is stored next, the newest only).
  void AskCheckpoint(Job& job, int64_t iteration, JobEffects* fx);
  // A finishing job whose outputs are uploaded and no checkpoint of which is
  // still to be stored ends: the state and reason its exit, its cancel or
  // its time limit give.
  void EndIfReady(Job& job, int64_t now_ms, JobEffects* fx);
  // The one place an end report is built.
  void End(Job& job, v1::JobState state, const std::string& reason,
           std::vector<v1::OutputFile> outputs, JobEffects* fx);

  const std::string work_dir_;
  int64_t next_key_ = 1;
  std::map<int64_t, Job> jobs_;     // by key
  std::map<JobRef, int64_t> keys_;  // ref -> key
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_TABLE_H_
