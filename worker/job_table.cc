#include "worker/job_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/duration.h"
#include "common/stop_signals.h"
#include "worker/train_job.h"

namespace dlbatch::worker {
namespace {

constexpr absl::string_view kTrainerErrorPrefix = "dlbatch-train: ";

std::string TimeLimitText(const v1::StartJob& start) {
  return absl::StrCat("time limit ",
                      FormatDurationMs(start.spec().time_limit_s() * 1000),
                      " reached");
}

// "SIGUSR1" for the signals a job may be sent, "signal N" for others.
std::string SignalText(int signal) {
  const std::string name = StopSignalName(signal);
  return StopSignalNumber(name) == signal ? "SIG" + name : name;
}

// "killed in 2m00s if still running". A preemption's grace is what is left
// of it when the cancel is sent (a few ms under the profile's): whole
// seconds are rounded up, so 1m59.997s reads as the 2m00s it is.
std::string GraceText(int64_t grace_ms) {
  if (grace_ms <= 0) return "killed at once if still running";
  const int64_t shown =
      grace_ms < 1000 ? grace_ms : (grace_ms + 999) / 1000 * 1000;
  return absl::StrCat("killed in ", FormatDurationMs(shown),
                      " if still running");
}

// The first signal a preempted job's processes get: a train job's trainer
// checkpoints at kTrainerStopSignal; a command job gets what its cancel
// names (0: SIGTERM) if that is a signal a job may be told to stop with
// (stop_signals.h: not KILL, which follows at the grace anyway, nor STOP,
// which would hold it there), else SIGTERM.
int PreemptSignal(const v1::StartJob& start, const v1::CancelJob& cancel) {
  if (start.spec().has_train()) return kTrainerStopSignal;
  const int asked = cancel.signal() == 0 ? SIGTERM : cancel.signal();
  return StopSignalNumber(StopSignalName(asked)) == asked ? asked : SIGTERM;
}

// What a preempted job's diary says happens to it, after the reason.
std::string PreemptText(const v1::StartJob& start, const v1::CancelJob& cancel,
                        int signal) {
  if (start.spec().has_train()) {
    return absl::StrCat("checkpointing and stopping (", SignalText(signal),
                        "; ", GraceText(cancel.grace_ms()), ")");
  }
  std::string text = absl::StrCat("sending ", SignalText(signal));
  const int asked = cancel.signal() == 0 ? SIGTERM : cancel.signal();
  if (asked != signal) {
    absl::StrAppend(&text, ", as ", SignalText(asked),
                    " is not one a job may be sent");
  }
  absl::StrAppend(&text, " (", GraceText(cancel.grace_ms()), ")");
  return text;
}

}  // namespace

JobTable::JobTable(std::string work_dir) : work_dir_(std::move(work_dir)) {}

JobTable::Job* JobTable::Find(int64_t key) {
  auto it = jobs_.find(key);
  return it == jobs_.end() ? nullptr : &it->second;
}

int PartRank(const v1::StartJob& start) {
  return start.spec().has_train() ? start.first_rank() : start.part();
}

void JobTable::AddDiary(Job& job, int stream, const std::string& text,
                        int64_t time_ms, JobEffects* fx,
                        v1::DiaryLine::Ending ending, std::optional<int> rank) {
  v1::WorkerMessage m;
  v1::DiaryBatch* batch = m.mutable_diary();
  job.ref.To(batch);
  v1::DiaryLine* line = batch->add_lines();
  line->set_seq(++job.next_seq);
  line->set_time_ms(time_ms);
  line->set_stream(stream);
  line->set_text(text);
  line->set_ending(ending);
  if (rank) line->set_rank(*rank);
  fx->records.push_back(std::move(m));
}

void JobTable::End(Job& job, v1::JobState state, const std::string& reason,
                   std::vector<v1::OutputFile> outputs, JobEffects* fx) {
  v1::JobEnded ended;
  job.ref.To(&ended);
  ended.set_state(state);
  if (!job.exit.has_value()) {
    ended.set_exit_code(-1);
  } else if (job.exit->exited) {
    ended.set_exit_code(job.exit->exit_code);
  } else {
    ended.set_exit_code(128 + job.exit->term_signal);
  }
  if (job.slurm_signal > 0) ended.set_exit_code(128 + job.slurm_signal);
  ended.set_reason(reason);
  for (auto& f : outputs) *ended.add_outputs() = std::move(f);
  // Every line before the report: the scheduler ends the job only once it
  // has committed them all.
  ended.set_last_seq(job.next_seq);
  job.phase = JobPhase::kEnded;
  v1::WorkerMessage m;
  *m.mutable_ended() = std::move(ended);
  fx->records.push_back(std::move(m));
}

JobEffects JobTable::Assign(const v1::StartJob& start, int64_t now_ms) {
  (void)now_ms;
  JobEffects fx;
  const JobRef ref = JobRef::Of(start);
  if (keys_.count(ref) != 0) return fx;
  const int64_t key = next_key_++;
  Job& job = jobs_[key];
  job.key = key;
  job.ref = ref;
  job.start = start;
  job.dir = absl::StrCat(work_dir_, "/jobs/", ref.job_id, "-", ref.attempt, "-",
                         ref.part);
  keys_[ref] = key;
  JobAction a;
  a.kind = JobAction::kPrepare;
  a.key = key;
  a.ref = ref;
  a.dir = job.dir;
  a.start = start;
  fx.actions.push_back(std::move(a));
  return fx;
}

JobAction JobTable::TerminateAction(const Job& job) {
  JobAction a;
  a.kind = JobAction::kTerminate;
  a.key = job.key;
  a.ref = job.ref;
  a.grace_ms = job.cancel_grace_ms;
  a.signal = job.cancel_signal;
  if (!job.start.spec().has_train()) {
    a.stop_file = absl::StrCat(job.dir, "/", kStopFile);
    a.stop_why = job.time_limit_hit    ? "time_limit"
                 : job.cancel_preempts ? "preempted"
                                       : "cancelled";
  }
  return a;
}

JobEffects JobTable::Cancel(const JobRef& ref, int64_t grace_ms,
                            const std::string& reason, int64_t now_ms) {
  v1::CancelJob cancel;
  ref.To(&cancel);
  cancel.set_grace_ms(grace_ms);
  cancel.set_reason(reason);
  return Cancel(cancel, now_ms);
}

JobEffects JobTable::Cancel(const v1::CancelJob& cancel, int64_t now_ms) {
  JobEffects fx;
  const JobRef ref = JobRef::Of(cancel);
  auto k = keys_.find(ref);
  if (k == keys_.end()) return fx;
  Job& job = jobs_.at(k->second);
  // Once its processes are gone a job ends as they left it.
  if (job.cancel_requested || job.phase >= JobPhase::kFinishing) return fx;
  // A job stopping at its time limit fails by it: requeued, it would only
  // reach it again.
  if (cancel.preempt() && job.time_limit_hit) return fx;
  job.cancel_requested = true;
  job.cancel_reason = cancel.reason();
  job.cancel_grace_ms = cancel.grace_ms();
  job.cancel_signal = SIGTERM;
  std::string line;
  if (!cancel.preempt()) {
    line = absl::StrCat("[dlbatch] stopping the job: ", cancel.reason());
  } else {
    if (job.cancel_reason.empty()) job.cancel_reason = "preempted";
    job.cancel_preempts = true;
    job.cancel_signal = PreemptSignal(job.start, cancel);
    // Preparing with no process asked for: Prepared() ends it.
    const bool started = job.phase == JobPhase::kRunning || job.start_asked;
    line =
        absl::StrCat("[dlbatch] ", job.cancel_reason, ": ",
                     started ? PreemptText(job.start, cancel, job.cancel_signal)
                             : "stopped before it started");
  }
  AddDiary(job, kWorkerStream, line, now_ms, &fx);
  if (job.phase == JobPhase::kRunning)
    fx.actions.push_back(TerminateAction(job));
  // Preparing: Prepared() ends it without a process, or Started() stops the
  // process asked for meanwhile.
  return fx;
}

JobEffects JobTable::SlurmStopping(int signal, int64_t grace_ms,
                                   int64_t now_ms) {
  JobEffects fx;
  for (auto& [key, job] : jobs_) {
    // A job whose processes have gone, or that is being stopped already
    // (a cancel, its time limit), ends as it would have.
    if (job.phase >= JobPhase::kFinishing || job.cancel_requested ||
        job.time_limit_hit) {
      continue;
    }
    job.slurm_signal = signal;
    v1::CancelJob cancel;
    job.ref.To(&cancel);
    cancel.set_preempt(true);
    cancel.set_grace_ms(grace_ms);
    cancel.set_reason(absl::StrCat("Slurm is ending the job's Slurm job (",
                                   SignalText(signal), " to its worker)"));
    JobEffects one = Cancel(cancel, now_ms);
    for (auto& a : one.actions) fx.actions.push_back(std::move(a));
    for (auto& r : one.records) fx.records.push_back(std::move(r));
  }
  return fx;
}

JobEffects JobTable::Prepared(int64_t key,
                              absl::StatusOr<SubprocessOptions> process,
                              const std::vector<std::string>& notes,
                              int64_t now_ms) {
  JobEffects fx;
  Job* job = Find(key);
  if (job == nullptr || job->phase != JobPhase::kPreparing || job->start_asked)
    return fx;
  for (const auto& note : notes)
    AddDiary(*job, kWorkerStream, "[dlbatch] " + note, now_ms, &fx);
  if (job->cancel_requested) {
    End(*job, v1::JOB_STATE_CANCELLED, job->cancel_reason, {}, &fx);
    return fx;
  }
  if (!process.ok()) {
    const std::string reason(process.status().message());
    AddDiary(*job, kWorkerStream, "[dlbatch] " + reason, now_ms, &fx);
    End(*job, v1::JOB_STATE_FAILED, reason, {}, &fx);
    return fx;
  }
  job->start_asked = true;
  JobAction a;
  a.kind = JobAction::kStart;
  a.key = key;
  a.ref = job->ref;
  a.dir = job->dir;
  a.process = *std::move(process);
  // The stream's rank is set where the stream is: a launch that starts its
  // processes itself gives each its own.
  if (a.process.rank < 0) a.process.rank = PartRank(job->start);
  fx.actions.push_back(std::move(a));
  return fx;
}

JobEffects JobTable::Started(int64_t key, absl::Status status, int64_t now_ms,
                             int64_t now_mono_ms) {
  JobEffects fx;
  Job* job = Find(key);
  if (job == nullptr || job->phase != JobPhase::kPreparing) return fx;
  if (!status.ok()) {
    const std::string reason =
        absl::StrCat("cannot start the job: ", status.message());
    AddDiary(*job, kWorkerStream, "[dlbatch] " + reason, now_ms, &fx);
    End(*job, v1::JOB_STATE_FAILED, reason, {}, &fx);
    return fx;
  }
  job->phase = JobPhase::kRunning;
  if (!job->start.spec().has_train()) job->command_progress.emplace(now_ms);
  const int64_t limit_s = job->start.spec().time_limit_s();
  if (limit_s > 0) job->deadline_mono_ms = now_mono_ms + limit_s * 1000;
  // The cancel came while the process was being started.
  if (job->cancel_requested) fx.actions.push_back(TerminateAction(*job));
  return fx;
}

JobEffects JobTable::Line(int64_t key, const OutputLine& line) {
  JobEffects fx;
  Job* job = Find(key);
  if (job == nullptr || job->phase == JobPhase::kEnded) return fx;
  if (line.stream == kChannelStream && job->command_progress) {
    CommandProgressLine(*job, line, &fx);
    return fx;
  }
  if (line.stream == kChannelStream) {
    ChannelEvent event =
        ApplyChannelLine(line.text, line.time_ms, &job->progress);
    if (job->ref.part != 0) return fx;  // part 0 speaks for the job
    if (event.kind == ChannelEvent::kProgress) {
      v1::WorkerMessage m;
      v1::JobProgress* p = m.mutable_progress();
      job->ref.To(p);
      *p->mutable_progress() = job->progress;
      fx.records.push_back(std::move(m));
    } else if (event.kind == ChannelEvent::kCheckpoint) {
      AskCheckpoint(*job, event.iteration, &fx);
    }
    return fx;
  }
  // The trainer's own error line says what went wrong better than its exit
  // code: it becomes the job's reason.
  if (line.stream == kStderr && job->start.spec().has_train() &&
      job->trainer_error.empty() &&
      absl::string_view(line.text).substr(0, kTrainerErrorPrefix.size()) ==
          kTrainerErrorPrefix) {
    job->trainer_error = line.text.substr(kTrainerErrorPrefix.size());
  }
  AddDiary(*job, line.stream, line.text, line.time_ms, &fx,
           line.ending == OutputLine::kCrlf   ? v1::DiaryLine::ENDING_CRLF
           : line.ending == OutputLine::kNone ? v1::DiaryLine::ENDING_NONE
                                              : v1::DiaryLine::ENDING_NEWLINE,
           line.rank >= 0 ? line.rank : PartRank(job->start));
  return fx;
}

JobEffects JobTable::Exited(int64_t key, const ExitInfo& info, int64_t now_ms) {
  JobEffects fx;
  Job* job = Find(key);
  if (job == nullptr || job->phase != JobPhase::kRunning) return fx;
  job->phase = JobPhase::kFinishing;
  job->exit = info;
  if (info.leftover_killed > 0) {
    std::string what = absl::StrCat("[dlbatch] killed ", info.leftover_killed,
                                    " process(es) the job left behind");
    if (!info.leftover_names.empty())
      absl::StrAppend(&what, ": ", info.leftover_names);
    AddDiary(*job, kWorkerStream, what, now_ms, &fx);
  }
  JobAction a;
  a.kind = JobAction::kUploadOutputs;
  a.key = key;
  a.ref = job->ref;
  a.dir = job->dir;
  a.max_output_bytes = job->start.max_output_bytes();
  if (job->command_progress) {
    const CommandProgress& cp = *job->command_progress;
    if (job->progress_pending) SendProgress(*job, now_ms, &fx);
    if (cp.bad_lines() > 0 || cp.metrics_dropped() > 0) {
      std::string text =
          absl::StrCat("[dlbatch] $", kProgressEnv, ": ", cp.lines(),
                       " line(s) read, ", cp.bad_lines(), " ignored");
      if (cp.metrics_dropped() > 0) {
        absl::StrAppend(&text, "; metrics past the first ", kMaxJobMetrics,
                        " names were ignored ", cp.metrics_dropped(),
                        " time(s)");
      }
      AddDiary(*job, kWorkerStream, text, now_ms, &fx);
    }
    a.history = cp.history();
    a.history_title = job->start.spec().name().empty()
                          ? absl::StrCat("job ", job->ref.job_id)
                          : job->start.spec().name();
  }
  fx.actions.push_back(std::move(a));
  return fx;
}

void JobTable::CommandProgressLine(Job& job, const OutputLine& line,
                                   JobEffects* fx) {
  CommandProgress& cp = *job.command_progress;
  const CommandProgress::Result r =
      cp.Read(line.text, line.ending != OutputLine::kNone, line.time_ms);
  if (r.kind == CommandProgress::Result::kPiece) return;
  if (r.kind == CommandProgress::Result::kBad) {
    if (cp.bad_lines() <= kBadProgressNoted) {
      std::string text = absl::StrCat("[dlbatch] $", kProgressEnv, " line ",
                                      cp.lines(), " ignored: ", r.problem);
      if (cp.bad_lines() == kBadProgressNoted)
        absl::StrAppend(&text, " (further bad lines are counted, not noted)");
      AddDiary(job, kWorkerStream, text, line.time_ms, fx);
    }
    return;
  }
  job.progress = cp.progress();
  // The checkpoint is part 0's (the job's rank 0 speaks for it), or with
  // `checkpoint: per-part` each part's own.
  if (r.kind == CommandProgress::Result::kCheckpoint &&
      (job.ref.part == 0 || job.start.spec().checkpoint() == "per-part"))
    AskCheckpoint(job, r.step, fx);
  // Part 0 speaks for the job; the interval keeps a flood of reports from
  // becoming a flood of messages and store writes.
  if (job.ref.part != 0 || !r.progress) return;
  if (line.time_ms - job.progress_sent_ms >= kProgressIntervalMs) {
    SendProgress(job, line.time_ms, fx);
  } else {
    job.progress_pending = true;
  }
}

void JobTable::AskCheckpoint(Job& job, int64_t iteration, JobEffects* fx) {
  if (job.checkpoint_busy) {
    job.checkpoint_wanted = iteration;  // stored next, newest only
    return;
  }
  job.checkpoint_busy = true;
  job.checkpoint_wanted = -1;
  JobAction a;
  a.kind = JobAction::kUploadCheckpoint;
  a.key = job.key;
  a.ref = job.ref;
  a.dir = job.dir;
  a.iteration = iteration;
  if (job.command_progress) {
    a.checkpoint_dir = absl::StrCat(job.dir, "/", kCheckpointDir);
    a.max_output_bytes = job.start.max_output_bytes();
  }
  fx->actions.push_back(std::move(a));
}

void JobTable::SendProgress(Job& job, int64_t now_ms, JobEffects* fx) {
  job.progress_pending = false;
  job.progress_sent_ms = now_ms;
  v1::WorkerMessage m;
  v1::JobProgress* p = m.mutable_progress();
  job.ref.To(p);
  *p->mutable_progress() = job.progress;
  fx->records.push_back(std::move(m));
}

JobEffects JobTable::OutputsUploaded(
    int64_t key, absl::StatusOr<std::vector<v1::OutputFile>> files,
    const std::vector<std::string>& notes, int64_t now_ms) {
  JobEffects fx;
  Job* job = Find(key);
  if (job == nullptr || job->phase != JobPhase::kFinishing ||
      job->outputs.has_value())
    return fx;
  // The worker is stopping: no report (the scheduler requeues the job).
  if (!files.ok() && files.status().code() == absl::StatusCode::kCancelled)
    return fx;
  for (const auto& note : notes)
    AddDiary(*job, kWorkerStream, "[dlbatch] " + note, now_ms, &fx);
  job->outputs = std::move(files);
  EndIfReady(*job, now_ms, &fx);
  return fx;
}

void JobTable::EndIfReady(Job& job, int64_t now_ms, JobEffects* fx) {
  if (job.phase != JobPhase::kFinishing || !job.outputs.has_value() ||
      job.checkpoint_busy || job.checkpoint_wanted >= 0)
    return;
  absl::StatusOr<std::vector<v1::OutputFile>>& files = *job.outputs;
  const ExitInfo& info = *job.exit;
  std::vector<v1::OutputFile> outputs;
  if (files.ok()) outputs = *std::move(files);
  if (job.cancel_requested) {
    End(job, v1::JOB_STATE_CANCELLED, job.cancel_reason, std::move(outputs),
        fx);
  } else if (!files.ok()) {
    const std::string reason(files.status().message());
    AddDiary(job, kWorkerStream, "[dlbatch] " + reason, now_ms, fx);
    End(job, v1::JOB_STATE_FAILED, reason, {}, fx);
  } else if (job.time_limit_hit) {
    End(job, v1::JOB_STATE_FAILED, TimeLimitText(job.start), std::move(outputs),
        fx);
  } else if (info.exited && info.exit_code == 0) {
    End(job, v1::JOB_STATE_FINISHED, "", std::move(outputs), fx);
  } else {
    std::string reason = info.Describe();
    if (!job.trainer_error.empty())
      absl::StrAppend(&reason, ": ", job.trainer_error);
    End(job, v1::JOB_STATE_FAILED, reason, std::move(outputs), fx);
  }
}

JobEffects JobTable::CheckpointStored(
    int64_t key, int64_t iteration,
    absl::StatusOr<std::vector<v1::OutputFile>> files, int64_t now_ms) {
  JobEffects fx;
  Job* job = Find(key);
  if (job == nullptr) return fx;
  job->checkpoint_busy = false;
  // The end waits for every store: a stale event, nothing to tell.
  if (job->phase == JobPhase::kEnded) return fx;
  const bool stopping =
      !files.ok() && files.status().code() == absl::StatusCode::kCancelled;
  if (files.ok()) {
    v1::WorkerMessage m;
    v1::CheckpointStored* c = m.mutable_checkpoint();
    job->ref.To(c);
    c->set_iteration(iteration);
    for (auto& f : *files) *c->add_files() = std::move(f);
    fx.records.push_back(std::move(m));
  } else if (!stopping) {
    // The job goes on (or ends); a requeue resumes from the previous one.
    AddDiary(*job, kWorkerStream,
             absl::StrCat("[dlbatch] could not store the checkpoint of "
                          "iteration ",
                          iteration, ": ", files.status().message()),
             now_ms, &fx);
  }
  if (job->checkpoint_wanted >= 0)
    AskCheckpoint(*job, job->checkpoint_wanted, &fx);
  // A stopping worker reports no end (the scheduler requeues the job).
  if (!stopping) EndIfReady(*job, now_ms, &fx);
  return fx;
}

JobEffects JobTable::Tick(int64_t now_ms, int64_t now_mono_ms) {
  JobEffects fx;
  for (auto& [key, job] : jobs_) {
    if (job.phase != JobPhase::kRunning || job.deadline_mono_ms == 0 ||
        now_mono_ms < job.deadline_mono_ms || job.time_limit_hit ||
        job.cancel_requested) {
      continue;
    }
    job.time_limit_hit = true;
    AddDiary(job, kWorkerStream,
             absl::StrCat("[dlbatch] ", TimeLimitText(job.start),
                          "; stopping the job"),
             now_ms, &fx);
    JobAction a = TerminateAction(job);
    a.grace_ms = kTimeLimitGraceMs;
    a.signal = SIGTERM;
    fx.actions.push_back(std::move(a));
  }
  for (auto& [key, job] : jobs_) {
    if (job.progress_pending && job.phase == JobPhase::kRunning &&
        now_ms - job.progress_sent_ms >= kProgressIntervalMs)
      SendProgress(job, now_ms, &fx);
  }
  return fx;
}

JobEffects JobTable::EndedAcked(const JobRef& ref) {
  JobEffects fx;
  auto k = keys_.find(ref);
  if (k == keys_.end()) return fx;
  Job& job = jobs_.at(k->second);
  if (job.phase != JobPhase::kEnded) return fx;
  JobAction a;
  a.kind = JobAction::kRemove;
  a.key = job.key;
  a.ref = ref;
  a.dir = job.dir;
  fx.actions.push_back(std::move(a));
  jobs_.erase(k->second);
  keys_.erase(k);
  return fx;
}

std::vector<JobRef> JobTable::Jobs() const {
  std::vector<JobRef> out;
  out.reserve(jobs_.size());
  for (const auto& [ref, key] : keys_) out.push_back(ref);
  return out;
}

int JobTable::BusySlots() const {
  int busy = 0;
  for (const auto& [key, job] : jobs_) {
    if (job.phase != JobPhase::kEnded) busy += job.start.devices_size();
  }
  return busy;
}

std::optional<JobPhase> JobTable::Phase(const JobRef& ref) const {
  auto k = keys_.find(ref);
  if (k == keys_.end()) return std::nullopt;
  return jobs_.at(k->second).phase;
}

}  // namespace dlbatch::worker
