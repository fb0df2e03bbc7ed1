// A job's life, as every part of the scheduler moves it: queued (to the
// placement core or to Slurm), started on its parts, its state changes
// recorded with their events, ended or queued again, and the lines of
// dlbatch's own in its diary. All run under mu_ (scheduler_state.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/array_spec.h"
#include "scheduler/control.h"
#include "scheduler/diary_follow.h"
#include "scheduler/kept_checkpoints.h"
#include "scheduler/preemptions.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/users.h"
#include "scheduler/watchers.h"

namespace dlbatch::scheduler {
namespace {

// Chooses the stored checkpoint an attempt of `parts` parts resumes from
// (job.checkpoint) and drops the kept ones of later steps.
absl::Status ChooseResume(SchedulerState& s, SchedulerState::ActiveJob& job,
                          int parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_) {
  s.mu_.AssertHeld();
  const JobRecord& rec = job.record;
  const std::vector<CheckpointKey> keys = KeysOf(job.kept_checkpoints);
  const std::optional<int64_t> step =
      ResumeStep(keys, ResumeParts(rec.spec, parts));
  if (PerPartCheckpoints(rec.spec) && !step && !keys.empty()) {
    RETURN_IF_ERROR(s.Diary(
        rec.id, rec.attempt,
        absl::StrCat("[dlbatch] attempt ", rec.attempt,
                     " starts afresh: no step has a stored checkpoint of "
                     "each of its ",
                     parts, " part(s) (checkpoint: per-part)")));
  }
  // What no attempt continues any more goes (all of it when afresh).
  for (const CheckpointKey& k : CheckpointsAfter(keys, step)) {
    RETURN_IF_ERROR(s.store_->DeleteKeptCheckpoint(rec.id, k.part, k.step));
    EraseKept(&job.kept_checkpoints, k);
  }
  const v1::CheckpointStored* found = FindKept(job.kept_checkpoints, 0, step);
  v1::CheckpointStored checkpoint =
      found != nullptr ? *found : v1::CheckpointStored();
  if (SameCheckpoint(checkpoint, job.checkpoint)) return absl::OkStatus();
  // The parts are not those that stored it (fewer or more of them).
  job.progress.set_checkpoint_iteration(step.value_or(0));
  RETURN_IF_ERROR(s.store_->PutCheckpoint(rec.id, checkpoint));
  RETURN_IF_ERROR(s.store_->PutProgress(rec.id, job.progress));
  job.checkpoint = std::move(checkpoint);
  return absl::OkStatus();
}

}  // namespace

void SchedulerState::EnqueueJob(const JobRecord& job) {
  mu_.AssertHeld();
  if (bridge().ProfileOf(job.spec.profile()) == nullptr) {
    core_->Enqueue(ToQueued(job));
    return;
  }
  SlurmLockHeld();
  bridge().Enqueue(job.id);
}

QueuedJob SchedulerState::ToQueued(const JobRecord& job) {
  QueuedJob q;
  q.id = job.id;
  q.profile = job.spec.profile();
  q.pool = job.spec.pool();
  q.priority = job.spec.priority();
  q.seq = job.id;
  q.max_nodes = std::max(1, job.spec.max_nodes());
  q.time_limit_ms = job.spec.time_limit_s() * 1000;
  q.user = job.user;
  // The array's %N: every job of it carries it in its stored spec, so the
  // limit holds again after a restart.
  q.array_id = job.spec.array_task().id();
  q.array_limit = job.spec.array_task().limit();
  return q;
}

absl::Status SchedulerState::BeginAttempt(ActiveJob& job,
                                          const std::vector<Part>& parts,
                                          int64_t now, Outbox* starts) {
  mu_.AssertHeld();
  JobRecord& rec = job.record;
  rec.state = v1::JOB_STATE_RUNNING;
  rec.attempt += 1;
  rec.start_ms = now;
  rec.parts = parts;
  job.part_ended.assign(parts.size(), false);
  job.part_exit.assign(parts.size(), 0);
  job.failure.clear();
  preemptions().Forget(*this, rec.id);
  RETURN_IF_ERROR(store_->UpdateJob(rec));
  RETURN_IF_ERROR(store_->AddEvent(rec.id, rec.state, rec.attempt, now, ""));
  const bool train = rec.spec.has_train();
  // A launched command job's workers meet there (MASTER_PORT, addresses).
  const bool meets = train || !rec.spec.launch().empty();
  if (meets) rendezvous_.Open(rec.id, rec.attempt);
  // A command job's checkpoint ($DLBATCH_CHECKPOINT_DIR) resumes it as a
  // train job's does.
  RETURN_IF_ERROR(ChooseResume(*this, job, static_cast<int>(parts.size())));
  const bool per_part = PerPartCheckpoints(rec.spec);
  if (job.checkpoint.files_size() > 0) {
    RETURN_IF_ERROR(Diary(
        rec.id, rec.attempt,
        absl::StrCat("[dlbatch] attempt ", rec.attempt,
                     " resumes from the checkpoint stored at ",
                     train ? "iteration " : "step ", job.checkpoint.iteration(),
                     " (by attempt ", job.checkpoint.attempt(), ")",
                     per_part ? ", each part from its own" : "")));
  }
  int first_rank = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int part_first_rank = first_rank;
    first_rank += static_cast<int>(parts[i].devices.size());
    auto w = workers_.find(parts[i].worker);
    if (w == workers_.end()) continue;
    v1::SchedulerMessage msg;
    auto* start = msg.mutable_start();
    start->set_job_id(rec.id);
    start->set_attempt(rec.attempt);
    *start->mutable_spec() = rec.spec;
    start->mutable_devices()->Add(parts[i].devices.begin(),
                                  parts[i].devices.end());
    start->set_pool(rec.spec.pool());
    start->set_user(rec.user);
    start->set_part(static_cast<int>(i));
    start->set_parts(static_cast<int>(parts.size()));
    start->set_first_rank(part_first_rank);
    start->set_max_output_bytes(options_.max_output_bytes);
    if (meets)
      start->set_rendezvous_secret(rendezvous_.SecretFor(rec.id, rec.attempt));
    const v1::CheckpointStored* resume =
        !per_part ? &job.checkpoint
        : job.checkpoint.files_size() > 0
            ? FindKept(job.kept_checkpoints, static_cast<int>(i),
                       job.checkpoint.iteration())
            : nullptr;
    if (resume != nullptr) {
      *start->mutable_checkpoint() = resume->files();
      start->set_checkpoint_iteration(resume->iteration());
    }
    starts->emplace_back(w->second.session, std::move(msg));
  }
  Changed(rec.id);
  return absl::OkStatus();
}

absl::Status SchedulerState::SetState(ActiveJob& job, v1::JobState state,
                                      const std::string& reason) {
  mu_.AssertHeld();
  JobRecord& rec = job.record;
  const v1::JobState before = rec.state;
  rec.state = state;
  if (state == v1::JOB_STATE_CANCELLING) rec.reason = reason;
  RETURN_IF_ERROR(store_->UpdateJob(rec));
  if (job.part_ends_stored && state != v1::JOB_STATE_RUNNING &&
      state != v1::JOB_STATE_CANCELLING) {
    // Queued again or ended: its attempt's part ends are over.
    RETURN_IF_ERROR(store_->DeletePartEnds(rec.id));
    job.part_ends_stored = false;
  }
  RETURN_IF_ERROR(
      store_->AddEvent(rec.id, state, rec.attempt, clock_->NowMs(), reason));
  // A transaction rolled back reloads the counts with the store (Load).
  if (metrics_ != nullptr) {
    metrics_->JobMoved(rec.spec.profile(), before, state);
    if (state != v1::JOB_STATE_RUNNING && state != v1::JOB_STATE_CANCELLING)
      metrics_->JobProgressGone(rec.id);
  }
  Changed(rec.id);
  return absl::OkStatus();
}

absl::Status SchedulerState::EndJob(ActiveJob& job, v1::JobState state,
                                    int exit_code, const std::string& reason) {
  mu_.AssertHeld();
  JobRecord& rec = job.record;
  after_dirty_ = after_dirty_ || !waiting_after_.empty();
  RETURN_IF_ERROR(NoteLosses(job));
  // Ended while stopping for a preemption: it did not take place.
  RETURN_IF_ERROR(preemptions().Abandon(*this, job));
  preemptions().Forget(*this, rec.id);
  rendezvous_.Drop(rec.id);
  rec.end_ms = clock_->NowMs();
  rec.exit_code = exit_code;
  rec.reason = reason;
  return SetState(job, state, reason);
}

absl::Status SchedulerState::EndAsReported(ActiveJob& job, Outbox* out) {
  mu_.AssertHeld();
  JobRecord& rec = job.record;
  SlurmLockHeld();
  bridge().EndSettling(rec.id);
  // Stopped for a preemption (whatever its parts said, unless every one
  // finished well first): queued again as preempted.
  if (Preemptions::Stopping(job) && !job.cancel_requested &&
      !job.failure.empty()) {
    core_->Finished(rec.id, clock_->NowMs());
    RETURN_IF_ERROR(SaveUsage(rec.user));
    return preemptions().Requeue(*this, job, "", out);
  }
  if (job.requeue_requested && !job.cancel_requested) {
    core_->Finished(rec.id, clock_->NowMs());
    RETURN_IF_ERROR(SaveUsage(rec.user));
    return control().RequeueAsked(*this, job, out);
  }
  v1::JobState final_state = v1::JOB_STATE_FINISHED;
  std::string reason;
  if (job.cancel_requested) {
    final_state = v1::JOB_STATE_CANCELLED;
    reason = job.cancel_reason;
  } else if (!job.failure.empty()) {
    final_state = v1::JOB_STATE_FAILED;
    reason = job.failure;
  }
  const int64_t id = rec.id;  // rec goes with the entry
  core_->Finished(id, clock_->NowMs());
  RETURN_IF_ERROR(SaveUsage(rec.user));
  RETURN_IF_ERROR(EndJob(job, final_state, job.part_exit[0], reason));
  jobs_.erase(id);
  return absl::OkStatus();
}

absl::Status SchedulerState::RequeueLost(ActiveJob& job, const std::string& why,
                                         Outbox* out) {
  mu_.AssertHeld();
  JobRecord& rec = job.record;
  rendezvous_.Drop(rec.id);
  if (job.requeue_requested) {
    job.requeue_requested = false;
    RETURN_IF_ERROR(control().SaveControl(*this, job));
  }
  // Parts on other workers must stop too: the job restarts as a whole.
  CancelParts(job, why, -1, out);
  core_->Finished(
      rec.id,
      clock_->NowMs());  // other parts' slots (no-op if already released)
  RETURN_IF_ERROR(SaveUsage(rec.user));
  if (job.cancel_requested) {
    RETURN_IF_ERROR(
        EndJob(job, v1::JOB_STATE_CANCELLED, -1, job.cancel_reason));
    jobs_.erase(rec.id);
    return absl::OkStatus();
  }
  // Lost while stopping for a preemption: queued again as preempted.
  if (Preemptions::Stopping(job)) {
    return preemptions().Requeue(*this, job, why, out);
  }
  // Attempts a preemption ended are not counted.
  const int counted = rec.attempt - Preemptions::PreemptedAttempts(job);
  if (counted >= options_.max_attempts) {
    std::string reason = absl::StrCat(why, " (attempt ", counted, " of ",
                                      options_.max_attempts, ")");
    RETURN_IF_ERROR(Diary(rec.id, rec.attempt,
                          absl::StrCat("[dlbatch] ", reason, "; job failed")));
    RETURN_IF_ERROR(EndJob(job, v1::JOB_STATE_FAILED, -1, reason));
    jobs_.erase(rec.id);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Diary(
      rec.id, rec.attempt,
      absl::StrCat("[dlbatch] ", why, "; job requeued (attempt ", counted + 1,
                   " of ", options_.max_attempts, " next)")));
  return QueueAgain(job, why, out);
}

absl::Status SchedulerState::QueueAgain(ActiveJob& job,
                                        const std::string& reason,
                                        Outbox* out) {
  mu_.AssertHeld();
  JobRecord& rec = job.record;
  rec.parts.clear();
  job.part_ended.clear();
  job.part_exit.clear();
  job.failure.clear();
  RETURN_IF_ERROR(SetState(job, v1::JOB_STATE_QUEUED, reason));
  EnqueueJob(rec);
  // Workers that joined while it ran may not have been asked about its user.
  users().AskWorkers(*this, rec.spec.profile(), rec.user, out);
  return absl::OkStatus();
}

void SchedulerState::CancelParts(const ActiveJob& job, const std::string& why,
                                 int skip_part, Outbox* out) {
  mu_.AssertHeld();
  const JobRecord& rec = job.record;
  for (size_t p = 0; p < rec.parts.size(); ++p) {
    if (static_cast<int>(p) == skip_part ||
        (p < job.part_ended.size() && job.part_ended[p])) {
      continue;
    }
    auto w = workers_.find(rec.parts[p].worker);
    if (w == workers_.end() || !w->second.session) continue;
    v1::SchedulerMessage msg;
    auto* cancel = msg.mutable_cancel();
    cancel->set_job_id(rec.id);
    cancel->set_attempt(rec.attempt);
    cancel->set_part(static_cast<int>(p));
    cancel->set_grace_ms(options_.cancel_grace_ms);
    cancel->set_reason(why);
    out->emplace_back(w->second.session, std::move(msg));
  }
}

absl::Status SchedulerState::Diary(int64_t job_id, int attempt,
                                   const std::string& text) {
  mu_.AssertHeld();
  RETURN_IF_ERROR(
      store_->AddDiary(job_id, attempt, 0, -1, clock_->NowMs(), 0, text)
          .status());
  auto it = jobs_.find(job_id);
  if (it != jobs_.end() && it->second.diary.loaded) {
    DiaryCut& cut = it->second.diary.cut;
    (cut.marker_n == 0 ? cut.head_bytes : cut.tail_bytes) +=
        static_cast<int64_t>(text.size());
  }
  Changed(job_id);
  return absl::OkStatus();
}

absl::Status SchedulerState::NoteLosses(ActiveJob& job) {
  mu_.AssertHeld();
  if (job.disk_dropped_lines == 0) return absl::OkStatus();
  const int64_t lines = job.disk_dropped_lines;
  const int64_t bytes = job.disk_dropped_bytes;
  job.disk_dropped_lines = job.disk_dropped_bytes = 0;
  return Diary(job.record.id, job.record.attempt,
               absl::StrCat("[dlbatch] ", lines, " diary line",
                            lines == 1 ? "" : "s", " (", HumanBytes(bytes),
                            ") of this job were dropped: the scheduler's disk "
                            "was full"));
}

void SchedulerState::Changed(int64_t job_id) {
  mu_.AssertHeld();
  follow().Notify(job_id);  // its reads take mu_: after this commit
  watchers().PublishJob(*this, job_id);
}

v1::Job SchedulerState::RecordToProto(const JobRecord& rec) {
  v1::Job job;
  job.set_id(rec.id);
  *job.mutable_spec() = rec.spec;
  job.set_state(rec.state);
  job.set_attempt(rec.attempt);
  job.set_user(rec.user);
  job.set_submit_time_ms(rec.submit_ms);
  job.set_start_time_ms(rec.start_ms);
  job.set_end_time_ms(rec.end_ms);
  for (const Part& p : rec.parts) {
    auto* part = job.add_placement();
    part->set_worker_id(p.worker);
    part->mutable_devices()->Add(p.devices.begin(), p.devices.end());
  }
  job.set_exit_code(rec.exit_code);
  job.set_reason(rec.reason);
  job.set_sweep_id(rec.sweep_id);
  SetJobArrayFields(rec.spec, &job);
  return job;
}

}  // namespace dlbatch::scheduler
