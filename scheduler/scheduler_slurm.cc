// The scheduler's side of profiles of Slurm: each job's Slurm record in the
// store and in memory with its one-job credential beside it, the launches
// (sbatch on the Slurm thread, outside mu_), the gang of a Slurm job's
// workers, and the reconcile with squeue.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/scheduler.h"
#include "scheduler/slurm/reconciler.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

// sinfo's limits are read again after this long.
constexpr int64_t kLimitsTtlMs = 30000;
// How long the Slurm job of an ended job may run on before it is
// scancelled: its workers upload, report and leave within this.
constexpr int64_t kLingerMs = 15000;
// How often squeue is read while a job's end waits for Slurm's word
// (slurm_settling_): its Slurm job leaves COMPLETING within moments.
constexpr int64_t kSettlingPollMs = 250;

struct Account {
  uint32_t uid = 0;
  uint32_t gid = 0;
};

std::optional<Account> LookUpUser(const std::string& name) {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (::getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return std::nullopt;
  }
  return Account{found->pw_uid, found->pw_gid};
}

std::string UserOfUid(uid_t uid) {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 &&
      found != nullptr) {
    return found->pw_name;
  }
  return absl::StrCat("uid", uid);
}

slurm::JobShape ShapeOf(const v1::JobSpec& spec) {
  slurm::JobShape shape;
  shape.pool = std::max(1, spec.pool());
  shape.max_nodes = spec.max_nodes();
  shape.time_limit_s = spec.time_limit_s();
  return shape;
}

}  // namespace

absl::Status Scheduler::PutSlurmJob(const slurm::SlurmJobRecord& record) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return store_->PutSlurmJob(record);
  }));
  slurm_jobs_[record.job_id] = record;
  if (job_tokens_ != nullptr && !record.token_sha256.empty()) {
    job_tokens_->Put(JobCredential(record.job_id, record.token_sha256));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::ForgetSlurmJob(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return store_->DeleteSlurmJob(job_id);
  }));
  slurm_jobs_.erase(job_id);
  slurm_waiting_.erase(job_id);
  slurm_release_.erase(job_id);
  if (job_tokens_ != nullptr) job_tokens_->RemoveJob(job_id);
  return absl::OkStatus();
}

const slurm::SlurmProfile* Scheduler::SlurmProfileOf(
    const std::string& name) const {
  for (const slurm::SlurmProfile& p : options_.slurm_profiles) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::Status Scheduler::StartSlurm(
    slurm::SlurmTool* tool, std::map<std::string, slurm::WorkerLaunch> launch) {
  if (options_.slurm_profiles.empty() || slurm_thread_.joinable()) {
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::string> instance = absl::InternalError("unread");
    RETURN_IF_ERROR(InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      instance = store_->InstanceId();
      return instance.status();
    }));
    slurm_instance_ = *instance;
  }
  spdlog::info("Slurm jobs of this scheduler are named dlbatch-{}-<job id>",
               slurm_instance_);
  slurm_ledger_ = std::make_unique<SlurmLedger>(this);
  slurm_launcher_ =
      std::make_unique<slurm::SlurmLauncher>(tool, slurm_ledger_.get(), clock_);
  slurm_launch_ = std::move(launch);
  {
    absl::MutexLock lock(&mu_);
    slurm_tool_ = tool;
  }
  slurm_thread_ = std::thread([this] { SlurmLoop(); });
  return absl::OkStatus();
}

absl::Status Scheduler::CheckSlurmSubmit(const v1::JobSpec& spec,
                                         const std::string& user) {
  const slurm::SlurmProfile* profile = SlurmProfileOf(spec.profile());
  if (profile == nullptr) return absl::OkStatus();
  slurm::SlurmTool* tool = nullptr;
  {
    absl::MutexLock lock(&mu_);
    tool = slurm_tool_;
  }
  if (tool == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "profile '", profile->name,
        "' is of type slurm and this scheduler has not started its Slurm "
        "launcher yet; try again in a moment"));
  }
  // Jobs go to Slurm as their owner where the scheduler may submit for
  // others (root: sbatch --uid/--gid), else as the scheduler's own user.
  if (::geteuid() != 0 && user != UserOfUid(::geteuid())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "profile '", profile->name, "' submits to Slurm as '",
        UserOfUid(::geteuid()),
        "' (the scheduler's user), which cannot submit for '", user,
        "'; run the scheduler as root, or use another profile"));
  }
  if (::geteuid() == 0 && user != "root" && !LookUpUser(user)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "profile '", profile->name,
        "' runs jobs in Slurm as their owner, and '", user,
        "' has no account on the scheduler's machine to submit as"));
  }
  absl::StatusOr<slurm::PartitionLimits> limits = SlurmLimits(*profile, tool);
  if (!limits.ok()) {
    return Annotate(limits.status(),
                    absl::StrCat("profile '", profile->name,
                                 "': cannot read Slurm partition '",
                                 profile->partition, "' with sinfo"));
  }
  ASSIGN_OR_RETURN(slurm::BatchRequest request,
                   slurm::PlanBatch(*profile, 0, 1, ShapeOf(spec),
                                    limits->max_cpus_per_node));
  if (absl::Status fits = slurm::CheckFits(*limits, request); !fits.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("profile '", profile->name, "': ", fits.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<slurm::PartitionLimits> Scheduler::SlurmLimits(
    const slurm::SlurmProfile& profile, slurm::SlurmTool* tool) {
  const int64_t now = clock_->MonotonicMs();
  {
    absl::MutexLock lock(&slurm_mu_);
    auto it = slurm_limits_.find(profile.name);
    if (it != slurm_limits_.end() && now - it->second.first < kLimitsTtlMs) {
      return it->second.second;
    }
  }
  ASSIGN_OR_RETURN(slurm::PartitionLimits limits,
                   slurm::ReadPartition(*tool, profile));
  absl::MutexLock lock(&slurm_mu_);
  slurm_limits_[profile.name] = {now, limits};
  return limits;
}

absl::StatusOr<slurm::BatchRequest> Scheduler::SlurmRequestOf(
    const JobRecord& job, int node_cpus) const {
  const slurm::SlurmProfile* profile = SlurmProfileOf(job.spec.profile());
  if (profile == nullptr) {
    return absl::InternalError(
        absl::StrCat("job ", job.id, " is not on a profile of Slurm"));
  }
  ASSIGN_OR_RETURN(slurm::BatchRequest request,
                   slurm::PlanBatch(*profile, job.id, job.attempt + 1,
                                    ShapeOf(job.spec), node_cpus));
  request.instance = slurm_instance_;
  if (::geteuid() == 0 && job.user != "root") {
    if (std::optional<Account> account = LookUpUser(job.user)) {
      request.uid = account->uid;
      request.gid = account->gid;
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("'", job.user,
                       "' has no account on the scheduler's machine to submit "
                       "to Slurm as"));
    }
  }
  return request;
}

void Scheduler::EnqueueJob(const JobRecord& job) {
  if (SlurmProfileOf(job.spec.profile()) == nullptr) {
    core_->Enqueue(ToQueued(job));
    return;
  }
  slurm_launches_.insert(job.id);
  PokeSlurm();
}

void Scheduler::PokeSlurm() {
  absl::MutexLock lock(&slurm_mu_);
  slurm_poked_ = true;
  slurm_cv_.Signal();
}

absl::Status Scheduler::JoinSlurmGang(const WorkerState& worker,
                                      const v1::Register& reg, Outbox* out) {
  const v1::SlurmJob& s = reg.slurm();
  slurm_workers_.insert(worker.record.id);
  auto it = jobs_.find(s.job_id());
  // Ended, or already running (a worker reconnecting after a restart):
  // the registration itself matched its parts.
  if (it == jobs_.end() || it->second.record.state != v1::JOB_STATE_QUEUED) {
    return absl::OkStatus();
  }
  ActiveJob& job = it->second;
  if (job.record.attempt + 1 != s.attempt()) return absl::OkStatus();
  const slurm::SlurmProfile* profile =
      SlurmProfileOf(job.record.spec.profile());
  if (profile == nullptr) return absl::OkStatus();
  absl::StatusOr<slurm::GangShape> shape =
      slurm::ShapeOfGang(*profile, ShapeOf(job.record.spec), s.nodes());
  if (absl::IsFailedPrecondition(shape.status())) {
    return FailSlurmGang(job, std::string(shape.status().message()));
  }
  if (!shape.ok()) return absl::OkStatus();  // refused at launch already
  auto gang = slurm_gangs_.find(job.record.id);
  if (gang == slurm_gangs_.end() || gang->second.attempt() != s.attempt()) {
    if (gang != slurm_gangs_.end()) slurm_gangs_.erase(gang);
    gang = slurm_gangs_
               .try_emplace(job.record.id, job.record.id, s.attempt(),
                            shape->nodes, shape->per_node, shape->gpus)
               .first;
  }
  // Only devices of the job's kind count: a GPU job's worker offering CPU
  // slots (Slurm named no GPUs for it) has none of what it needs.
  const std::string kind = shape->gpus ? "gpu" : "cpu";
  const int slots = static_cast<int>(
      std::count_if(worker.record.devices.begin(), worker.record.devices.end(),
                    [&](const v1::Device& d) { return d.kind() == kind; }));
  if (absl::Status joined =
          gang->second.Join(s.node_index(), s.nodes(), worker.record.id, slots);
      !joined.ok()) {
    spdlog::warn("worker '{}': {}", worker.record.name,
                 std::string(joined.message()));
    v1::SchedulerMessage refuse;
    refuse.set_refused(std::string(joined.message()));
    out->emplace_back(worker.session, std::move(refuse));
    // The Slurm job can never hold the job: waiting on would hold its
    // allocation for good.
    if (absl::IsFailedPrecondition(joined)) {
      return FailSlurmGang(job, std::string(joined.message()));
    }
    return absl::OkStatus();
  }
  Changed(job.record.id);
  if (!gang->second.complete() || job.held || !job.after.empty()) {
    return absl::OkStatus();
  }
  std::vector<Part> parts = gang->second.Parts();
  slurm_gangs_.erase(gang);
  slurm_waiting_.erase(job.record.id);
  if (slurm_resubmits_.erase(job.record.id) > 0) {
    RETURN_IF_ERROR(store_->PutSlurmResubmits(job.record.id, 0));
  }
  const int64_t now = clock_->NowMs();
  core_->MarkRunning(ToQueued(job.record), parts, now);
  // Inside the batch's transaction: the start commits with the
  // registration that completed the gang.
  RETURN_IF_ERROR(BeginAttempt(job, parts, now, out));
  spdlog::info("job {} attempt {} starts on its Slurm job's {} node{}",
               job.record.id, job.record.attempt, parts.size(),
               parts.size() == 1 ? "" : "s");
  if (metrics_ != nullptr) {
    metrics_->JobMoved(job.record.spec.profile(), v1::JOB_STATE_QUEUED,
                       v1::JOB_STATE_RUNNING);
    metrics_->JobPlaced(job.record.id, job.record.attempt);
  }
  return absl::OkStatus();
}

absl::Status Scheduler::FailSlurmGang(ActiveJob& job, const std::string& why) {
  const int64_t id = job.record.id;
  slurm_gangs_.erase(id);
  slurm_waiting_.erase(id);
  if (slurm_resubmits_.erase(id) > 0) {
    RETURN_IF_ERROR(store_->PutSlurmResubmits(id, 0));
  }
  RETURN_IF_ERROR(Diary(id, job.record.attempt,
                        absl::StrCat("[dlbatch] ", why, "; job failed")));
  RETURN_IF_ERROR(EndJob(job, v1::JOB_STATE_FAILED, -1, why));
  spdlog::warn("job {} failed: {}", id, why);
  jobs_.erase(id);
  slurm_release_.insert(id);
  PokeSlurm();
  return absl::OkStatus();
}

std::string Scheduler::SlurmWaitReason(const ActiveJob& job) const {
  const int64_t id = job.record.id;
  auto gang = slurm_gangs_.find(id);
  if (gang != slurm_gangs_.end()) {
    std::vector<int> missing = gang->second.Missing();
    return absl::StrCat("Slurm started its job; waiting for the worker",
                        missing.size() == 1 ? "" : "s", " of node",
                        missing.size() == 1 ? " " : "s ",
                        absl::StrJoin(missing, ", "), " to register");
  }
  if (auto w = slurm_waiting_.find(id); w != slurm_waiting_.end()) {
    return w->second;
  }
  auto r = slurm_jobs_.find(id);
  if (r != slurm_jobs_.end() && r->second.attempt == job.record.attempt + 1) {
    if (r->second.slurm_id == 0) return "being submitted to Slurm";
    return absl::StrCat("submitted to Slurm as job ", r->second.slurm_id);
  }
  if (slurm_tool_ == nullptr) {
    return "waiting for the scheduler's Slurm launcher to start";
  }
  return "being submitted to Slurm";
}

void Scheduler::SlurmLoop() {
  int64_t next_reconcile = 0;  // at once: adopt or cancel what Slurm holds
  while (true) {
    {
      absl::MutexLock lock(&slurm_mu_);
      const int64_t wait = next_reconcile - clock_->MonotonicMs();
      if (!slurm_poked_ && !slurm_stopping_ && wait > 0) {
        slurm_cv_.WaitWithTimeout(&slurm_mu_, absl::Milliseconds(wait));
      }
      if (slurm_stopping_) return;
      slurm_poked_ = false;
    }
    std::vector<int64_t> launches;
    bool any = false;
    {
      absl::MutexLock lock(&mu_);
      launches.assign(slurm_launches_.begin(), slurm_launches_.end());
      slurm_launches_.clear();
      any = !slurm_jobs_.empty() || !launches.empty();
    }
    for (int64_t id : launches) LaunchSlurmJob(id);
    const int64_t now = clock_->MonotonicMs();
    // A job just submitted is watched from the next poll on.
    if (!launches.empty()) {
      next_reconcile = std::min(next_reconcile, now + options_.slurm_poll_ms);
    }
    // A poke with no launch is a cancel or an end: reconcile now.
    if (now >= next_reconcile || launches.empty()) {
      if (any || next_reconcile == 0) ReconcileSlurm();
      absl::MutexLock lock(&mu_);
      int64_t poll = slurm_jobs_.empty() ? options_.slurm_poll_ms * 5
                                         : options_.slurm_poll_ms;
      if (!slurm_settling_.empty()) poll = std::min(poll, kSettlingPollMs);
      next_reconcile = clock_->MonotonicMs() + poll;
    }
  }
}

void Scheduler::LaunchSlurmJob(int64_t job_id) {
  slurm::SlurmProfile profile;
  slurm::BatchRequest request;
  slurm::WorkerLaunch launch;
  // On CPU-only nodes the pool is shared over as few nodes as hold it,
  // which follows the partition's CPUs per node (sinfo, outside mu_).
  int node_cpus = 0;
  {
    std::string name;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return;
      name = it->second.record.spec.profile();
    }
    const slurm::SlurmProfile* p = SlurmProfileOf(name);
    if (p == nullptr) return;
    if (p->gpus_per_node <= 0) {
      absl::StatusOr<slurm::PartitionLimits> limits =
          SlurmLimits(*p, slurm_tool_);
      if (!limits.ok()) {
        absl::MutexLock lock(&mu_);
        slurm_waiting_[job_id] = absl::StrCat(
            "could not be submitted to Slurm (cannot read partition '",
            p->partition, "' with sinfo: ", limits.status().message(),
            "); trying again");
        Changed(job_id);
        slurm_launches_.insert(job_id);
        return;
      }
      node_cpus = limits->max_cpus_per_node;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    ActiveJob& job = it->second;
    if (job.record.state != v1::JOB_STATE_QUEUED || job.held ||
        !job.after.empty() || slurm_launching_.count(job_id) > 0) {
      return;
    }
    auto r = slurm_jobs_.find(job_id);
    if (r != slurm_jobs_.end() && r->second.attempt == job.record.attempt + 1) {
      return;  // launched already (adopted after a restart, or in Slurm)
    }
    profile = *SlurmProfileOf(job.record.spec.profile());
    absl::StatusOr<slurm::BatchRequest> planned =
        SlurmRequestOf(job.record, node_cpus);
    if (!planned.ok()) {
      (void)InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        RETURN_IF_ERROR(
            Diary(job_id, job.record.attempt,
                  absl::StrCat("[dlbatch] ", planned.status().message())));
        return EndJob(job, v1::JOB_STATE_FAILED, -1,
                      std::string(planned.status().message()));
      });
      jobs_.erase(job_id);
      return;
    }
    request = *planned;
    auto l = slurm_launch_.find(profile.name);
    if (l != slurm_launch_.end()) launch = l->second;
    slurm_launching_.insert(job_id);
  }
  absl::StatusOr<slurm::SlurmJobRecord> record =
      absl::InternalError("no one-job credential could be made");
  if (absl::StatusOr<std::string> token = NewJobToken(); token.ok()) {
    launch.token = *token;
    record = slurm_launcher_->Launch(profile, request, launch);
  } else {
    record = token.status();
  }
  absl::MutexLock lock(&mu_);
  slurm_launching_.erase(job_id);
  if (record.ok()) {
    spdlog::info("job {} attempt {}: Slurm job {} (partition {})", job_id,
                 request.attempt, record->slurm_id, profile.partition);
    slurm_waiting_[job_id] =
        absl::StrCat("submitted to Slurm as job ", record->slurm_id);
    Changed(job_id);
    return;
  }
  spdlog::warn("job {}: {}", job_id, record.status().ToString());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  if (record.status().code() == absl::StatusCode::kFailedPrecondition) {
    // Slurm refused it, in its own words: it would refuse it again.
    const std::string why =
        absl::StrCat("Slurm refused the job: ", record.status().message());
    (void)InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      RETURN_IF_ERROR(
          Diary(job_id, it->second.record.attempt, "[dlbatch] " + why));
      return EndJob(it->second, v1::JOB_STATE_FAILED, -1, why);
    });
    jobs_.erase(job_id);
    return;
  }
  slurm_waiting_[job_id] =
      absl::StrCat("could not be submitted to Slurm (",
                   record.status().message(), "); trying again");
  Changed(job_id);
  // Its intent, if committed, is the reconciler's to adopt or relaunch;
  // without one it is launched again at the next poll.
  if (slurm_jobs_.count(job_id) == 0) slurm_launches_.insert(job_id);
}

void Scheduler::ReconcileSlurm() {
  std::vector<std::string> partitions;
  slurm::ReconcileInput in;
  in.instance = slurm_instance_;
  for (const slurm::SlurmProfile& p : options_.slurm_profiles) {
    if (std::find(partitions.begin(), partitions.end(), p.partition) ==
        partitions.end()) {
      partitions.push_back(p.partition);
    }
    in.partitions[p.name] = p.partition;
  }
  absl::StatusOr<std::vector<slurm::SqueueRow>> rows =
      slurm::ReadQueue(*slurm_tool_, partitions);
  if (!rows.ok()) {
    spdlog::warn("cannot read Slurm's queue: {}", rows.status().ToString());
    // Ends that wait for Slurm's word wait no longer than Slurm may take
    // to give it: without squeue, their workers' reports stand.
    Outbox out;
    {
      absl::MutexLock lock(&mu_);
      std::vector<int64_t> due;
      for (const auto& [job_id, since] : slurm_settling_) {
        if (clock_->NowMs() - since >= in.settling_wait_ms) {
          due.push_back(job_id);
        }
      }
      if (!due.empty()) {
        (void)InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          for (int64_t job_id : due) {
            ActiveJob* job = SettlingJob(job_id);
            if (job == nullptr) {
              slurm_settling_.erase(job_id);  // ended or requeued another way
              continue;
            }
            RETURN_IF_ERROR(EndAsReported(*job, &out));
          }
          return absl::OkStatus();
        });
      }
    }
    Deliver(out);
    return;
  }
  in.rows = *std::move(rows);
  std::vector<slurm::SlurmJobRecord> given_back;
  // Jobs whose end waited for Slurm's word and that dlbatch has since
  // cancelled or requeued: they end as their workers reported, now.
  std::vector<int64_t> settle_now;
  std::set<int64_t> release;  // jobs whose Slurm job goes without a linger
  {
    absl::MutexLock lock(&mu_);
    release = slurm_release_;
    for (auto it = slurm_settling_.begin(); it != slurm_settling_.end();) {
      const ActiveJob* job = SettlingJob(it->first);
      if (job == nullptr) {
        it = slurm_settling_.erase(it);  // ended or requeued another way
        continue;
      }
      if (!SettlesWithSlurm(*job)) settle_now.push_back(it->first);
      in.settling_since[it->first] = it->second;
      ++it;
    }
    for (const auto& [job_id, record] : slurm_jobs_) {
      // One being submitted is the launcher's until sbatch answers.
      if (slurm_launching_.count(job_id) > 0) continue;
      auto it = jobs_.find(job_id);
      // A held job gives its Slurm job back at once (scancel, record
      // forgotten): it is submitted again when released.
      if (it != jobs_.end() && it->second.held &&
          it->second.record.state == v1::JOB_STATE_QUEUED) {
        given_back.push_back(record);
        continue;
      }
      in.records.push_back(record);
      // A record of an attempt that is over (the job was requeued) is an
      // ended job's: its Slurm job goes, whatever the job does now.
      if (it == jobs_.end()) continue;
      const JobRecord& rec = it->second.record;
      if (rec.state == v1::JOB_STATE_QUEUED) {
        if (record.attempt == rec.attempt + 1) {
          in.jobs[job_id] = slurm::JobPhase::kWaiting;
        }
      } else if (record.attempt == rec.attempt) {
        const bool settling = slurm_settling_.count(job_id) > 0 &&
                              std::find(settle_now.begin(), settle_now.end(),
                                        job_id) == settle_now.end();
        in.jobs[job_id] =
            settling ? slurm::JobPhase::kSettling : slurm::JobPhase::kRunning;
      }
    }
    // Jobs being submitted now hold names squeue may show already.
    for (int64_t job_id : slurm_launching_) {
      slurm::SlurmJobRecord launching;
      launching.job_id = job_id;
      launching.submitted_ms = clock_->NowMs();
      in.records.push_back(launching);
      in.jobs[job_id] = slurm::JobPhase::kWaiting;
    }
  }
  in.now_ms = clock_->NowMs();
  for (const slurm::SlurmJobRecord& r : given_back) {
    if (r.slurm_id != 0) {
      spdlog::info("scancel Slurm job {}: dlbatch job {} is held", r.slurm_id,
                   r.job_id);
      if (absl::Status s = slurm::CancelBatch(*slurm_tool_, r.slurm_id);
          !s.ok()) {
        spdlog::warn("scancel {}: {}", r.slurm_id, s.ToString());
        continue;  // its record stays: tried again at the next poll
      }
    }
    if (absl::Status s = ForgetSlurmJob(r.job_id); !s.ok()) {
      spdlog::warn("job {}: {}", r.job_id, s.ToString());
    }
  }
  const slurm::ReconcileDecisions d = slurm::Reconcile(in);
  std::set<int64_t> left_alone;
  for (const auto& l : d.left_alone) {
    left_alone.insert(l.slurm_id);
    if (slurm_left_alone_.insert(l.slurm_id).second) {
      spdlog::warn("{}", l.why);
    }
  }
  std::erase_if(slurm_left_alone_,
                [&](int64_t id) { return left_alone.count(id) == 0; });

  // A Slurm job still running for a job that has ended is left a while to
  // end by itself (its workers leave as the job ends, and Slurm then says
  // COMPLETED rather than CANCELLED); waiting ones and strays go at once.
  std::set<int64_t> lingering;
  for (const auto& c : d.cancel) {
    auto row = std::find_if(
        in.rows.begin(), in.rows.end(),
        [&](const slurm::SqueueRow& r) { return r.slurm_id == c.slurm_id; });
    auto record = std::find_if(in.records.begin(), in.records.end(),
                               [&](const slurm::SlurmJobRecord& r) {
                                 return r.slurm_id == c.slurm_id;
                               });
    const bool known = record != in.records.end();
    const bool at_once = known && release.count(record->job_id) > 0;
    if (known && !at_once && row != in.rows.end() &&
        slurm::MapSlurmState(*row, "").phase == slurm::SlurmPhase::kRunning) {
      auto [since, added] = slurm_lingering_.try_emplace(c.slurm_id, in.now_ms);
      lingering.insert(c.slurm_id);
      if (in.now_ms - since->second < kLingerMs) continue;
    }
    spdlog::info("scancel Slurm job {}: {}", c.slurm_id, c.why);
    if (absl::Status s = slurm::CancelBatch(*slurm_tool_, c.slurm_id);
        !s.ok()) {
      spdlog::warn("scancel {}: {}", c.slurm_id, s.ToString());
    }
  }
  std::erase_if(slurm_lingering_,
                [&](const auto& e) { return lingering.count(e.first) == 0; });
  for (const auto& a : d.adopt) {
    slurm::SlurmJobRecord record;
    {
      absl::MutexLock lock(&mu_);
      auto it = slurm_jobs_.find(a.job_id);
      if (it == slurm_jobs_.end()) continue;
      record = it->second;
    }
    record.slurm_id = a.slurm_id;
    spdlog::info("job {}: adopted Slurm job {}", a.job_id, a.slurm_id);
    if (absl::Status s = PutSlurmJob(record); !s.ok()) {
      spdlog::warn("job {}: {}", a.job_id, s.ToString());
    }
  }
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [job_id, reason] : d.waiting) {
      auto it = jobs_.find(job_id);
      if (it == jobs_.end() || slurm_gangs_.count(job_id) > 0) continue;
      std::string& held = slurm_waiting_[job_id];
      if (held != reason) {
        held = reason;
        Changed(job_id);
      }
    }
    // Workers that left before their job ended go once it has.
    std::vector<int64_t> done;
    for (int64_t worker : slurm_departed_) {
      const bool held =
          std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& entry) {
            for (const Part& part : entry.second.record.parts) {
              if (part.worker == worker) return true;
            }
            return false;
          });
      if (!held) done.push_back(worker);
    }
    if (!done.empty()) {
      (void)InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (int64_t worker : done) {
          slurm_departed_.erase(worker);
          std::vector<int64_t> failed;
          RETURN_IF_ERROR(
              ForgetWorker(worker, "gone with its Slurm job", &failed));
        }
        return absl::OkStatus();
      });
    }
    if (!d.lost.empty() || !d.reported.empty() || !settle_now.empty()) {
      std::vector<int64_t> as_reported = d.reported;
      as_reported.insert(as_reported.end(), settle_now.begin(),
                         settle_now.end());
      (void)InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (const auto& lost : d.lost) {
          auto it = jobs_.find(lost.job_id);
          if (it == jobs_.end()) continue;
          RETURN_IF_ERROR(
              SlurmJobLost(it->second, lost.reason, lost.machine_fault, &out));
        }
        for (int64_t job_id : as_reported) {
          // Still waiting: nothing else ended it since the read.
          if (ActiveJob* job = SettlingJob(job_id); job != nullptr) {
            RETURN_IF_ERROR(EndAsReported(*job, &out));
          }
        }
        return absl::OkStatus();
      });
    }
  }
  Deliver(out);
  for (int64_t job_id : d.forget) {
    if (absl::Status s = ForgetSlurmJob(job_id); !s.ok()) {
      spdlog::warn("job {}: {}", job_id, s.ToString());
    }
  }
  for (int64_t job_id : d.relaunch) {
    if (absl::Status s = ForgetSlurmJob(job_id); !s.ok()) continue;
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end() && it->second.record.state == v1::JOB_STATE_QUEUED) {
      slurm_launches_.insert(job_id);
      PokeSlurm();
    }
  }
}

absl::Status Scheduler::SlurmJobLost(ActiveJob& job, const std::string& reason,
                                     bool machine_fault, Outbox* out) {
  JobRecord& rec = job.record;
  const int64_t id = rec.id;
  slurm_gangs_.erase(id);
  slurm_waiting_.erase(id);
  slurm_settling_.erase(id);
  if (rec.state == v1::JOB_STATE_QUEUED) {
    // Its Slurm job ended before all its workers were in: no attempt ran.
    if (machine_fault && ++slurm_resubmits_[id] < options_.max_attempts) {
      RETURN_IF_ERROR(store_->PutSlurmResubmits(id, slurm_resubmits_[id]));
      RETURN_IF_ERROR(Diary(
          id, rec.attempt,
          absl::StrCat("[dlbatch] ", reason, "; submitted to Slurm again")));
      EnqueueJob(rec);
      return absl::OkStatus();
    }
    if (slurm_resubmits_.erase(id) > 0) {
      RETURN_IF_ERROR(store_->PutSlurmResubmits(id, 0));
    }
    RETURN_IF_ERROR(Diary(id, rec.attempt,
                          absl::StrCat("[dlbatch] ", reason, "; job failed")));
    RETURN_IF_ERROR(EndJob(
        job,
        job.cancel_requested ? v1::JOB_STATE_CANCELLED : v1::JOB_STATE_FAILED,
        -1, reason));
    jobs_.erase(id);
    return absl::OkStatus();
  }
  // It ran: a machine's fault, or a job stopped behind dlbatch's back with a
  // checkpoint to resume from, is requeued within its attempts; its own
  // time limit (Slurm's --time) or a job with nothing stored fails.
  const bool timed_out = absl::StrContains(reason, "time limit");
  const bool resumable = job.checkpoint.files_size() > 0 && !timed_out;
  if (machine_fault || resumable || job.cancel_requested) {
    return RequeueLost(job, reason, out);
  }
  CancelParts(job, reason, -1, out);
  core_->Finished(id, clock_->NowMs());
  RETURN_IF_ERROR(SaveUsage(rec.user));
  RETURN_IF_ERROR(Diary(id, rec.attempt,
                        absl::StrCat("[dlbatch] ", reason, "; job failed")));
  RETURN_IF_ERROR(EndJob(job, v1::JOB_STATE_FAILED, -1, reason));
  jobs_.erase(id);
  return absl::OkStatus();
}

Scheduler::ActiveJob* Scheduler::SettlingJob(int64_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || slurm_settling_.count(job_id) == 0) return nullptr;
  ActiveJob& job = it->second;
  auto record = slurm_jobs_.find(job_id);
  if (job.record.state == v1::JOB_STATE_QUEUED ||
      std::count(job.part_ended.begin(), job.part_ended.end(), false) > 0 ||
      record == slurm_jobs_.end() || record->second.slurm_id == 0 ||
      record->second.attempt != job.record.attempt) {
    return nullptr;
  }
  return &job;
}

absl::Status Scheduler::LoadPartEnds() {
  ASSIGN_OR_RETURN(std::vector<PartEnd> ends, store_->PartEnds());
  for (const PartEnd& e : ends) {
    auto it = jobs_.find(e.job_id);
    if (it == jobs_.end()) continue;
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
  for (const auto& [id, job] : jobs_) {
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
        SlurmProfileOf(job.record.spec.profile()) != nullptr) {
      slurm_settling_.try_emplace(id, clock_->NowMs());
    }
  }
  for (const auto& [worker, ended] : all_ended) {
    auto w = workers_.find(worker);
    if (ended && w != workers_.end() &&
        SlurmProfileOf(w->second.record.profile) != nullptr) {
      slurm_departed_.insert(worker);
    }
  }
  ASSIGN_OR_RETURN(slurm_resubmits_, store_->SlurmResubmits());
  return absl::OkStatus();
}

bool Scheduler::SettlesWithSlurm(const ActiveJob& job) const {
  if (slurm_tool_ == nullptr || job.cancel_requested || job.requeue_requested ||
      job.failure.empty() ||
      SlurmProfileOf(job.record.spec.profile()) == nullptr) {
    return false;
  }
  auto r = slurm_jobs_.find(job.record.id);
  if (r == slurm_jobs_.end() || r->second.slurm_id == 0 ||
      r->second.attempt != job.record.attempt) {
    return false;
  }
  return std::any_of(job.part_exit.begin(), job.part_exit.end(), [](int code) {
    return slurm::EndedBySignal(/*finished=*/false, code);
  });
}

bool Scheduler::SlurmJobUploads(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second.record.state != v1::JOB_STATE_QUEUED;
}

absl::StatusOr<slurm::PartitionView> Scheduler::SlurmView(
    const std::string& profile) {
  const slurm::SlurmProfile* p = SlurmProfileOf(profile);
  if (p == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("profile '", profile, "' is not of type slurm"));
  }
  slurm::SlurmTool* tool = nullptr;
  {
    absl::MutexLock lock(&mu_);
    tool = slurm_tool_;
  }
  if (tool == nullptr) {
    return absl::UnavailableError("the Slurm launcher has not started");
  }
  return slurm::ReadPartitionView(*tool, *p);
}

}  // namespace dlbatch::scheduler
