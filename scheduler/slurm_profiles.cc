// The scheduler's side of profiles of Slurm: Side, the host the Slurm
// bridge (slurm/bridge.h) reaches its jobs and workers through, and the
// calls that hand over to the bridge.
#include "scheduler/slurm_profiles.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/control.h"
#include "scheduler/preemptions.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {

// Each method is the SlurmHost's of the same name (slurm/host.h), called
// with mu_ held: the scheduler's own, applied to the job or worker named.
class SlurmProfiles::Side final : public slurm::SlurmHost {
 public:
  explicit Side(SchedulerState& s) : s_(s) {}

  absl::Mutex& mutex() const override ABSL_LOCK_RETURNED(s_.mu_) {
    return s_.mu_;
  }
  std::optional<slurm::HostJob> FindJob(int64_t id) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  slurm::WorkerParts PartsOn(int64_t worker) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  void JobChanged(int64_t id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    s_.mu_.AssertHeld();
    s_.Changed(id);
  }
  void Enqueue(int64_t id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    s_.mu_.AssertHeld();
    auto it = s_.jobs_.find(id);
    if (it != s_.jobs_.end()) s_.EnqueueJob(it->second.record);
  }
  void Refuse(int64_t worker, const std::string& why,
              slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  void WithLock(const std::function<void(slurm::WorkerMail&)>& body) override
      ABSL_LOCKS_EXCLUDED(s_.mu_);
  absl::Status InTransaction(const std::function<absl::Status()>& body) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    s_.mu_.AssertHeld();
    return s_.InTransaction(body);
  }
  absl::Status CommitRecord(const slurm::SlurmJobRecord& record) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status CommitForget(int64_t job) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status Preempt(const slurm::SlurmPreemptionView& view,
                       slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    s_.mu_.AssertHeld();
    return s_.preemptions().SlurmPass(s_, view, mail.out);
  }
  absl::Status PutResubmits(int64_t job, int count) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    s_.mu_.AssertHeld();
    return s_.store_->PutSlurmResubmits(job, count);
  }
  absl::Status Note(int64_t job, const std::string& text) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status EndQueued(int64_t job, v1::JobState state,
                         const std::string& note,
                         const std::string& reason) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status StartOnGang(int64_t job, const std::vector<Part>& parts,
                           slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status RequeueLost(int64_t job, const std::string& why,
                           slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status RequeuePreempted(int64_t job, const std::string& why,
                                slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status FailRunning(int64_t job, const std::string& why,
                           slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status EndAsReported(int64_t job, slurm::WorkerMail& mail) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_);
  absl::Status ForgetWorker(int64_t worker, const std::string& why) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    s_.mu_.AssertHeld();
    std::vector<int64_t> failed;
    return s_.control().ForgetWorker(s_, worker, why, &failed);
  }

 private:
  SchedulerState& s_;
};

std::optional<slurm::HostJob> SlurmProfiles::Side::FindJob(int64_t id) const {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(id);
  if (it == s_.jobs_.end()) return std::nullopt;
  const SchedulerState::ActiveJob& job = it->second;
  const JobRecord& rec = job.record;
  slurm::HostJob view;
  view.id = rec.id;
  view.attempt = rec.attempt;
  view.state = rec.state;
  view.profile = rec.spec.profile();
  view.user = rec.user;
  view.shape = slurm::ShapeOf(rec.spec);
  view.held = job.held;
  view.waits_for_others = !job.after.empty();
  view.cancel_requested = job.cancel_requested;
  view.requeue_requested = job.requeue_requested;
  view.failure = job.failure;
  view.part_ended = job.part_ended;
  view.part_exit = job.part_exit;
  view.has_checkpoint = job.checkpoint.files_size() > 0;
  // Slurm's own preemption is over as it is recorded; dlbatch's waits for
  // the job to stop.
  if (Preemptions::Stopping(job) &&
      job.preemptions.back().kind() != kPreemptedBySlurm) {
    view.stopping = true;
    view.stop_deadline_ms = job.preemptions.back().deadline_ms();
    for (size_t p = 0; p < rec.parts.size(); ++p) {
      if (p < job.part_ended.size() && job.part_ended[p]) continue;
      auto w = s_.workers_.find(rec.parts[p].worker);
      if (w == s_.workers_.end() || !w->second.session) {
        view.stop_unreachable = true;
      }
    }
  }
  return view;
}

slurm::WorkerParts SlurmProfiles::Side::PartsOn(int64_t worker) const {
  s_.mu_.AssertHeld();
  slurm::WorkerParts parts;
  for (const auto& [job_id, job] : s_.jobs_) {
    for (size_t p = 0; p < job.record.parts.size(); ++p) {
      if (job.record.parts[p].worker != worker) continue;
      parts.holds = true;
      if (p >= job.part_ended.size() || !job.part_ended[p]) {
        parts.all_ended = false;
      }
    }
  }
  return parts;
}

void SlurmProfiles::Side::Refuse(int64_t worker, const std::string& why,
                                 slurm::WorkerMail& mail) {
  s_.mu_.AssertHeld();
  auto w = s_.workers_.find(worker);
  if (w == s_.workers_.end()) return;
  v1::SchedulerMessage refuse;
  refuse.set_refused(why);
  mail.out->emplace_back(w->second.session, std::move(refuse));
}

void SlurmProfiles::Side::WithLock(
    const std::function<void(slurm::WorkerMail&)>& body) {
  SchedulerState::Outbox out;
  {
    absl::MutexLock lock(&s_.mu_);
    slurm::WorkerMail mail{&out};
    body(mail);
  }
  SchedulerState::Deliver(out);
}

absl::Status SlurmProfiles::Side::CommitRecord(
    const slurm::SlurmJobRecord& record) {
  s_.mu_.AssertHeld();
  RETURN_IF_ERROR(s_.CheckWritable());
  return s_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    return s_.store_->PutSlurmJob(record);
  });
}

absl::Status SlurmProfiles::Side::CommitForget(int64_t job) {
  s_.mu_.AssertHeld();
  return s_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu_) {
    return s_.store_->DeleteSlurmJob(job);
  });
}

absl::Status SlurmProfiles::Side::Note(int64_t job, const std::string& text) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  return s_.Diary(job, it->second.record.attempt, text);
}

absl::Status SlurmProfiles::Side::EndQueued(int64_t job, v1::JobState state,
                                            const std::string& note,
                                            const std::string& reason) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  RETURN_IF_ERROR(s_.Diary(job, it->second.record.attempt, note));
  RETURN_IF_ERROR(s_.EndJob(it->second, state, -1, reason));
  s_.jobs_.erase(job);
  return absl::OkStatus();
}

absl::Status SlurmProfiles::Side::StartOnGang(int64_t id,
                                              const std::vector<Part>& parts,
                                              slurm::WorkerMail& mail) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(id);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  SchedulerState::ActiveJob& job = it->second;
  const int64_t now = s_.clock_->NowMs();
  s_.core_->MarkRunning(s_.ToQueued(job.record), parts, now);
  RETURN_IF_ERROR(s_.BeginAttempt(job, parts, now, mail.out));
  spdlog::info("job {} attempt {} starts on its Slurm job's {} node{}",
               job.record.id, job.record.attempt, parts.size(),
               parts.size() == 1 ? "" : "s");
  if (s_.metrics_ != nullptr) {
    s_.metrics_->JobMoved(job.record.spec.profile(), v1::JOB_STATE_QUEUED,
                          v1::JOB_STATE_RUNNING);
    s_.metrics_->JobPlaced(job.record.id, job.record.attempt);
  }
  return absl::OkStatus();
}

absl::Status SlurmProfiles::Side::RequeueLost(int64_t job,
                                              const std::string& why,
                                              slurm::WorkerMail& mail) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  return s_.RequeueLost(it->second, why, mail.out);
}

absl::Status SlurmProfiles::Side::RequeuePreempted(int64_t id,
                                                   const std::string& why,
                                                   slurm::WorkerMail& mail) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(id);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  SchedulerState::ActiveJob& job = it->second;
  if (job.cancel_requested || job.record.state == v1::JOB_STATE_QUEUED) {
    return s_.RequeueLost(job, why, mail.out);
  }
  // Slurm's own preemption, as a record of the attempt it stopped: by no
  // dlbatch job (by_job 0), its grace over (its processes are gone with the
  // Slurm job).
  v1::Preemption p;
  p.set_kind(kPreemptedBySlurm);
  RETURN_IF_ERROR(s_.preemptions().Open(s_, job, 0, std::move(p)));
  s_.CancelParts(job, why, -1, mail.out);
  s_.core_->Finished(id, s_.clock_->NowMs());
  RETURN_IF_ERROR(s_.SaveUsage(job.record.user));
  RETURN_IF_ERROR(s_.Diary(id, job.record.attempt, "[dlbatch] " + why));
  return s_.preemptions().Requeue(s_, job, "", mail.out);
}

absl::Status SlurmProfiles::Side::FailRunning(int64_t id,
                                              const std::string& why,
                                              slurm::WorkerMail& mail) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(id);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  SchedulerState::ActiveJob& job = it->second;
  s_.CancelParts(job, why, -1, mail.out);
  s_.core_->Finished(id, s_.clock_->NowMs());
  RETURN_IF_ERROR(s_.SaveUsage(job.record.user));
  RETURN_IF_ERROR(s_.Diary(id, job.record.attempt,
                           absl::StrCat("[dlbatch] ", why, "; job failed")));
  RETURN_IF_ERROR(s_.EndJob(job, v1::JOB_STATE_FAILED, -1, why));
  s_.jobs_.erase(id);
  return absl::OkStatus();
}

absl::Status SlurmProfiles::Side::EndAsReported(int64_t job,
                                                slurm::WorkerMail& mail) {
  s_.mu_.AssertHeld();
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end()) return absl::OkStatus();
  return s_.EndAsReported(it->second, mail.out);
}

namespace {

// The Slurm profiles whose jobs dlbatch preempts.
std::set<std::string> PreemptingProfiles(const SchedulerState& s) {
  std::set<std::string> names;
  for (const slurm::SlurmProfile& p : s.options_.slurm_profiles) {
    auto it = s.options_.preemption.find(p.name);
    if (it != s.options_.preemption.end() &&
        it->second.mode != PreemptionMode::kOff) {
      names.insert(p.name);
    }
  }
  return names;
}

}  // namespace

SlurmProfiles::SlurmProfiles(SchedulerState& state)
    : state_(state),
      side_(std::make_unique<Side>(state)),
      bridge_(std::make_unique<slurm::SlurmBridge>(
          side_.get(), state.clock_,
          slurm::SlurmBridgeOptions{
              state.options_.slurm_profiles, state.options_.slurm_poll_ms,
              state.options_.max_attempts, PreemptingProfiles(state)})) {}

SlurmProfiles::~SlurmProfiles() = default;

absl::Status SlurmProfiles::PutJob(const slurm::SlurmJobRecord& record) {
  return state_.bridge().Put(record);
}

absl::Status SlurmProfiles::ForgetJob(int64_t job_id) {
  return state_.bridge().Forget(job_id);
}

absl::Status SlurmProfiles::Start(
    slurm::SlurmTool* tool, std::map<std::string, slurm::WorkerLaunch> launch) {
  if (state_.options_.slurm_profiles.empty() || state_.bridge().started()) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> instance = absl::InternalError("unread");
  {
    absl::MutexLock lock(&state_.mu_);
    RETURN_IF_ERROR(
        state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
          instance = state_.store_->InstanceId();
          return instance.status();
        }));
  }
  state_.bridge().Start(tool, std::move(launch), *std::move(instance));
  return absl::OkStatus();
}

bool SlurmProfiles::JobUploads(int64_t job_id) {
  absl::MutexLock lock(&state_.mu_);
  auto it = state_.jobs_.find(job_id);
  return it != state_.jobs_.end() &&
         it->second.record.state != v1::JOB_STATE_QUEUED;
}

absl::StatusOr<slurm::PartitionView> SlurmProfiles::View(
    const std::string& profile) {
  return state_.bridge().View(profile);
}

absl::StatusOr<std::vector<CredentialRecord>> SlurmProfiles::JobCredentials() {
  absl::MutexLock lock(&state_.mu_);
  state_.SlurmLockHeld();
  return state_.bridge().JobCredentials();
}

absl::Status SlurmProfiles::LoadPartEnds(SchedulerState& s) {
  s.mu_.AssertHeld();
  ASSIGN_OR_RETURN(std::vector<PartEnd> ends, s.store_->PartEnds());
  for (const PartEnd& e : ends) {
    auto it = s.jobs_.find(e.job_id);
    if (it == s.jobs_.end()) continue;
    ActiveJob& job = it->second;
    job.part_ends_stored = true;  // deleted as the job moves on
    if (job.record.state == v1::JOB_STATE_QUEUED ||
        job.record.attempt != e.attempt || e.part < 0 ||
        e.part >= static_cast<int>(job.part_ended.size())) {
      continue;
    }
    job.part_ended[e.part] = true;
    job.part_exit[e.part] = e.exit_code;
    if (job.failure.empty()) job.failure = e.failure;
  }
  // A Slurm job's worker whose every part has ended has left for good: it
  // is forgotten once its job ends, never lost for being away.
  std::map<int64_t, bool> all_ended;  // worker -> every part it holds ended
  std::vector<int64_t> settling;
  for (const auto& [id, job] : s.jobs_) {
    if (job.record.state == v1::JOB_STATE_QUEUED) continue;
    for (size_t p = 0; p < job.record.parts.size(); ++p) {
      auto [entry, added] =
          all_ended.try_emplace(job.record.parts[p].worker, true);
      entry->second = entry->second && job.part_ended[p];
    }
    // Every part ended, the job not: its end waited for Slurm's word.
    if (!job.part_ended.empty() &&
        std::find(job.part_ended.begin(), job.part_ended.end(), false) ==
            job.part_ended.end() &&
        s.bridge().ProfileOf(job.record.spec.profile()) != nullptr) {
      settling.push_back(id);
    }
  }
  std::vector<int64_t> departed;
  for (const auto& [worker, ended] : all_ended) {
    auto w = s.workers_.find(worker);
    if (ended && w != s.workers_.end() &&
        s.bridge().ProfileOf(w->second.record.profile) != nullptr) {
      departed.push_back(worker);
    }
  }
  ASSIGN_OR_RETURN(auto resubmits, s.store_->SlurmResubmits());
  s.SlurmLockHeld();
  s.bridge().LoadEnds(std::move(resubmits), settling, departed);
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler
