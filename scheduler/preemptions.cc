// Preemption carried out: choosing (after each pass), stopping, requeueing.
#include "scheduler/preemptions.h"

#include <algorithm>
#include <csignal>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "proto/job_state.h"
#include "scheduler/control.h"
#include "scheduler/slurm/bridge.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

PreemptionKind KindOf(const v1::Preemption& p) {
  return p.kind() == kPreemptedByReclaim ? PreemptionKind::kReclaim
                                         : PreemptionKind::kPriority;
}

// The signal a command job's processes get first.
int CommandSignal(const v1::JobSpec& spec) {
  return StopSignalNumber(spec.preempt_signal()).value_or(SIGTERM);
}

}  // namespace

bool Preemptions::Stopping(const ActiveJob& job) {
  return !job.preemptions.empty() && !job.preemptions.back().done() &&
         job.preemptions.back().attempt() == job.record.attempt &&
         job.record.state != v1::JOB_STATE_QUEUED;
}

int Preemptions::PreemptedAttempts(const ActiveJob& job) {
  return static_cast<int>(
      std::count_if(job.preemptions.begin(), job.preemptions.end(),
                    [](const v1::Preemption& p) { return p.done(); }));
}

const PreemptionPolicy* Preemptions::PolicyOf(const SchedulerState& s,
                                              const std::string& profile) {
  auto it = s.options_.preemption.find(profile);
  if (it == s.options_.preemption.end() ||
      it->second.mode == PreemptionMode::kOff) {
    return nullptr;
  }
  return &it->second;
}

absl::Status Preemptions::Load(SchedulerState& s) {
  s.mu_.AssertHeld();
  s.preempting_for_.clear();
  ASSIGN_OR_RETURN(auto all, s.store_->ActivePreemptions());
  for (auto& [id, list] : all) {
    auto it = s.jobs_.find(id);
    if (it == s.jobs_.end()) continue;
    ActiveJob& job = it->second;
    job.preemptions = std::move(list);
    if (Stopping(job)) {
      s.preempting_for_[job.preemptions.back().by_job()].push_back(id);
    }
  }
  // When the newest checkpoint came is not stored: its progress report's
  // time is close (the report that announced it).
  for (auto& [id, job] : s.jobs_) {
    if (job.checkpoint.files_size() > 0) {
      job.checkpoint_ms = job.progress.time_ms();
    }
  }
  return absl::OkStatus();
}

absl::Status Preemptions::Pass(SchedulerState& s, Outbox* out) {
  s.mu_.AssertHeld();
  if (s.options_.preemption.empty() || !s.broken_.ok()) {
    return absl::OkStatus();
  }
  const int64_t now = s.clock_->NowMs();
  const RunningFactsFn facts = [&s](JobId id) {
    s.mu_.AssertHeld();
    return FactsOf(s, id);
  };
  std::vector<Chosen> chosen;
  s.SlurmLockHeld();
  for (const auto& [profile, policy] : s.options_.preemption) {
    // A Slurm profile's jobs wait in Slurm, not in the core: its bridge
    // hands them over after each reconcile (SlurmPass).
    if (policy.mode == PreemptionMode::kOff ||
        s.bridge().ProfileOf(profile) != nullptr) {
      continue;
    }
    std::optional<JobId> waiting = s.core_->FirstBlocked(profile);
    if (!waiting || s.preempting_for_.contains(*waiting)) continue;
    auto it = s.jobs_.find(*waiting);
    if (it == s.jobs_.end()) continue;
    std::vector<Displacement> displaced;
    for (const v1::Preemption& p : it->second.preemptions) {
      displaced.push_back({p.by_job(), KindOf(p)});
    }
    PreemptionChoice choice =
        ChooseVictims(*s.core_, *waiting, displaced, policy, now, facts);
    if (choice.victims.empty()) continue;
    chosen.push_back({*waiting, std::move(choice.victims), &policy});
  }
  return Carry(s, chosen, out);
}

RunningFacts Preemptions::FactsOf(const SchedulerState& s, JobId id) {
  s.mu_.AssertHeld();
  RunningFacts f;
  auto it = s.jobs_.find(id);
  if (it == s.jobs_.end()) {
    f.preemptible = false;
    return f;
  }
  const ActiveJob& job = it->second;
  const v1::JobSpec& spec = job.record.spec;
  const PreemptionPolicy* policy = PolicyOf(s, spec.profile());
  // A job already on its way out frees its slots anyway.
  f.preemptible = policy != nullptr &&
                  (spec.has_preemptible() ? spec.preemptible()
                                          : policy->jobs_preemptible) &&
                  !job.cancel_requested && !job.requeue_requested &&
                  !Stopping(job);
  if (job.checkpoint.files_size() > 0 && job.checkpoint_ms > 0) {
    f.checkpoint = job.checkpoint_ms;
  }
  return f;
}

absl::Status Preemptions::Carry(SchedulerState& s,
                                const std::vector<Chosen>& chosen,
                                Outbox* out) {
  s.mu_.AssertHeld();
  if (chosen.empty()) return absl::OkStatus();
  Outbox stops;  // sent only once committed
  RETURN_IF_ERROR(s.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_) {
    for (const Chosen& c : chosen) {
      const ActiveJob& waiting = s.jobs_.at(c.waiting);
      std::vector<JobId> ids;
      for (const Victim& v : c.victims) {
        auto it = s.jobs_.find(v.id);
        if (it == s.jobs_.end()) continue;
        RETURN_IF_ERROR(
            Start(s, it->second, waiting, v.kind, *c.policy, &stops));
        ids.push_back(v.id);
      }
      if (ids.empty()) continue;
      RETURN_IF_ERROR(s.Diary(
          c.waiting, waiting.record.attempt,
          absl::StrCat("[dlbatch] ", PreemptingText(ids, c.policy->grace_ms),
                       " to start")));
      spdlog::info("job {}: {}", c.waiting,
                   PreemptingText(ids, c.policy->grace_ms));
      s.Changed(c.waiting);
    }
    return absl::OkStatus();
  }));
  for (auto& m : stops) out->push_back(std::move(m));
  return absl::OkStatus();
}

absl::Status Preemptions::SlurmPass(SchedulerState& s,
                                    const slurm::SlurmPreemptionView& view,
                                    Outbox* out) {
  s.mu_.AssertHeld();
  const PreemptionPolicy* policy = PolicyOf(s, view.profile);
  if (policy == nullptr || !s.broken_.ok()) return absl::OkStatus();
  // The first in dlbatch's order of the jobs Slurm holds for resources.
  const slurm::SlurmPreemptionView::Waiting* first = nullptr;
  const ActiveJob* waiting = nullptr;
  for (const slurm::SlurmPreemptionView::Waiting& w : view.waiting) {
    auto it = s.jobs_.find(w.job_id);
    if (it == s.jobs_.end()) continue;
    const ActiveJob& job = it->second;
    if (job.record.state != v1::JOB_STATE_QUEUED || job.held ||
        job.cancel_requested || job.record.spec.profile() != view.profile) {
      continue;
    }
    auto order = [](const ActiveJob& j) {
      return std::make_tuple(-j.record.spec.priority(), j.record.submit_ms,
                             j.record.id);
    };
    if (waiting == nullptr || order(job) < order(*waiting)) {
      waiting = &job;
      first = &w;
    }
  }
  // Its victims are stopping: what they free goes to it.
  if (waiting == nullptr || s.preempting_for_.contains(waiting->record.id)) {
    return absl::OkStatus();
  }
  const int64_t now = s.clock_->NowMs();
  NodePreemptionInput in;
  in.job.id = waiting->record.id;
  in.job.user = waiting->record.user;
  in.job.priority = waiting->record.spec.priority();
  for (const v1::Preemption& p : waiting->preemptions) {
    in.job.displaced.push_back({p.by_job(), KindOf(p)});
  }
  in.nodes = first->nodes;
  in.per_node = first->per_node;
  in.room = view.room;
  for (const slurm::SlurmPreemptionView::Running& r : view.running) {
    auto it = s.jobs_.find(r.job_id);
    if (it == s.jobs_.end() ||
        it->second.record.state != v1::JOB_STATE_RUNNING) {
      continue;
    }
    const JobRecord& rec = it->second.record;
    NodeCandidate& c = in.running.emplace_back();
    c.job.id = rec.id;
    c.job.user = rec.user;
    c.job.priority = rec.spec.priority();
    c.job.started = rec.start_ms;
    const RunningFacts f = FactsOf(s, rec.id);
    c.job.preemptible = f.preemptible;
    c.job.checkpoint = f.checkpoint;
    c.nodes = r.nodes;
    c.per_node = r.per_node;
  }
  // Fair shares among the users with jobs on the profile, queued or
  // running (the core's decayed usage), for reclaims.
  if (policy->mode == PreemptionMode::kFairShare) {
    std::set<std::string> users = {waiting->record.user};
    for (const auto& [id, job] : s.jobs_) {
      if (job.record.spec.profile() == view.profile) {
        users.insert(job.record.user);
      }
    }
    double total = 0;
    for (const UserUsage& u : s.core_->Usage(now)) {
      if (!users.contains(u.user)) continue;
      in.usage.push_back(u);
      total += u.slot_seconds;
    }
    for (UserUsage& u : in.usage) {
      u.share = total > 0 ? u.slot_seconds / total : 0;
    }
  }
  PreemptionChoice choice = ChooseVictimsOnNodes(in, *policy, now);
  if (choice.victims.empty()) return absl::OkStatus();
  return Carry(s, {{waiting->record.id, std::move(choice.victims), policy}},
               out);
}

absl::Status Preemptions::Start(SchedulerState& s, ActiveJob& victim,
                                const ActiveJob& waiting, PreemptionKind kind,
                                const PreemptionPolicy& policy, Outbox* out) {
  s.mu_.AssertHeld();
  JobRecord& rec = victim.record;
  v1::Preemption p;
  p.set_by_job(waiting.record.id);
  p.set_by_priority(waiting.record.spec.priority());
  p.set_kind(kind == PreemptionKind::kReclaim ? kPreemptedByReclaim
                                              : kPreemptedByPriority);
  RETURN_IF_ERROR(Open(s, victim, policy.grace_ms, p));
  s.preempting_for_[waiting.record.id].push_back(rec.id);
  const std::string grace = DurationText(policy.grace_ms);
  RETURN_IF_ERROR(s.Diary(
      rec.id, rec.attempt,
      rec.spec.has_train()
          ? absl::StrCat("[dlbatch] ", PreemptedByText(p), ": attempt ",
                         rec.attempt, " stops at a checkpoint (within ", grace,
                         ") and the job is queued again to resume from it")
          : absl::StrCat("[dlbatch] ", PreemptedByText(p), ": attempt ",
                         rec.attempt, " is stopped (within ", grace,
                         ") and the job is queued again")));
  spdlog::info("job {}: {}", rec.id, PreemptedByText(p));
  for (size_t part = 0; part < rec.parts.size(); ++part) {
    if (part < victim.part_ended.size() && victim.part_ended[part]) continue;
    auto w = s.workers_.find(rec.parts[part].worker);
    if (w == s.workers_.end() || !w->second.session) continue;
    out->emplace_back(w->second.session,
                      StopMessage(s, victim, static_cast<int>(part)));
  }
  s.Changed(rec.id);
  return absl::OkStatus();
}

absl::Status Preemptions::Open(SchedulerState& s, ActiveJob& job,
                               int64_t grace_ms, v1::Preemption p) {
  s.mu_.AssertHeld();
  const int64_t now = s.clock_->NowMs();
  p.set_time_ms(now);
  p.set_attempt(job.record.attempt);
  p.set_deadline_ms(now + grace_ms);
  job.preemptions.push_back(std::move(p));
  return s.store_->PutPreemption(job.record.id,
                                 static_cast<int>(job.preemptions.size()) - 1,
                                 job.preemptions.back());
}

v1::SchedulerMessage Preemptions::StopMessage(const SchedulerState& s,
                                              const ActiveJob& job,
                                              int part) const {
  s.mu_.AssertHeld();
  const v1::Preemption& p = job.preemptions.back();
  v1::SchedulerMessage msg;
  v1::CancelJob* cancel = msg.mutable_cancel();
  cancel->set_job_id(job.record.id);
  cancel->set_attempt(job.record.attempt);
  cancel->set_part(part);
  // Asked again after a restart: what is left of the grace (a second at
  // least, so the job still gets its signal before the kill).
  cancel->set_grace_ms(
      std::max<int64_t>(1000, p.deadline_ms() - s.clock_->NowMs()));
  cancel->set_reason(PreemptedByText(p));
  cancel->set_preempt(true);
  if (!job.record.spec.has_train())
    cancel->set_signal(CommandSignal(job.record.spec));
  return msg;
}

void Preemptions::Release(SchedulerState& s, const v1::Preemption& p,
                          int64_t victim) {
  s.mu_.AssertHeld();
  auto it = s.preempting_for_.find(p.by_job());
  if (it == s.preempting_for_.end()) return;
  std::erase(it->second, victim);
  if (it->second.empty()) s.preempting_for_.erase(it);
}

absl::Status Preemptions::Requeue(SchedulerState& s, ActiveJob& job,
                                  const std::string& lost, Outbox* out) {
  s.mu_.AssertHeld();
  JobRecord& rec = job.record;
  const int64_t now = s.clock_->NowMs();
  v1::Preemption& p = job.preemptions.back();
  const bool has_checkpoint = job.checkpoint.files_size() > 0;
  // Work since the newest stored checkpoint, or the attempt's start; none
  // when a checkpoint came after the signal (the one written at it).
  const int64_t saved =
      std::max(rec.start_ms, has_checkpoint ? job.checkpoint_ms : 0);
  const int64_t lost_ms = has_checkpoint && job.checkpoint_ms >= p.time_ms()
                              ? 0
                              : std::max<int64_t>(0, now - saved);
  p.set_done(true);
  p.set_resume_iteration(has_checkpoint ? job.checkpoint.iteration() : 0);
  p.set_lost_ms(lost_ms);
  RETURN_IF_ERROR(s.store_->PutPreemption(
      rec.id, static_cast<int>(job.preemptions.size()) - 1, p));
  Release(s, p, rec.id);
  s.rendezvous_.Drop(rec.id);
  if (job.requeue_requested) {
    job.requeue_requested = false;  // it is queued again anyway
    RETURN_IF_ERROR(s.control().SaveControl(s, job));
  }
  std::string what =
      lost.empty()
          ? absl::StrCat("[dlbatch] attempt ", rec.attempt, " stopped, ",
                         PreemptedByText(p))
          : absl::StrCat("[dlbatch] ", lost, " while attempt ", rec.attempt,
                         " was stopping, ", PreemptedByText(p));
  absl::StrAppend(
      &what, "; queued again",
      rec.spec.has_train()
          ? (has_checkpoint
                 ? absl::StrCat(", resumes from iteration ",
                                job.checkpoint.iteration())
                 : std::string(", starts afresh (no checkpoint stored)"))
          : std::string(),
      lost_ms > 0 ? absl::StrCat("; ", DurationText(lost_ms),
                                 " of work since its last checkpoint is lost")
                  : std::string(),
      " (a preemption does not count against its ", s.options_.max_attempts,
      " attempts)");
  RETURN_IF_ERROR(s.Diary(rec.id, rec.attempt, what));
  RETURN_IF_ERROR(s.QueueAgain(job, PreemptedByText(p), out));
  if (s.metrics_ != nullptr) {
    s.metrics_->Preempted(rec.spec.profile(), p.kind(),
                          static_cast<double>(lost_ms) / 1000);
  }
  return absl::OkStatus();
}

absl::Status Preemptions::Abandon(SchedulerState& s, ActiveJob& job) {
  s.mu_.AssertHeld();
  if (!Stopping(job)) return absl::OkStatus();
  const v1::Preemption p = job.preemptions.back();
  RETURN_IF_ERROR(s.store_->DeletePreemption(
      job.record.id, static_cast<int>(job.preemptions.size()) - 1));
  job.preemptions.pop_back();
  Release(s, p, job.record.id);
  return absl::OkStatus();
}

void Preemptions::Forget(SchedulerState& s, int64_t job_id) {
  s.mu_.AssertHeld();
  s.preempting_for_.erase(job_id);
}

std::string Preemptions::WaitReason(const SchedulerState& s,
                                    const ActiveJob& job) const {
  s.mu_.AssertHeld();
  auto it = s.preempting_for_.find(job.record.id);
  if (it == s.preempting_for_.end() || it->second.empty()) return "";
  const PreemptionPolicy* policy = PolicyOf(s, job.record.spec.profile());
  return PreemptingText(it->second, policy != nullptr ? policy->grace_ms
                                                      : kDefaultPreemptGraceMs);
}

}  // namespace dlbatch::scheduler
