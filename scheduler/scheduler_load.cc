// The scheduler's start, its loading of memory from the store (and
// reloading, after a failed write), and its loop thread, which hands the
// worker streams' messages to WorkerStreams in batches.
#include <algorithm>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "common/version.h"
#include "scheduler/scheduler.h"
#include "scheduler/slurm/registration.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

int SlotCount(const std::vector<v1::Device>& devices) {
  return static_cast<int>(devices.size());
}

}  // namespace

absl::Status Scheduler::Start() {
  absl::MutexLock lock(&mu_);
  disk_->Start();
  absl::Status profiles = [&]() -> absl::Status {
    Transaction txn(store_->db());
    RETURN_IF_ERROR(txn.status());
    RETURN_IF_ERROR(store_->UpsertProfile("local", 0));
    for (const auto& [name, max_pool] : options_.profiles) {
      RETURN_IF_ERROR(store_->UpsertProfile(name, max_pool));
    }
    return txn.Commit();
  }();
  if (profiles.code() == absl::StatusCode::kResourceExhausted) {
    // Start anyway: reads are served, and the profiles are in memory.
    disk_->NoteFull(profiles);
  } else if (!profiles.ok()) {
    return profiles;
  }
  RETURN_IF_ERROR(Load(/*open_rendezvous=*/true));
  loop_ = std::thread([this] { Loop(); });
  if (options_.keep_ended_ms > 0) {
    admin_.StartRetention(
        [this](absl::Duration d) { return SleepUnlessStopped(d); });
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Load(bool open_rendezvous) {
  mu_.AssertHeld();
  core_->AddProfile("local", 0);
  for (const auto& [name, max_pool] : options_.profiles)
    core_->AddProfile(name, max_pool);
  ASSIGN_OR_RETURN(auto profiles, store_->Profiles());
  for (const auto& [name, max_pool] : profiles)
    core_->AddProfile(name, max_pool);
  ASSIGN_OR_RETURN(std::vector<slurm::SlurmJobRecord> slurm_jobs,
                   store_->SlurmJobs());
  SlurmLockHeld();
  bridge().LoadRecords(std::move(slurm_jobs));

  const int64_t mono = clock_->MonotonicMs();
  const int64_t grace = options_.restart_grace_ms > 0
                            ? options_.restart_grace_ms
                            : 2 * options_.heartbeat_timeout_ms;
  // Limits as set, and each user's usage of ended jobs.
  ASSIGN_OR_RETURN(auto limits, store_->UserLimits());
  limits_.clear();
  for (const LimitEntry& e : limits) {
    limits_[{e.user, e.profile}] = e.limit;
    core_->SetLimit(e.user, e.profile, e.limit);
  }
  ASSIGN_OR_RETURN(auto usages, store_->Usages());
  for (const StoredUsage& u : usages) {
    core_->ChargeUsage(u.user, static_cast<double>(u.slot_ms), u.at_ms);
  }
  ASSIGN_OR_RETURN(auto workers, store_->Workers());
  for (auto& w : workers) {
    // Known but offline until it reconnects; its running jobs keep their
    // slots until it reports them or is declared lost, which a worker
    // connected before the restart is not before the grace has passed.
    // Expected back, it counts at submit meanwhile.
    core_->WorkerOnline(w.id, w.profile, SlotCount(w.devices));
    core_->WorkerAwaited(w.id);
    WorkerState& state = workers_[w.id];
    state.record = std::move(w);
    state.last_seen_mono = mono;
    state.grace_until_mono = mono + grace;
  }
  ASSIGN_OR_RETURN(auto jobs, store_->ActiveJobs());
  size_t queued = 0, running = 0;
  for (auto& rec : jobs) {
    ActiveJob& job = jobs_[rec.id];
    job.record = std::move(rec);
    const JobRecord& r = job.record;
    // Any job's progress and checkpoint (a command job reports them too).
    ASSIGN_OR_RETURN(TrainState train, store_->GetTrainState(r.id));
    job.progress = std::move(train.progress);
    job.checkpoint = std::move(train.checkpoint);
    ASSIGN_OR_RETURN(job.kept_checkpoints, store_->KeptCheckpoints(r.id));
    if ((r.spec.has_train() || !r.spec.launch().empty()) &&
        r.state != v1::JOB_STATE_QUEUED && open_rendezvous) {
      rendezvous_.Open(r.id, r.attempt);
    }
    if (r.state == v1::JOB_STATE_QUEUED) {
      EnqueueJob(r);
      ++queued;
    } else {
      job.part_ended.assign(r.parts.size(), false);
      job.part_exit.assign(r.parts.size(), 0);
      job.cancel_requested = r.state == v1::JOB_STATE_CANCELLING;
      if (job.cancel_requested) job.cancel_reason = r.reason;
      core_->MarkRunning(ToQueued(r), r.parts, r.start_ms);
      ++running;
    }
  }
  RETURN_IF_ERROR(slurm_.LoadPartEnds(*this));
  RETURN_IF_ERROR(control_.Load(*this));
  RETURN_IF_ERROR(preemptions_.Load(*this));
  spdlog::info("recovered {} queued and {} running jobs, {} workers", queued,
               running, workers_.size());
  if (metrics_ != nullptr) {
    // The metrics never keep the scheduler from loading.
    auto counts = store_->CountJobsByState();
    if (counts.ok()) {
      metrics_->SetJobCounts(*counts);
    } else {
      spdlog::warn("metrics: cannot count the jobs: {}",
                   counts.status().ToString());
    }
    metrics_->Profiles(core_->Profiles());
  }
  return absl::OkStatus();
}

void Scheduler::Recover(const absl::Status& why) {
  mu_.AssertHeld();
  if (why.code() == absl::StatusCode::kResourceExhausted) disk_->NoteFull(why);
  spdlog::error(
      "a write failed ({}); reloading from the last commit, as a restart "
      "would, and asking workers to reconnect",
      why.ToString());
  for (auto& [id, w] : workers_) {
    if (w.session) {
      w.session->Close(
          "the scheduler reloads its state after a failed write; reconnect");
    }
  }
  session_worker_.clear();
  workers_.clear();
  jobs_.clear();
  SlurmLockHeld();
  bridge().Reset();  // Load and the workers' reconnections find them again
  core_ = NewCore();
  broken_ = Load(/*open_rendezvous=*/false);
  if (!broken_.ok()) {
    spdlog::error("cannot reload the store: {}; retrying", broken_.ToString());
    workers_.clear();
    jobs_.clear();
    core_ = NewCore();
  }
  // Watchers and waiters see the state as reloaded.
  watchers_.PublishAll(*this);
  for (const auto& [id, job] : jobs_) follow_->Notify(id);
}

void Scheduler::OnWorkerMessage(std::shared_ptr<WorkerSession> session,
                                v1::WorkerMessage message) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(WorkerEvent{std::move(session), std::move(message)});
  queue_cv_.Signal();
}

void Scheduler::OnWorkerGone(std::shared_ptr<WorkerSession> session) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(WorkerEvent{std::move(session), std::nullopt});
  queue_cv_.Signal();
}

void Scheduler::Loop() {
  const int64_t tick_ms =
      std::max<int64_t>(50, options_.heartbeat_interval_ms / 2);
  int64_t next_check = clock_->MonotonicMs() + tick_ms;
  for (;;) {
    std::deque<WorkerEvent> batch;
    {
      absl::MutexLock lock(&queue_mu_);
      while (queue_.empty() && !stopping_) {
        int64_t wait = next_check - clock_->MonotonicMs();
        if (wait <= 0) break;
        queue_cv_.WaitWithTimeout(&queue_mu_, absl::Milliseconds(wait));
      }
      if (stopping_) return;
      batch.swap(queue_);
    }
    if (!batch.empty()) streams_.ProcessBatch(batch);
    if (clock_->MonotonicMs() >= next_check) {
      disk_->Check();
      streams_.CheckLiveness();
      next_check = clock_->MonotonicMs() + tick_ms;
    }
  }
}

}  // namespace dlbatch::scheduler
