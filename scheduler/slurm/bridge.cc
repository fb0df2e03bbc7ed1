// The bridge's state on the host's paths: records and credentials, submit
// checks, the gangs of registering workers, departures, the ends that wait
// for Slurm's word, and wait reasons. The Slurm thread is in
// bridge_thread.cc.
#include "scheduler/slurm/bridge.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler::slurm {
namespace {

// sinfo's limits are read again after this long.
constexpr int64_t kLimitsTtlMs = 30000;

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

}  // namespace

JobShape ShapeOf(const v1::JobSpec& spec) {
  JobShape shape;
  shape.pool = std::max(1, spec.pool());
  shape.max_nodes = spec.max_nodes();
  shape.time_limit_s = spec.time_limit_s();
  return shape;
}

SlurmBridge::SlurmBridge(SlurmHost* host, const Clock* clock,
                         SlurmBridgeOptions options)
    : host_(host), clock_(clock), options_(std::move(options)) {}

SlurmBridge::~SlurmBridge() { Stop(); }

void SlurmBridge::Start(SlurmTool* tool,
                        std::map<std::string, WorkerLaunch> launch,
                        std::string instance) {
  instance_ = std::move(instance);
  spdlog::info("Slurm jobs of this scheduler are named dlbatch-{}-<job id>",
               instance_);
  launcher_ = std::make_unique<SlurmLauncher>(tool, this, clock_);
  launch_ = std::move(launch);
  tool_ = tool;
  thread_ = std::thread([this] { Loop(); });
}

void SlurmBridge::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

const SlurmProfile* SlurmBridge::ProfileOf(const std::string& name) const {
  for (const SlurmProfile& p : options_.profiles) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::Status SlurmBridge::CheckSubmit(const v1::JobSpec& spec,
                                      const std::string& user) {
  const SlurmProfile* profile = ProfileOf(spec.profile());
  if (profile == nullptr) return absl::OkStatus();
  SlurmTool* tool = tool_;
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
  absl::StatusOr<PartitionLimits> limits = Limits(*profile, tool);
  if (!limits.ok()) {
    return Annotate(limits.status(),
                    absl::StrCat("profile '", profile->name,
                                 "': cannot read Slurm partition '",
                                 profile->partition, "' with sinfo"));
  }
  ASSIGN_OR_RETURN(
      BatchRequest request,
      PlanBatch(*profile, 0, 1, ShapeOf(spec), limits->max_cpus_per_node));
  if (absl::Status fits = CheckFits(*limits, request); !fits.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("profile '", profile->name, "': ", fits.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<PartitionLimits> SlurmBridge::Limits(const SlurmProfile& profile,
                                                    SlurmTool* tool) {
  const int64_t now = clock_->MonotonicMs();
  {
    absl::MutexLock lock(&mu_);
    auto it = limits_.find(profile.name);
    if (it != limits_.end() && now - it->second.first < kLimitsTtlMs) {
      return it->second.second;
    }
  }
  ASSIGN_OR_RETURN(PartitionLimits limits, ReadPartition(*tool, profile));
  absl::MutexLock lock(&mu_);
  limits_[profile.name] = {now, limits};
  return limits;
}

absl::StatusOr<PartitionView> SlurmBridge::View(const std::string& profile) {
  const SlurmProfile* p = ProfileOf(profile);
  if (p == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("profile '", profile, "' is not of type slurm"));
  }
  SlurmTool* tool = tool_;
  if (tool == nullptr) {
    return absl::UnavailableError("the Slurm launcher has not started");
  }
  return ReadPartitionView(*tool, *p);
}

void SlurmBridge::Poke() {
  absl::MutexLock lock(&mu_);
  poked_ = true;
  cv_.Signal();
}

absl::Status SlurmBridge::Put(const SlurmJobRecord& record) {
  absl::MutexLock lock(&host_->mutex());
  RETURN_IF_ERROR(host_->CommitRecord(record));
  records_[record.job_id] = record;
  if (job_tokens_ != nullptr && !record.token_sha256.empty()) {
    job_tokens_->Put(JobCredential(record.job_id, record.token_sha256));
  }
  return absl::OkStatus();
}

absl::Status SlurmBridge::Forget(int64_t job_id) {
  absl::MutexLock lock(&host_->mutex());
  RETURN_IF_ERROR(host_->CommitForget(job_id));
  records_.erase(job_id);
  waiting_.erase(job_id);
  release_.erase(job_id);
  if (job_tokens_ != nullptr) job_tokens_->RemoveJob(job_id);
  return absl::OkStatus();
}

void SlurmBridge::LoadRecords(std::vector<SlurmJobRecord> records) {
  host_->mutex().AssertHeld();
  records_.clear();
  for (SlurmJobRecord& r : records) {
    const int64_t id = r.job_id;
    records_[id] = std::move(r);
  }
}

void SlurmBridge::LoadEnds(std::map<int64_t, int> resubmits,
                           const std::vector<int64_t>& settling,
                           const std::vector<int64_t>& departed) {
  host_->mutex().AssertHeld();
  for (int64_t id : settling) settling_.try_emplace(id, clock_->NowMs());
  departed_.insert(departed.begin(), departed.end());
  resubmits_ = std::move(resubmits);
}

void SlurmBridge::Reset() {
  host_->mutex().AssertHeld();
  gangs_.clear();  // their workers reconnect and join again
  workers_.clear();
  departed_.clear();
  settling_.clear();  // the load finds them again from the part ends
}

std::vector<CredentialRecord> SlurmBridge::JobCredentials() const {
  host_->mutex().AssertHeld();
  std::vector<CredentialRecord> out;
  for (const auto& [job_id, record] : records_) {
    if (!record.token_sha256.empty()) {
      out.push_back(JobCredential(job_id, record.token_sha256));
    }
  }
  return out;
}

std::optional<SlurmJobRecord> SlurmBridge::RecordOf(int64_t job_id) const {
  host_->mutex().AssertHeld();
  auto it = records_.find(job_id);
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

void SlurmBridge::Enqueue(int64_t job_id) {
  host_->mutex().AssertHeld();
  launches_.insert(job_id);
  Poke();
}

absl::Status SlurmBridge::Join(int64_t worker, const std::string& name,
                               const std::vector<v1::Device>& devices,
                               const v1::SlurmJob& s, WorkerMail& mail) {
  host_->mutex().AssertHeld();
  workers_.insert(worker);
  std::optional<HostJob> job = host_->FindJob(s.job_id());
  // Ended, or already running (a worker reconnecting after a restart):
  // the registration itself matched its parts.
  if (!job || job->state != v1::JOB_STATE_QUEUED) return absl::OkStatus();
  if (job->attempt + 1 != s.attempt()) return absl::OkStatus();
  const SlurmProfile* profile = ProfileOf(job->profile);
  if (profile == nullptr) return absl::OkStatus();
  absl::StatusOr<GangShape> shape =
      ShapeOfGang(*profile, job->shape, s.nodes());
  if (absl::IsFailedPrecondition(shape.status())) {
    return FailGang(*job, std::string(shape.status().message()));
  }
  if (!shape.ok()) return absl::OkStatus();  // refused at launch already
  auto gang = gangs_.find(job->id);
  if (gang == gangs_.end() || gang->second.attempt() != s.attempt()) {
    if (gang != gangs_.end()) gangs_.erase(gang);
    gang = gangs_
               .try_emplace(job->id, job->id, s.attempt(), shape->nodes,
                            shape->per_node, shape->gpus)
               .first;
  }
  // Only devices of the job's kind count: a GPU job's worker offering CPU
  // slots (Slurm named no GPUs for it) has none of what it needs.
  const std::string kind = shape->gpus ? "gpu" : "cpu";
  const int slots = static_cast<int>(
      std::count_if(devices.begin(), devices.end(),
                    [&](const v1::Device& d) { return d.kind() == kind; }));
  if (absl::Status joined =
          gang->second.Join(s.node_index(), s.nodes(), worker, slots);
      !joined.ok()) {
    spdlog::warn("worker '{}': {}", name, std::string(joined.message()));
    host_->Refuse(worker, std::string(joined.message()), mail);
    // The Slurm job can never hold the job: waiting on would hold its
    // allocation for good.
    if (absl::IsFailedPrecondition(joined)) {
      return FailGang(*job, std::string(joined.message()));
    }
    return absl::OkStatus();
  }
  host_->JobChanged(job->id);
  if (!gang->second.complete() || job->held || job->waits_for_others) {
    return absl::OkStatus();
  }
  std::vector<Part> parts = gang->second.Parts();
  gangs_.erase(gang);
  waiting_.erase(job->id);
  if (resubmits_.erase(job->id) > 0) {
    RETURN_IF_ERROR(host_->PutResubmits(job->id, 0));
  }
  // Inside the caller's transaction: the start commits with the
  // registration that completed the gang.
  return host_->StartOnGang(job->id, parts, mail);
}

absl::Status SlurmBridge::FailGang(const HostJob& job, const std::string& why) {
  host_->mutex().AssertHeld();
  const int64_t id = job.id;
  gangs_.erase(id);
  waiting_.erase(id);
  if (resubmits_.erase(id) > 0) {
    RETURN_IF_ERROR(host_->PutResubmits(id, 0));
  }
  RETURN_IF_ERROR(
      host_->EndQueued(id, v1::JOB_STATE_FAILED,
                       absl::StrCat("[dlbatch] ", why, "; job failed"), why));
  spdlog::warn("job {} failed: {}", id, why);
  release_.insert(id);
  Poke();
  return absl::OkStatus();
}

bool SlurmBridge::WorkerLeft(int64_t worker) {
  host_->mutex().AssertHeld();
  for (auto& [job_id, gang] : gangs_) gang.Leave(worker);
  // A Slurm job's worker leaves as its job ends, or as Slurm ends it:
  // squeue says which now, not at the next poll.
  if (workers_.erase(worker) == 0) return false;
  Poke();
  // Done with its one job, it never comes back: forgotten now rather than
  // listed offline until --forget-offline-after. (While its job has not
  // ended, other nodes' parts may still run: it stays, as the host holds
  // the job on it until the end.)
  const WorkerParts parts = host_->PartsOn(worker);
  if (!parts.holds) return true;
  // Its own part ended and it left while other nodes' parts run: it is
  // never lost for that, and is forgotten once its job ends.
  if (parts.all_ended) departed_.insert(worker);
  return false;
}

bool SlurmBridge::Departed(int64_t worker) const {
  host_->mutex().AssertHeld();
  return departed_.count(worker) > 0;
}

bool SlurmBridge::SettlesWithSlurm(int64_t job_id,
                                   const std::string& profile) const {
  host_->mutex().AssertHeld();
  if (tool_ == nullptr || ProfileOf(profile) == nullptr) return false;
  std::optional<HostJob> job = host_->FindJob(job_id);
  return job && Settles(*job);
}

bool SlurmBridge::Settles(const HostJob& job) const {
  host_->mutex().AssertHeld();
  // A job stopping for dlbatch's preemption ends as dlbatch asked, whatever
  // signal its parts ended by.
  if (tool_ == nullptr || job.cancel_requested || job.requeue_requested ||
      job.stopping || job.failure.empty() ||
      ProfileOf(job.profile) == nullptr) {
    return false;
  }
  auto r = records_.find(job.id);
  if (r == records_.end() || r->second.slurm_id == 0 ||
      r->second.attempt != job.attempt) {
    return false;
  }
  return std::any_of(job.part_exit.begin(), job.part_exit.end(), [](int code) {
    return EndedBySignal(/*finished=*/false, code);
  });
}

std::optional<HostJob> SlurmBridge::SettlingJob(int64_t job_id) const {
  host_->mutex().AssertHeld();
  if (settling_.count(job_id) == 0) return std::nullopt;
  std::optional<HostJob> job = host_->FindJob(job_id);
  if (!job) return std::nullopt;
  auto record = records_.find(job_id);
  if (job->state == v1::JOB_STATE_QUEUED ||
      std::count(job->part_ended.begin(), job->part_ended.end(), false) > 0 ||
      record == records_.end() || record->second.slurm_id == 0 ||
      record->second.attempt != job->attempt) {
    return std::nullopt;
  }
  return job;
}

void SlurmBridge::BeginSettling(int64_t job_id, const std::string& failure) {
  host_->mutex().AssertHeld();
  if (settling_.try_emplace(job_id, clock_->NowMs()).second) {
    spdlog::info(
        "job {}: ended by a signal ({}); asking Slurm whether it was Slurm's",
        job_id, failure);
  }
  Poke();
}

void SlurmBridge::EndSettling(int64_t job_id) {
  host_->mutex().AssertHeld();
  settling_.erase(job_id);
}

std::string SlurmBridge::WaitReason(int64_t job_id, int attempt) const {
  host_->mutex().AssertHeld();
  auto gang = gangs_.find(job_id);
  if (gang != gangs_.end()) {
    std::vector<int> missing = gang->second.Missing();
    return absl::StrCat("Slurm started its job; waiting for the worker",
                        missing.size() == 1 ? "" : "s", " of node",
                        missing.size() == 1 ? " " : "s ",
                        absl::StrJoin(missing, ", "), " to register");
  }
  if (auto w = waiting_.find(job_id); w != waiting_.end()) return w->second;
  auto r = records_.find(job_id);
  if (r != records_.end() && r->second.attempt == attempt + 1) {
    if (r->second.slurm_id == 0) return "being submitted to Slurm";
    return absl::StrCat("submitted to Slurm as job ", r->second.slurm_id);
  }
  if (tool_ == nullptr) {
    return "waiting for the scheduler's Slurm launcher to start";
  }
  return "being submitted to Slurm";
}

absl::StatusOr<BatchRequest> SlurmBridge::RequestOf(const HostJob& job,
                                                    int node_cpus) const {
  const SlurmProfile* profile = ProfileOf(job.profile);
  if (profile == nullptr) {
    return absl::InternalError(
        absl::StrCat("job ", job.id, " is not on a profile of Slurm"));
  }
  ASSIGN_OR_RETURN(
      BatchRequest request,
      PlanBatch(*profile, job.id, job.attempt + 1, job.shape, node_cpus));
  request.instance = instance_;
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

}  // namespace dlbatch::scheduler::slurm
