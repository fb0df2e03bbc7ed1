// WatchEvents: the snapshot a new stream starts with, the publishing of
// job and worker changes to every open stream (see event_hub.h), and the
// views of jobs and workers they show.
#include "scheduler/watchers.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/duration.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/control.h"
#include "scheduler/preemptions.h"
#include "scheduler/users.h"

namespace dlbatch::scheduler {
namespace {

// Queued jobs beyond these are left out of a snapshot (a queue of 100,000
// would not fit a screen anyway); their changes still stream.
constexpr size_t kWatchQueuedJobs = 500;
constexpr int kWatchEndedJobs = 50;
constexpr int kWatchEndedJobsMax = 1000;

std::vector<int64_t> WorkersOf(const JobRecord& rec) {
  std::vector<int64_t> workers;
  if (rec.state != v1::JOB_STATE_RUNNING &&
      rec.state != v1::JOB_STATE_CANCELLING) {
    return workers;
  }
  for (const Part& p : rec.parts) workers.push_back(p.worker);
  return workers;
}

// A stream carries every change of every job: the summary is enough to
// show it, and `dlbatch show` has the rest.
void CutToSummary(const v1::JobSpec& full, v1::Job* view) {
  v1::JobSpec spec;
  spec.set_name(full.name());
  spec.set_profile(full.profile());
  spec.set_pool(full.pool());
  spec.set_priority(full.priority());
  spec.set_max_nodes(full.max_nodes());
  spec.set_time_limit_s(full.time_limit_s());
  *view->mutable_spec() = std::move(spec);
}

}  // namespace

v1::Job Watchers::JobView(const SchedulerState& s, const ActiveJob& job) const {
  s.mu_.AssertHeld();
  const JobRecord& rec = job.record;
  v1::Job view = s.RecordToProto(rec);
  CutToSummary(rec.spec, &view);
  if (job.cancel_requested && !IsTerminal(rec.state)) {
    view.set_state(v1::JOB_STATE_CANCELLING);
  }
  if (rec.state == v1::JOB_STATE_QUEUED)
    view.set_wait_reason(WaitReason(s, job));
  view.set_held(job.held);
  if (!job.preemptions.empty())
    *view.add_preemptions() = job.preemptions.back();
  if (job.progress.iterations() > 0 || job.progress.time_ms() > 0)
    *view.mutable_progress() = job.progress;
  for (auto& part : *view.mutable_placement()) {
    auto w = s.workers_.find(part.worker_id());
    if (w != s.workers_.end()) part.set_worker_name(w->second.record.name);
  }
  return view;
}

v1::WorkerInfo Watchers::WorkerView(const SchedulerState& s,
                                    const WorkerState& w) const {
  s.mu_.AssertHeld();
  v1::WorkerInfo info;
  const int64_t id = w.record.id;
  info.set_id(id);
  info.set_name(w.record.name);
  info.set_host(w.record.host);
  info.set_profile(w.record.profile);
  info.set_online(w.session != nullptr);
  for (const auto& d : w.record.devices) *info.add_devices() = d;
  info.set_free_slots(
      w.session ? static_cast<int>(s.core_->FreeDevices(id).size()) : 0);
  for (int64_t job : s.watched_slots_.Jobs(id)) info.add_running_jobs(job);
  info.set_last_seen_ms(w.record.last_seen_ms);
  info.set_version(w.version);
  info.set_draining(w.draining);
  info.set_drain_reason(w.drain_reason);
  if (w.session != nullptr) {
    info.mutable_gpus()->Add(w.gpus.begin(), w.gpus.end());
    info.set_gpus_read_ms(w.gpus_read_ms);
  }
  return info;
}

void Watchers::PublishJob(SchedulerState& s, int64_t job_id) {
  s.mu_.AssertHeld();
  if (!events_.has_watchers()) return;
  auto it = s.jobs_.find(job_id);
  if (it == s.jobs_.end()) return;
  const int64_t now = s.clock_->NowMs();
  events_.PublishJob(JobView(s, it->second), now);
  for (int64_t worker :
       s.watched_slots_.Set(job_id, WorkersOf(it->second.record))) {
    PublishWorker(s, worker);
  }
}

void Watchers::PublishWorker(SchedulerState& s, int64_t worker_id) {
  s.mu_.AssertHeld();
  if (!events_.has_watchers()) return;
  auto it = s.workers_.find(worker_id);
  if (it == s.workers_.end()) return;
  events_.PublishWorker(WorkerView(s, it->second), s.clock_->NowMs());
}

void Watchers::PublishRemoved(SchedulerState& s, const WorkerState& w) {
  s.mu_.AssertHeld();
  if (!events_.has_watchers()) return;
  // Monitors drop it; a plain update would leave it there as offline.
  v1::WorkerInfo gone = WorkerView(s, w);
  gone.set_removed(true);
  events_.PublishWorker(std::move(gone), s.clock_->NowMs());
}

void Watchers::PublishAll(SchedulerState& s) {
  s.mu_.AssertHeld();
  if (!events_.has_watchers()) return;
  s.watched_slots_.Clear();
  for (const auto& [id, job] : s.jobs_) PublishJob(s, id);
  for (const auto& [id, w] : s.workers_) PublishWorker(s, id);
}

absl::StatusOr<std::shared_ptr<WatchQueue>> Watchers::Watch(
    const v1::WatchEventsRequest& request, EventWriter* writer,
    const WatchOptions& options) {
  auto queue = std::make_shared<WatchQueue>(writer, options);
  const int64_t only = options.only_job;
  int64_t now = 0;
  bool in_memory = false;
  {
    absl::MutexLock lock(&state_.mu_);
    now = state_.clock_->NowMs();
    // The first watcher rebuilds the index that later changes keep current.
    if (!events_.has_watchers()) {
      state_.watched_slots_.Clear();
      for (const auto& [id, job] : state_.jobs_)
        state_.watched_slots_.Set(id, WorkersOf(job.record));
    }
    if (only != 0) {
      // One job's stream: its state now, and no view of any other.
      if (auto it = state_.jobs_.find(only); it != state_.jobs_.end()) {
        in_memory = true;
        queue->PutJob(
            std::make_shared<const v1::Job>(JobView(state_, it->second)), now);
      }
    } else {
      std::vector<int64_t> running, queued;
      for (const auto& [id, job] : state_.jobs_) {
        (job.record.state == v1::JOB_STATE_QUEUED ? queued : running)
            .push_back(id);
      }
      std::sort(running.begin(), running.end());
      std::sort(queued.begin(), queued.end());
      if (queued.size() > kWatchQueuedJobs) queued.resize(kWatchQueuedJobs);
      for (const auto* ids : {&running, &queued}) {
        for (int64_t id : *ids) {
          queue->PutJob(std::make_shared<const v1::Job>(
                            JobView(state_, state_.jobs_.at(id))),
                        now);
        }
      }
      for (const auto& [id, worker] : state_.workers_) {
        queue->PutWorker(
            std::make_shared<const v1::WorkerInfo>(WorkerView(state_, worker)),
            now);
      }
    }
    // From here every change reaches the queue, so nothing falls between
    // the snapshot and the stream.
    events_.Add(queue);
  }
  // Ended jobs come from the store, after subscribing: a job that ends
  // meanwhile is either in this read or published to the queue (or both;
  // the queue keeps the published state).
  if (only != 0) {
    if (!in_memory) {
      absl::StatusOr<std::optional<JobRecord>> rec =
          state_.reader_->GetJob(only);
      if (!rec.ok()) {
        events_.Remove(queue.get());
        return rec.status();
      }
      if (*rec) {
        v1::Job view = SchedulerState::RecordToProto(**rec);
        CutToSummary((*rec)->spec, &view);
        queue->PutJobIfAbsent(std::make_shared<const v1::Job>(std::move(view)),
                              now);
      }
    }
    queue->PutSnapshotDone(now);
    return queue;
  }
  int limit = request.ended_jobs() > 0
                  ? std::min(request.ended_jobs(), kWatchEndedJobsMax)
                  : kWatchEndedJobs;
  v1::ListJobsReply ended;
  absl::Status s = state_.reader_->ListJobSummaries(
      {v1::JOB_STATE_FINISHED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED},
      limit,
      /*newest_first=*/true, &ended);
  if (!s.ok()) {
    events_.Remove(queue.get());
    return s;
  }
  for (auto it = ended.mutable_jobs()->rbegin();
       it != ended.mutable_jobs()->rend(); ++it) {
    queue->PutJobIfAbsent(std::make_shared<const v1::Job>(std::move(*it)), now);
  }
  queue->PutSnapshotDone(now);
  return queue;
}

std::string Watchers::WaitReason(const SchedulerState& s,
                                 const ActiveJob& job) const {
  s.mu_.AssertHeld();
  return WaitReason(s, job, std::nullopt);
}

std::string Watchers::WaitReason(
    const SchedulerState& s, const ActiveJob& job,
    const std::optional<WaitInfo>& explained) const {
  s.mu_.AssertHeld();
  if (std::string control = s.control().ControlWaitReason(s, job);
      !control.empty()) {
    return control;
  }
  // Its victims stopping say more than the queue it waits in (the core's
  // or Slurm's).
  if (std::string preempting = s.preemptions().WaitReason(s, job);
      !preempting.empty()) {
    return preempting;
  }
  if (s.bridge().ProfileOf(job.record.spec.profile()) != nullptr) {
    s.SlurmLockHeld();
    return s.bridge().WaitReason(job.record.id, job.record.attempt);
  }
  const std::optional<WaitInfo> info =
      explained ? explained : s.core_->Explain(job.record.id);
  if (!info) return "";
  const std::string& profile = job.record.spec.profile();
  if (info->array_limited) return ArrayWaitText(info->array);
  if (info->over_limit) {
    return absl::StrFormat("waiting: %s holds %d of their %d slot%s on '%s'",
                           info->user, info->user_slots, info->user_slot_limit,
                           info->user_slot_limit == 1 ? "" : "s", profile);
  }
  // It fits only with workers that take no jobs now: those are the news.
  if (std::string workers = s.control().WorkersWaitReason(s, *info);
      !workers.empty()) {
    return workers;
  }
  // Workers that do not run the user's jobs are left out of the counts.
  std::string reason = s.users().UsersWaitReason(s, job, *info);
  if (reason.empty()) {
    reason =
        absl::StrFormat("waiting for %d slot%s on '%s': %d free", info->needed,
                        info->needed == 1 ? "" : "s", profile, info->free_now);
  }
  if (info->unable_workers == 0 && job.record.spec.max_nodes() <= 1 &&
      info->free_now >= info->needed) {
    absl::StrAppendFormat(&reason, " (at most %d on one worker)",
                          info->largest_free);
  }
  if (info->offline_slots > 0) {
    absl::StrAppendFormat(&reason, ", %d offline", info->offline_slots);
  }
  if (info->draining_slots > 0) {
    absl::StrAppendFormat(&reason, ", %d draining", info->draining_slots);
  }
  if (info->jobs_ahead > 0) {
    absl::StrAppendFormat(&reason, ", %d job%s ahead (#%d, priority %d)",
                          info->jobs_ahead, info->jobs_ahead == 1 ? "" : "s",
                          info->first_ahead, info->first_ahead_priority);
  }
  if (info->reserved && info->reserved_start != kNever) {
    absl::StrAppend(&reason, "; next to start, in about ",
                    FormatDurationMs(info->reserved_start - s.clock_->NowMs()));
  } else if (info->reserved) {
    absl::StrAppend(&reason, "; next to start, when running jobs end");
  }
  return reason;
}

void Watchers::Unwatch(const WatchQueue* queue) { events_.Remove(queue); }

}  // namespace dlbatch::scheduler
