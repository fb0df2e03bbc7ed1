// Worker streams, liveness and recovery: the loop thread's side of the
// scheduler.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

int SlotCount(const std::vector<v1::Device>& devices) {
  return static_cast<int>(devices.size());
}

}  // namespace

absl::Status Scheduler::Start() {
  absl::MutexLock lock(&mu_);
  {
    Transaction txn(store_->db());
    RETURN_IF_ERROR(txn.status());
    RETURN_IF_ERROR(store_->UpsertProfile("local", 0));
    for (const auto& [name, max_pool] : options_.profiles) {
      RETURN_IF_ERROR(store_->UpsertProfile(name, max_pool));
    }
    RETURN_IF_ERROR(txn.Commit());
  }
  ASSIGN_OR_RETURN(auto profiles, store_->Profiles());
  for (const auto& [name, max_pool] : profiles)
    core_.AddProfile(name, max_pool);

  int64_t mono = clock_->MonotonicMs();
  ASSIGN_OR_RETURN(auto workers, store_->Workers());
  for (auto& w : workers) {
    // Known but offline until it reconnects; its running jobs keep their
    // slots until it reports them or is declared lost.
    core_.WorkerOnline(w.id, w.profile, SlotCount(w.devices));
    core_.WorkerOffline(w.id);
    WorkerState& state = workers_[w.id];
    state.record = std::move(w);
    state.last_seen_mono = mono;
  }
  ASSIGN_OR_RETURN(auto jobs, store_->ActiveJobs());
  size_t queued = 0, running = 0;
  for (auto& rec : jobs) {
    ActiveJob& job = jobs_[rec.id];
    job.record = std::move(rec);
    const JobRecord& r = job.record;
    if (r.spec.has_train()) {
      ASSIGN_OR_RETURN(TrainState train, store_->GetTrainState(r.id));
      job.progress = std::move(train.progress);
      job.checkpoint = std::move(train.checkpoint);
      if (r.state != v1::JOB_STATE_QUEUED) rendezvous_.Open(r.id, r.attempt);
    }
    if (r.state == v1::JOB_STATE_QUEUED) {
      core_.Enqueue(ToQueued(r));
      ++queued;
    } else {
      job.part_ended.assign(r.parts.size(), false);
      job.part_exit.assign(r.parts.size(), 0);
      job.cancel_requested = r.state == v1::JOB_STATE_CANCELLING;
      if (job.cancel_requested) job.cancel_reason = r.reason;
      core_.MarkRunning(ToQueued(r), r.parts, r.start_ms);
      ++running;
    }
  }
  spdlog::info("recovered {} queued and {} running jobs, {} workers", queued,
               running, workers_.size());
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Scheduler::OnWorkerMessage(std::shared_ptr<WorkerSession> session,
                                v1::WorkerMessage message) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(Event{std::move(session), std::move(message)});
  queue_cv_.Signal();
}

void Scheduler::OnWorkerGone(std::shared_ptr<WorkerSession> session) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(Event{std::move(session), std::nullopt});
  queue_cv_.Signal();
}

void Scheduler::Loop() {
  const int64_t tick_ms =
      std::max<int64_t>(50, options_.heartbeat_interval_ms / 2);
  int64_t next_check = clock_->MonotonicMs() + tick_ms;
  for (;;) {
    std::deque<Event> batch;
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
    if (!batch.empty()) ProcessBatch(batch);
    if (clock_->MonotonicMs() >= next_check) {
      CheckLiveness();
      next_check = clock_->MonotonicMs() + tick_ms;
    }
  }
}

void Scheduler::ProcessBatch(std::deque<Event>& batch) {
  Outbox out;
  Outbox acks;  // sent only after the commit that makes them true
  {
    absl::MutexLock lock(&mu_);
    Transaction txn(store_->db());
    if (!txn.status().ok()) {
      spdlog::critical("cannot open a transaction: {}",
                       txn.status().ToString());
      std::abort();
    }
    for (Event& e : batch) {
      if (!e.message) {
        HandleGone(e.session);
        continue;
      }
      const v1::WorkerMessage& m = *e.message;
      auto it = session_worker_.find(e.session.get());
      if (m.has_register_()) {
        HandleRegister(e.session, m.register_(), &out);
        continue;
      }
      if (it == session_worker_.end())
        continue;  // not registered (or replaced)
      WorkerState& worker = workers_.at(it->second);
      worker.last_seen_mono = clock_->MonotonicMs();
      worker.record.last_seen_ms = clock_->NowMs();
      if (m.has_diary()) {
        const v1::DiaryBatch& d = m.diary();
        int64_t max_seq = -1;
        for (const auto& line : d.lines()) {
          auto added =
              store_->AddDiary(d.job_id(), d.attempt(), d.part(), line.seq(),
                               line.time_ms(), line.stream(), line.text());
          if (!added.ok()) {
            spdlog::critical("cannot store diary: {}",
                             added.status().ToString());
            std::abort();
          }
          max_seq = std::max(max_seq, line.seq());
        }
        Changed(d.job_id());
        v1::SchedulerMessage ack;
        ack.mutable_diary_ack()->set_job_id(d.job_id());
        ack.mutable_diary_ack()->set_attempt(d.attempt());
        ack.mutable_diary_ack()->set_part(d.part());
        ack.mutable_diary_ack()->set_seq(max_seq);
        acks.emplace_back(e.session, std::move(ack));
      } else if (m.has_progress()) {
        HandleProgress(it->second, m.progress());
      } else if (m.has_checkpoint()) {
        HandleCheckpoint(it->second, m.checkpoint());
      } else if (m.has_ended()) {
        HandleEnded(it->second, m.ended(), &out);
        v1::SchedulerMessage ack;
        ack.mutable_ended_ack()->set_job_id(m.ended().job_id());
        ack.mutable_ended_ack()->set_attempt(m.ended().attempt());
        ack.mutable_ended_ack()->set_part(m.ended().part());
        acks.emplace_back(e.session, std::move(ack));
      }
      // Heartbeat and JobStarted only refresh liveness.
    }
    MustCommitBatch(txn);
    if (auto s = PlaceJobs(&out); !s.ok())
      spdlog::error("placement: {}", s.ToString());
  }
  Deliver(acks);
  Deliver(out);
}

void Scheduler::MustCommitBatch(Transaction& txn) {
  absl::Status s = txn.Commit();
  if (!s.ok()) {
    spdlog::critical(
        "cannot commit worker reports: {}; stopping so that a restart recovers",
        s.ToString());
    std::abort();
  }
}

void Scheduler::HandleRegister(const std::shared_ptr<WorkerSession>& session,
                               const v1::Register& reg, Outbox* out) {
  if (reg.name().empty() || reg.profile().empty()) {
    v1::SchedulerMessage refuse;
    refuse.set_refused("a worker must give a name and a profile");
    out->emplace_back(session, std::move(refuse));
    return;
  }
  WorkerRecord rec;
  rec.name = reg.name();
  rec.host = reg.host();
  rec.profile = reg.profile();
  rec.devices.assign(reg.devices().begin(), reg.devices().end());
  rec.last_seen_ms = clock_->NowMs();
  auto id = store_->UpsertWorker(rec);
  if (!id.ok()) {
    spdlog::critical("cannot record worker: {}", id.status().ToString());
    std::abort();
  }
  rec.id = *id;
  WorkerState& worker = workers_[rec.id];
  if (worker.session && worker.session != session) {
    session_worker_.erase(worker.session.get());
    worker.session->Close("replaced by a newer connection of the same worker");
  }
  const bool was_lost = worker.lost;
  worker.record = rec;
  worker.session = session;
  worker.lost = false;
  worker.last_seen_mono = clock_->MonotonicMs();
  session_worker_[session.get()] = rec.id;
  if (!core_.HasProfile(rec.profile)) {
    (void)store_->UpsertProfile(rec.profile, 0);
  }
  core_.WorkerOnline(rec.id, rec.profile, SlotCount(rec.devices));

  // Reconcile what the worker runs with what the store says it runs.
  std::set<std::tuple<int64_t, int, int>> reported;
  for (const auto& r : reg.running())
    reported.emplace(r.job_id(), r.attempt(), r.part());
  v1::SchedulerMessage registered;
  registered.mutable_registered()->set_worker_id(rec.id);
  registered.mutable_registered()->set_heartbeat_interval_ms(
      options_.heartbeat_interval_ms);
  // Parts cancelled while the worker was away (or just before a restart):
  // the CancelJob sent then may never have reached it, so it goes again.
  Outbox cancels;
  for (const auto& r : reg.running()) {
    auto it = jobs_.find(r.job_id());
    bool ours = it != jobs_.end() && it->second.record.attempt == r.attempt() &&
                r.part() >= 0 &&
                r.part() < static_cast<int>(it->second.record.parts.size()) &&
                it->second.record.parts[r.part()].worker == rec.id;
    if (!ours) {
      *registered.mutable_registered()->add_cancel() = r;
    } else if (it->second.cancel_requested &&
               !it->second.part_ended[r.part()]) {
      v1::SchedulerMessage msg;
      auto* cancel = msg.mutable_cancel();
      cancel->set_job_id(r.job_id());
      cancel->set_attempt(r.attempt());
      cancel->set_part(r.part());
      cancel->set_grace_ms(options_.cancel_grace_ms);
      cancel->set_reason(it->second.cancel_reason);
      cancels.emplace_back(session, std::move(msg));
    }
  }
  std::vector<int64_t> lost;
  for (auto& [job_id, job] : jobs_) {
    if (job.record.state == v1::JOB_STATE_QUEUED) continue;
    for (size_t p = 0; p < job.record.parts.size(); ++p) {
      if (job.record.parts[p].worker != rec.id || job.part_ended[p]) continue;
      if (!reported.contains(
              {job_id, job.record.attempt, static_cast<int>(p)})) {
        lost.push_back(job_id);
      }
    }
  }
  out->emplace_back(session, std::move(registered));
  for (auto& c : cancels) out->push_back(std::move(c));
  for (int64_t job_id : lost) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    std::string why =
        absl::StrCat("worker '", rec.name, "' restarted without the job");
    core_.Finished(job_id);
    (void)RequeueLost(it->second, why, out);
  }
  PublishWorker(rec.id);
  spdlog::info("worker '{}' (#{}) {} profile '{}' with {} slots", rec.name,
               rec.id, was_lost ? "rejoined" : "joined", rec.profile,
               rec.devices.size());
}

void Scheduler::HandleEnded(int64_t worker_id, const v1::JobEnded& ended,
                            Outbox* out) {
  // Unknown once ended (a resend of an acknowledged report), or stale.
  ActiveJob* reported =
      ReportedJob(worker_id, ended.job_id(), ended.attempt(), ended.part());
  const int part = ended.part();
  if (reported == nullptr || reported->part_ended[part]) return;
  ActiveJob& job = *reported;
  JobRecord& rec = job.record;
  job.part_ended[part] = true;
  job.part_exit[part] = ended.exit_code();
  bool part_failed = ended.state() != v1::JOB_STATE_FINISHED;
  if (part_failed && job.failure.empty()) {
    job.failure = ended.reason().empty() ? "failed" : ended.reason();
    if (rec.parts.size() > 1 && !job.cancel_requested) {
      CancelParts(job, absl::StrCat("part ", part, " failed"), part, out);
    }
  }
  if (part == 0 || rec.parts.size() == 1) {
    // Outputs come from part 0 (the only part of most jobs).
    std::vector<v1::OutputFile> files;
    for (const auto& f : ended.outputs()) {
      if (!f.symlink().empty() && f.sha256().empty() && f.size() == 0) {
        files.push_back(f);  // a symlink's target, kept as text
        continue;
      }
      auto size = blobs_->Size(f.sha256());
      if (!size.ok() || *size != f.size()) {
        if (job.failure.empty()) {
          job.failure =
              absl::StrCat("output '", f.path(), "' is missing from the store");
        }
        continue;
      }
      files.push_back(f);
    }
    (void)store_->PutOutputs(rec.id, files);
  }
  if (std::find(job.part_ended.begin(), job.part_ended.end(), false) !=
      job.part_ended.end()) {
    return;
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
  core_.Finished(id);
  (void)EndJob(job, final_state, job.part_exit[0], reason);
  jobs_.erase(id);
}

void Scheduler::HandleGone(const std::shared_ptr<WorkerSession>& session) {
  auto it = session_worker_.find(session.get());
  if (it == session_worker_.end()) return;
  WorkerState& worker = workers_.at(it->second);
  session_worker_.erase(it);
  if (worker.session == session) {
    worker.session = nullptr;
    core_.WorkerOffline(worker.record.id);
    spdlog::warn(
        "worker '{}' disconnected; lost unless it returns within {} ms",
        worker.record.name, options_.heartbeat_timeout_ms);
    PublishWorker(worker.record.id);
  }
}

void Scheduler::CheckLiveness() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    int64_t now = clock_->MonotonicMs();
    std::vector<int64_t> expired;
    for (auto& [id, w] : workers_) {
      if (!w.lost && now - w.last_seen_mono > options_.heartbeat_timeout_ms) {
        expired.push_back(id);
      }
    }
    if (expired.empty()) return;
    Transaction txn(store_->db());
    if (!txn.status().ok()) return;  // try again at the next tick
    for (int64_t id : expired) {
      WorkerState& w = workers_.at(id);
      LoseWorker(
          w,
          absl::StrCat("worker '", w.record.name, "' lost: silent for over ",
                       options_.heartbeat_timeout_ms, " ms"),
          &out);
    }
    MustCommitBatch(txn);
    if (auto s = PlaceJobs(&out); !s.ok())
      spdlog::error("placement: {}", s.ToString());
  }
  Deliver(out);
}

void Scheduler::LoseWorker(WorkerState& worker, const std::string& why,
                           Outbox* out) {
  spdlog::warn("{}", why);
  worker.lost = true;
  if (worker.session) {
    session_worker_.erase(worker.session.get());
    worker.session->Close(why);
    worker.session = nullptr;
  }
  for (JobId job_id : core_.WorkerLost(worker.record.id)) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    (void)RequeueLost(it->second, why, out);
  }
  PublishWorker(worker.record.id);
}

Scheduler::ActiveJob* Scheduler::ReportedJob(int64_t worker_id, int64_t job_id,
                                             int attempt, int part) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return nullptr;
  const JobRecord& rec = it->second.record;
  if (rec.attempt != attempt || part < 0 ||
      part >= static_cast<int>(rec.parts.size()) ||
      rec.parts[part].worker != worker_id) {
    return nullptr;
  }
  return &it->second;
}

void Scheduler::HandleProgress(int64_t worker_id,
                               const v1::JobProgress& report) {
  ActiveJob* job =
      ReportedJob(worker_id, report.job_id(), report.attempt(), report.part());
  if (job == nullptr || report.part() != 0) return;
  const int64_t checkpoint_iteration = job->progress.checkpoint_iteration();
  job->progress = report.progress();
  job->progress.set_checkpoint_iteration(checkpoint_iteration);
  (void)store_->PutProgress(report.job_id(), job->progress);
  Changed(report.job_id());
}

void Scheduler::HandleCheckpoint(int64_t worker_id,
                                 const v1::CheckpointStored& report) {
  ActiveJob* job =
      ReportedJob(worker_id, report.job_id(), report.attempt(), report.part());
  if (job == nullptr || report.part() != 0) return;
  if (job->checkpoint.files_size() > 0 &&
      report.iteration() < job->checkpoint.iteration()) {
    return;  // a resend of an older one
  }
  for (const auto& f : report.files()) {
    auto size = blobs_->Size(f.sha256());
    if (!size.ok() || *size != f.size()) {
      spdlog::warn("job {}: checkpoint file '{}' is not in the store; ignored",
                   report.job_id(), f.path());
      return;
    }
  }
  job->checkpoint = report;
  job->progress.set_checkpoint_iteration(report.iteration());
  (void)store_->PutCheckpoint(report.job_id(), report);
  (void)store_->PutProgress(report.job_id(), job->progress);
  Changed(report.job_id());
}

absl::Status Scheduler::RequeueLost(ActiveJob& job, const std::string& why,
                                    Outbox* out) {
  JobRecord& rec = job.record;
  rendezvous_.Drop(rec.id);
  // Parts on other workers must stop too: the job restarts as a whole.
  CancelParts(job, why, -1, out);
  core_.Finished(rec.id);  // other parts' slots (no-op if already released)
  if (job.cancel_requested) {
    RETURN_IF_ERROR(
        EndJob(job, v1::JOB_STATE_CANCELLED, -1, job.cancel_reason));
    jobs_.erase(rec.id);
    return absl::OkStatus();
  }
  if (rec.attempt >= options_.max_attempts) {
    std::string reason = absl::StrCat(why, " (attempt ", rec.attempt, " of ",
                                      options_.max_attempts, ")");
    Diary(rec.id, rec.attempt,
          absl::StrCat("[dlbatch] ", reason, "; job failed"));
    RETURN_IF_ERROR(EndJob(job, v1::JOB_STATE_FAILED, -1, reason));
    jobs_.erase(rec.id);
    return absl::OkStatus();
  }
  Diary(rec.id, rec.attempt,
        absl::StrCat("[dlbatch] ", why, "; job requeued (attempt ",
                     rec.attempt + 1, " of ", options_.max_attempts, " next)"));
  rec.parts.clear();
  job.part_ended.clear();
  job.part_exit.clear();
  job.failure.clear();
  RETURN_IF_ERROR(SetState(job, v1::JOB_STATE_QUEUED, why));
  core_.Enqueue(ToQueued(rec));
  return absl::OkStatus();
}

absl::Status Scheduler::SetState(ActiveJob& job, v1::JobState state,
                                 const std::string& reason) {
  JobRecord& rec = job.record;
  rec.state = state;
  if (state == v1::JOB_STATE_CANCELLING) rec.reason = reason;
  RETURN_IF_ERROR(store_->UpdateJob(rec));
  RETURN_IF_ERROR(
      store_->AddEvent(rec.id, state, rec.attempt, clock_->NowMs(), reason));
  Changed(rec.id);
  return absl::OkStatus();
}

absl::Status Scheduler::EndJob(ActiveJob& job, v1::JobState state,
                               int exit_code, const std::string& reason) {
  JobRecord& rec = job.record;
  rendezvous_.Drop(rec.id);
  rec.end_ms = clock_->NowMs();
  rec.exit_code = exit_code;
  rec.reason = reason;
  return SetState(job, state, reason);
}

void Scheduler::CancelParts(const ActiveJob& job, const std::string& why,
                            int skip_part, Outbox* out) {
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

void Scheduler::Diary(int64_t job_id, int attempt, const std::string& text) {
  (void)store_->AddDiary(job_id, attempt, 0, -1, clock_->NowMs(), 0, text);
  Changed(job_id);
}

}  // namespace dlbatch::scheduler
