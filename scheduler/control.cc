// Worker administration (drain, resume, remove, forgetting lost workers)
// and job control (hold, release, requeue, --after).
#include "scheduler/control.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/duration.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/core/job_control.h"
#include "scheduler/core/worker_wait_text.h"
#include "scheduler/watchers.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {

absl::Status Control::Load(SchedulerState& s) {
  s.mu_.AssertHeld();
  ASSIGN_OR_RETURN(std::vector<WorkerDrain> drains, s.store_->Drains());
  for (const WorkerDrain& d : drains) {
    if (WorkerState* w = FindWorkerNamed(s, d.name)) {
      w->draining = true;
      w->drain_reason = d.reason;
      s.core_->SetDraining(w->record.id, true);
    }
  }
  ASSIGN_OR_RETURN(std::vector<JobControlRecord> controls,
                   s.store_->JobControls());
  s.waiting_after_.clear();
  for (JobControlRecord& c : controls) {
    auto it = s.jobs_.find(c.job_id);
    if (it == s.jobs_.end()) continue;
    ActiveJob& job = it->second;
    job.held = c.held;
    job.after = std::move(c.after);
    job.requeue_requested =
        c.requeue && job.record.state != v1::JOB_STATE_QUEUED;
    if (job.record.state == v1::JOB_STATE_QUEUED &&
        (job.held || !job.after.empty())) {
      s.core_->Dequeue(c.job_id);
    }
    if (!job.after.empty()) s.waiting_after_.insert(c.job_id);
  }
  s.after_dirty_ = !s.waiting_after_.empty();
  return absl::OkStatus();
}

SchedulerState::WorkerState* Control::FindWorkerNamed(SchedulerState& s,
                                                      const std::string& name) {
  s.mu_.AssertHeld();
  for (auto& [id, w] : s.workers_) {
    if (w.record.name == name) return &w;
  }
  int64_t id;
  if (absl::SimpleAtoi(name, &id)) {
    auto it = s.workers_.find(id);
    if (it != s.workers_.end()) return &it->second;
  }
  return nullptr;
}

namespace {

absl::Status NoWorker(const std::string& name) {
  return absl::NotFoundError(absl::StrCat(
      "no worker '", name, "'; `dlbatch workers` lists them by name"));
}

}  // namespace

absl::StatusOr<v1::WorkerInfo> Control::DrainWorker(const std::string& name,
                                                    bool drain,
                                                    const std::string& reason) {
  Outbox out;
  v1::WorkerInfo info;
  {
    absl::MutexLock lock(&state_.mu_);
    WorkerState* w = FindWorkerNamed(state_, name);
    if (w == nullptr) return NoWorker(name);
    if (!state_.broken_.ok()) RETURN_IF_ERROR(state_.CheckWritable());
    const std::string worker_name = w->record.name;
    RETURN_IF_ERROR(
        state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
          if (drain) {
            return state_.store_->PutDrain(
                {worker_name, reason, state_.clock_->NowMs()});
          }
          return state_.store_->DeleteDrain(worker_name);
        }));
    w = FindWorkerNamed(state_, worker_name);  // a failed write reloads memory
    if (w == nullptr) return NoWorker(name);
    w->draining = drain;
    w->drain_reason = drain ? reason : "";
    state_.core_->SetDraining(w->record.id, drain);
    spdlog::info("worker '{}' {}{}", worker_name, drain ? "drained" : "resumed",
                 reason.empty() ? "" : absl::StrCat(": ", reason));
    state_.watchers().PublishWorker(state_, w->record.id);
    // Jobs waiting on the profile show the change in their wait reason.
    for (const auto& [id, job] : state_.jobs_) {
      if (job.record.state == v1::JOB_STATE_QUEUED &&
          job.record.spec.profile() == w->record.profile) {
        state_.watchers().PublishJob(state_, id);
      }
    }
    info = state_.watchers().WorkerView(state_, *w);
    info.clear_running_jobs();
    for (const auto& [id, job] : state_.jobs_) {
      if (job.record.state == v1::JOB_STATE_QUEUED) continue;
      for (const Part& p : job.record.parts) {
        if (p.worker == w->record.id) {
          info.add_running_jobs(id);
          break;
        }
      }
    }
    if (!drain) (void)state_.PlaceJobs(&out);
  }
  state_.Deliver(out);
  return info;
}

absl::StatusOr<v1::RemoveWorkerReply> Control::RemoveWorker(
    const std::string& name) {
  v1::RemoveWorkerReply reply;
  Outbox out;
  {
    absl::MutexLock lock(&state_.mu_);
    WorkerState* w = FindWorkerNamed(state_, name);
    if (w == nullptr) return NoWorker(name);
    const std::string& n = w->record.name;
    if (w->session) {
      if (!w->draining) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker '", n,
            "' is connected; drain it first (dlbatch admin drain ", n,
            "), let its jobs end, then remove it, or stop its dlbatch-worker"));
      }
      ActiveJob* busy = nullptr;
      for (auto& [id, job] : state_.jobs_) {
        for (const Part& p : job.record.parts) {
          if (job.record.state != v1::JOB_STATE_QUEUED &&
              p.worker == w->record.id) {
            busy = &job;
          }
        }
      }
      if (busy != nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker '", n, "' is drained but still runs job ", busy->record.id,
            "; wait for it to end (dlbatch wait ", busy->record.id,
            ") or cancel it, then remove the worker"));
      }
    }
    if (!state_.broken_.ok()) RETURN_IF_ERROR(state_.CheckWritable());
    *reply.mutable_worker() = state_.watchers().WorkerView(state_, *w);
    const int64_t id = w->record.id;
    std::vector<int64_t> failed;
    RETURN_IF_ERROR(
        state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
          return ForgetWorker(state_, id, "removed by an admin", &failed);
        }));
    reply.mutable_failed_jobs()->Add(failed.begin(), failed.end());
    (void)state_.PlaceJobs(&out);
  }
  state_.Deliver(out);
  return reply;
}

absl::Status Control::ForgetWorker(SchedulerState& s, int64_t worker_id,
                                   const std::string& why,
                                   std::vector<int64_t>* failed) {
  s.mu_.AssertHeld();
  auto it = s.workers_.find(worker_id);
  if (it == s.workers_.end()) return absl::OkStatus();
  WorkerState& w = it->second;
  const std::string name = w.record.name;
  Outbox ignored;  // a removed worker is sent nothing more
  if (w.session) {
    // A worker that leaves when told it was removed is told so. An older
    // one reconnects at once: that registration is refused (its daemon
    // stops). Either way a later start of it joins afresh.
    if (!w.session->leaves_when_removed()) s.refuse_once_.insert(name);
    s.session_worker_.erase(w.session.get());
    w.session->CloseRemoved(
        absl::StrCat("this worker was ", why, "; start it again to rejoin"));
    w.session = nullptr;
  }
  // Its running jobs (a lost worker has none left) are requeued first.
  for (JobId job_id : s.core_->WorkerLost(worker_id)) {
    auto j = s.jobs_.find(job_id);
    if (j != s.jobs_.end()) {
      RETURN_IF_ERROR(s.RequeueLost(j->second, why, &ignored));
    }
  }
  s.core_->ForgetWorker(worker_id);
  RETURN_IF_ERROR(s.store_->DeleteWorker(worker_id));
  RETURN_IF_ERROR(s.store_->DeleteDrain(name));
  w.draining = false;
  s.watchers().PublishRemoved(s, w);
  s.workers_.erase(it);
  spdlog::warn("worker '{}' (#{}) {}; its slots leave its profile", name,
               worker_id, why);
  // The profile shrank: queued jobs it can never start fail now.
  for (const auto& [job_id, reason] : s.core_->Unrunnable()) {
    auto j = s.jobs_.find(job_id);
    if (j == s.jobs_.end()) continue;
    const std::string text = absl::StrCat(
        "can never start: ", reason, " (worker '", name, "' was ", why, ")");
    s.core_->Dequeue(job_id);
    RETURN_IF_ERROR(s.Diary(job_id, j->second.record.attempt,
                            absl::StrCat("[dlbatch] ", text)));
    RETURN_IF_ERROR(s.EndJob(j->second, v1::JOB_STATE_FAILED, -1, text));
    s.waiting_after_.erase(job_id);
    s.jobs_.erase(j);
    failed->push_back(job_id);
  }
  return absl::OkStatus();
}

void Control::ForgetOffline(SchedulerState& s, Outbox* out) {
  s.mu_.AssertHeld();
  if (s.options_.forget_offline_ms <= 0) return;
  const int64_t now = s.clock_->MonotonicMs();
  std::vector<int64_t> old;
  for (const auto& [id, w] : s.workers_) {
    if (w.lost && !w.session &&
        now - w.last_seen_mono > s.options_.forget_offline_ms) {
      old.push_back(id);
    }
  }
  if (old.empty()) return;
  std::vector<int64_t> failed;
  absl::Status forgot =
      s.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_) {
        for (int64_t id : old) {
          RETURN_IF_ERROR(ForgetWorker(
              s, id,
              absl::StrCat("removed after being offline for over ",
                           FormatDurationMs(s.options_.forget_offline_ms),
                           " (--forget-offline-after)"),
              &failed));
        }
        return absl::OkStatus();
      });
  if (forgot.ok()) (void)s.PlaceJobs(out);
}

absl::Status Control::SaveControl(SchedulerState& s, const ActiveJob& job) {
  s.mu_.AssertHeld();
  JobControlRecord c;
  c.job_id = job.record.id;
  c.held = job.held;
  c.after = job.after;
  c.requeue = job.requeue_requested;
  return s.store_->PutJobControl(c);
}

std::string Control::ControlWaitReason(const SchedulerState& s,
                                       const ActiveJob& job) const {
  s.mu_.AssertHeld();
  if (job.held) {
    return absl::StrCat("held; `dlbatch release ", job.record.id,
                        "` lets it start");
  }
  if (job.after.empty()) return "";
  std::vector<AfterJob> after;
  for (int64_t id : job.after) {
    auto it = s.jobs_.find(id);
    // Ended ones are resolved by ResolveAfter; until then they count as
    // ended well, which only shortens the message.
    after.push_back({id,
                     it == s.jobs_.end()
                         ? std::optional(v1::JOB_STATE_FINISHED)
                         : std::optional(it->second.record.state),
                     ""});
  }
  return DecideAfter(after).reason;
}

std::string Control::WorkersWaitReason(const SchedulerState& s,
                                       const WaitInfo& info) const {
  s.mu_.AssertHeld();
  if (info.fits_online || (info.draining.empty() && info.offline.empty())) {
    return "";
  }
  std::vector<WaitedWorker> waited;
  for (const std::vector<WorkerId>* ids : {&info.draining, &info.offline}) {
    for (WorkerId id : *ids) {
      auto it = s.workers_.find(id);
      if (it == s.workers_.end()) continue;
      const WorkerState& w = it->second;
      waited.push_back({w.record.name, ids == &info.draining, w.drain_reason,
                        w.record.last_seen_ms});
    }
  }
  if (waited.empty()) return "";
  return WaitingForWorkers(waited, s.clock_->NowMs());
}

WorkerLabeler Control::Labels(const SchedulerState& s) const {
  s.mu_.AssertHeld();
  return [&s](WorkerId id) {
    s.mu_.AssertHeld();
    auto it = s.workers_.find(id);
    if (it == s.workers_.end())
      return WorkerLabel{absl::StrCat("#", id), "offline"};
    return WorkerLabel{
        it->second.record.name,
        OfflineSince(it->second.record.last_seen_ms, s.clock_->NowMs())};
  };
}

absl::Status Control::ResolveAfter(SchedulerState& s) {
  s.mu_.AssertHeld();
  if (!s.after_dirty_) return absl::OkStatus();
  s.after_dirty_ = false;
  return s.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_) {
    // A failed job fails those that wait for it, in turn.
    for (bool changed = true; changed;) {
      changed = false;
      for (int64_t id : std::vector<int64_t>(s.waiting_after_.begin(),
                                             s.waiting_after_.end())) {
        auto found = s.jobs_.find(id);
        if (found == s.jobs_.end()) {  // cancelled while it waited
          s.waiting_after_.erase(id);
          continue;
        }
        ActiveJob& job = found->second;
        std::vector<AfterJob> after;
        for (int64_t dep : job.after) {
          auto it = s.jobs_.find(dep);
          if (it != s.jobs_.end()) {
            after.push_back({dep, it->second.record.state, ""});
            continue;
          }
          // The writer's view: a job ended in this transaction counts.
          ASSIGN_OR_RETURN(std::optional<v1::JobState> state,
                           s.store_->JobState(dep));
          std::string reason;
          if (state && *state != v1::JOB_STATE_FINISHED) {
            auto rec = s.reader_->GetJob(dep);
            if (rec.ok() && *rec) reason = (*rec)->reason;
          }
          after.push_back({dep, state, reason});
        }
        AfterVerdict verdict = DecideAfter(after);
        if (verdict.kind == AfterVerdict::kWait) continue;
        changed = true;
        s.waiting_after_.erase(id);
        job.after.clear();
        if (verdict.kind == AfterVerdict::kReady) {
          RETURN_IF_ERROR(SaveControl(s, job));
          if (!job.held) s.EnqueueJob(job.record);
          s.Changed(id);
          continue;
        }
        RETURN_IF_ERROR(SaveControl(s, job));
        RETURN_IF_ERROR(s.Diary(
            id, job.record.attempt,
            absl::StrCat("[dlbatch] ", verdict.reason, "; job failed")));
        RETURN_IF_ERROR(
            s.EndJob(job, v1::JOB_STATE_FAILED, -1, verdict.reason));
        s.jobs_.erase(id);
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::ControlJobsReply> Control::ControlJobs(
    const v1::ControlJobsRequest& request) {
  const v1::JobControl action = request.action();
  if (action != v1::JOB_CONTROL_HOLD && action != v1::JOB_CONTROL_RELEASE &&
      action != v1::JOB_CONTROL_REQUEUE) {
    return absl::InvalidArgumentError(
        "say what to do: hold, release or requeue");
  }
  v1::ControlJobsReply reply;
  Outbox out;
  {
    absl::MutexLock lock(&state_.mu_);
    RETURN_IF_ERROR(state_.CheckWritable());
    RETURN_IF_ERROR(state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                             state_.mu_) {
      for (int64_t id : request.job_ids()) {
        v1::ControlResult* result = reply.add_results();
        result->set_job_id(id);
        auto it = state_.jobs_.find(id);
        if (it == state_.jobs_.end()) {
          if (action == v1::JOB_CONTROL_REQUEUE) {
            RETURN_IF_ERROR(RequeueEnded(state_, id, result));
            continue;
          }
          ASSIGN_OR_RETURN(auto state, state_.store_->JobState(id));
          if (!state) {
            result->set_error(absl::StrCat("no job ", id));
          } else {
            result->set_state(*state);
            result->set_error(absl::StrCat("job ", id, " has already ",
                                           JobStateName(*state)));
          }
          continue;
        }
        ActiveJob& job = it->second;
        const bool queued = job.record.state == v1::JOB_STATE_QUEUED;
        result->set_state(job.record.state);
        if (action == v1::JOB_CONTROL_HOLD) {
          if (!queued) {
            result->set_error(absl::StrCat(
                "job ", id, " is ", JobStateName(job.record.state),
                "; hold keeps a queued job from starting (dlbatch requeue ", id,
                " stops it and queues it again)"));
            continue;
          }
          if (job.held) continue;
          job.held = true;
          state_.core_->Dequeue(id);
          RETURN_IF_ERROR(SaveControl(state_, job));
          RETURN_IF_ERROR(state_.Diary(id, job.record.attempt,
                                       "[dlbatch] held by request"));
        } else if (action == v1::JOB_CONTROL_RELEASE) {
          if (!job.held) {
            result->set_error(absl::StrCat("job ", id, " is not held"));
            continue;
          }
          job.held = false;
          if (job.after.empty()) state_.EnqueueJob(job.record);
          RETURN_IF_ERROR(SaveControl(state_, job));
          RETURN_IF_ERROR(state_.Diary(id, job.record.attempt,
                                       "[dlbatch] released by request"));
        } else {
          if (queued) {
            result->set_error(absl::StrCat("job ", id, " is queued already"));
            continue;
          }
          if (job.cancel_requested) {
            result->set_error(absl::StrCat("job ", id, " is being cancelled"));
            continue;
          }
          if (job.requeue_requested) continue;
          job.requeue_requested = true;
          RETURN_IF_ERROR(SaveControl(state_, job));
          RETURN_IF_ERROR(state_.Diary(
              id, job.record.attempt,
              absl::StrCat("[dlbatch] requeue requested: stopping attempt ",
                           job.record.attempt,
                           "; it is queued again once it has stopped")));
          state_.CancelParts(job, "requeued by request", -1, &out);
        }
        state_.Changed(id);
      }
      return absl::OkStatus();
    }));
    (void)state_.PlaceJobs(&out);
  }
  state_.Deliver(out);
  return reply;
}

absl::Status Control::RequeueEnded(SchedulerState& s, int64_t id,
                                   v1::ControlResult* result) {
  s.mu_.AssertHeld();
  ASSIGN_OR_RETURN(auto rec, s.reader_->GetJob(id));
  if (!rec) {
    result->set_error(absl::StrCat("no job ", id));
    return absl::OkStatus();
  }
  result->set_state(rec->state);
  if (rec->state == v1::JOB_STATE_FINISHED) {
    result->set_error(absl::StrCat(
        "job ", id,
        " finished well; requeue takes failed or cancelled jobs (submit it "
        "again to run it anew)"));
    return absl::OkStatus();
  }
  if (!IsTerminal(rec->state)) {
    result->set_error(absl::StrCat("job ", id, " is ending; try again"));
    return absl::OkStatus();
  }
  if (absl::Status fits =
          s.bridge().ProfileOf(rec->spec.profile()) != nullptr
              ? absl::OkStatus()
              : s.core_->CheckSatisfiable(s.ToQueued(*rec), Labels(s));
      !fits.ok()) {
    result->set_error(
        absl::StrCat("job ", id, " cannot be queued again: ", fits.message()));
    return absl::OkStatus();
  }
  ActiveJob& job = s.jobs_[id];
  job.record = std::move(*rec);
  JobRecord& r = job.record;
  r.parts.clear();
  r.end_ms = 0;
  r.exit_code = 0;
  r.reason.clear();
  // Any job's: a command job reports progress and checkpoints too.
  {
    ASSIGN_OR_RETURN(TrainState train, s.store_->GetTrainState(id));
    job.progress = std::move(train.progress);
    job.checkpoint = std::move(train.checkpoint);
    ASSIGN_OR_RETURN(job.kept_checkpoints, s.store_->KeptCheckpoints(id));
  }
  RETURN_IF_ERROR(SaveControl(s, job));  // nothing left of before
  RETURN_IF_ERROR(
      s.Diary(id, r.attempt,
              absl::StrCat("[dlbatch] requeued by request after it ",
                           JobStateName(r.state))));
  RETURN_IF_ERROR(s.SetState(job, v1::JOB_STATE_QUEUED, "requeued by request"));
  s.EnqueueJob(r);
  result->set_state(v1::JOB_STATE_QUEUED);
  return absl::OkStatus();
}

absl::Status Control::RequeueAsked(SchedulerState& s, ActiveJob& job,
                                   Outbox* out) {
  s.mu_.AssertHeld();
  JobRecord& rec = job.record;
  s.rendezvous_.Drop(rec.id);
  job.requeue_requested = false;
  RETURN_IF_ERROR(SaveControl(s, job));
  RETURN_IF_ERROR(s.Diary(
      rec.id, rec.attempt,
      absl::StrCat("[dlbatch] attempt ", rec.attempt,
                   " stopped; job requeued by request",
                   job.checkpoint.files_size() > 0
                       ? absl::StrCat(" (resumes from the checkpoint at "
                                      "iteration ",
                                      job.checkpoint.iteration(), ")")
                       : std::string())));
  return s.QueueAgain(job, "requeued by request", out);
}

}  // namespace dlbatch::scheduler
