// WatchEvents: the snapshot a new stream starts with, and the publishing of
// job and worker changes to every open stream (see event_hub.h).
#include <algorithm>

#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/scheduler.h"

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

}  // namespace

v1::Job Scheduler::JobView(const ActiveJob& job) const {
  mu_.AssertHeld();
  const JobRecord& rec = job.record;
  v1::Job view = RecordToProto(rec);
  // A stream carries every change of every job: the summary is enough to
  // show it, and `dlbatch show` has the rest.
  v1::JobSpec spec;
  spec.set_name(rec.spec.name());
  spec.set_profile(rec.spec.profile());
  spec.set_pool(rec.spec.pool());
  spec.set_priority(rec.spec.priority());
  spec.set_max_nodes(rec.spec.max_nodes());
  spec.set_time_limit_s(rec.spec.time_limit_s());
  *view.mutable_spec() = std::move(spec);
  if (job.cancel_requested && !IsTerminal(rec.state)) {
    view.set_state(v1::JOB_STATE_CANCELLING);
  }
  if (rec.state == v1::JOB_STATE_QUEUED) view.set_wait_reason(WaitReason(job));
  view.set_held(job.held);
  if (job.progress.iterations() > 0) *view.mutable_progress() = job.progress;
  for (auto& part : *view.mutable_placement()) {
    auto w = workers_.find(part.worker_id());
    if (w != workers_.end()) part.set_worker_name(w->second.record.name);
  }
  return view;
}

v1::WorkerInfo Scheduler::WorkerView(const WorkerState& w) const {
  mu_.AssertHeld();
  v1::WorkerInfo info;
  const int64_t id = w.record.id;
  info.set_id(id);
  info.set_name(w.record.name);
  info.set_host(w.record.host);
  info.set_profile(w.record.profile);
  info.set_online(w.session != nullptr);
  for (const auto& d : w.record.devices) *info.add_devices() = d;
  info.set_free_slots(
      w.session ? static_cast<int>(core_->FreeDevices(id).size()) : 0);
  for (int64_t job : watched_slots_.Jobs(id)) info.add_running_jobs(job);
  info.set_last_seen_ms(w.record.last_seen_ms);
  info.set_version(w.version);
  info.set_draining(w.draining);
  info.set_drain_reason(w.drain_reason);
  return info;
}

void Scheduler::PublishJob(int64_t job_id) {
  mu_.AssertHeld();
  if (!events_.has_watchers()) return;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const int64_t now = clock_->NowMs();
  events_.PublishJob(JobView(it->second), now);
  for (int64_t worker :
       watched_slots_.Set(job_id, WorkersOf(it->second.record))) {
    PublishWorker(worker);
  }
}

void Scheduler::PublishWorker(int64_t worker_id) {
  mu_.AssertHeld();
  if (!events_.has_watchers()) return;
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  events_.PublishWorker(WorkerView(it->second), clock_->NowMs());
}

absl::StatusOr<std::shared_ptr<WatchQueue>> Scheduler::Watch(
    const v1::WatchEventsRequest& request, EventWriter* writer) {
  auto queue = std::make_shared<WatchQueue>(writer);
  int64_t now = 0;
  {
    absl::MutexLock lock(&mu_);
    now = clock_->NowMs();
    // The first watcher rebuilds the index that later changes keep current.
    if (!events_.has_watchers()) {
      watched_slots_.Clear();
      for (const auto& [id, job] : jobs_)
        watched_slots_.Set(id, WorkersOf(job.record));
    }
    std::vector<int64_t> running, queued;
    for (const auto& [id, job] : jobs_) {
      (job.record.state == v1::JOB_STATE_QUEUED ? queued : running)
          .push_back(id);
    }
    std::sort(running.begin(), running.end());
    std::sort(queued.begin(), queued.end());
    if (queued.size() > kWatchQueuedJobs) queued.resize(kWatchQueuedJobs);
    for (const auto* ids : {&running, &queued}) {
      for (int64_t id : *ids) {
        queue->PutJob(std::make_shared<const v1::Job>(JobView(jobs_.at(id))),
                      now);
      }
    }
    for (const auto& [id, worker] : workers_) {
      queue->PutWorker(
          std::make_shared<const v1::WorkerInfo>(WorkerView(worker)), now);
    }
    // From here every change reaches the queue, so nothing falls between
    // the snapshot and the stream.
    events_.Add(queue);
  }
  // Ended jobs come from the store, after subscribing: a job that ends
  // meanwhile is either in this read or published to the queue (or both;
  // the queue keeps the published state).
  int limit = request.ended_jobs() > 0
                  ? std::min(request.ended_jobs(), kWatchEndedJobsMax)
                  : kWatchEndedJobs;
  v1::ListJobsReply ended;
  absl::Status s = reader_->ListJobSummaries(
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

void Scheduler::Unwatch(const WatchQueue* queue) { events_.Remove(queue); }

}  // namespace dlbatch::scheduler
