// Worker streams, liveness and recovery: the loop thread's side of the
// scheduler.
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
    if (r.spec.has_train()) {
      ASSIGN_OR_RETURN(TrainState train, store_->GetTrainState(r.id));
      job.progress = std::move(train.progress);
      job.checkpoint = std::move(train.checkpoint);
      if (r.state != v1::JOB_STATE_QUEUED && open_rendezvous)
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
  RETURN_IF_ERROR(LoadPartEnds());
  RETURN_IF_ERROR(control_.Load(*this));
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
      disk_->Check();
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
    if (!broken_.ok()) {
      Recover(broken_);
      if (!broken_.ok()) {
        // Nothing can be recorded: every stream is dropped, and workers
        // resend once the store works again.
        for (Event& e : batch) {
          if (e.session)
            e.session->Close("the scheduler cannot write its store");
        }
        return;
      }
    }
    absl::Status failed;
    {
      Transaction txn(store_->db());
      failed = txn.status();
      for (Event& e : batch) {
        if (!failed.ok()) break;
        failed = HandleEvent(e, &out, &acks);
      }
      if (failed.ok()) failed = TimedCommit(txn);
    }  // rolled back unless committed
    if (!failed.ok()) {
      // Memory may be ahead of the store: nothing of this batch is sent.
      Recover(failed);
      return;
    }
    (void)PlaceJobs(&out);
  }
  Deliver(acks);
  Deliver(out);
}

absl::Status Scheduler::HandleEvent(Event& e, Outbox* out, Outbox* acks) {
  mu_.AssertHeld();
  if (!e.message) return HandleGone(e.session);
  const v1::WorkerMessage& m = *e.message;
  if (m.has_register_()) return HandleRegister(e.session, m.register_(), out);
  auto it = session_worker_.find(e.session.get());
  if (it == session_worker_.end()) {
    return absl::OkStatus();  // not registered (or replaced)
  }
  const int64_t worker_id = it->second;
  WorkerState& worker = workers_.at(worker_id);
  worker.last_seen_mono = clock_->MonotonicMs();
  worker.record.last_seen_ms = clock_->NowMs();
  if (metrics_ != nullptr) NoteReport(m);
  if (m.has_ended()) {
    // Failures tied to the report become the job's failure (HandleEnded).
    RETURN_IF_ERROR(HandleEnded(worker_id, m.ended(), out));
    v1::SchedulerMessage ack;
    ack.mutable_ended_ack()->set_job_id(m.ended().job_id());
    ack.mutable_ended_ack()->set_attempt(m.ended().attempt());
    ack.mutable_ended_ack()->set_part(m.ended().part());
    acks->emplace_back(e.session, std::move(ack));
    return absl::OkStatus();
  }
  if (m.has_user_answer()) {
    // Memory only: answers hold for this session (users.cc).
    core_->SetWorkerUser(worker_id, m.user_answer().user(),
                         m.user_answer().known());
    if (m.user_answer().known()) {
      worker.unknown_since.erase(m.user_answer().user());
    } else {
      worker.unknown_since[m.user_answer().user()] = clock_->MonotonicMs();
    }
    return absl::OkStatus();
  }
  if (!m.has_diary() && !m.has_progress() && !m.has_checkpoint()) {
    return absl::OkStatus();  // heartbeat and JobStarted refresh liveness
  }
  Savepoint savepoint(store_->db());
  RETURN_IF_ERROR(savepoint.status());
  absl::Status s;
  int64_t job_id = 0;
  int attempt = 0;
  std::string what;
  if (m.has_diary()) {
    s = HandleDiary(m.diary());
    job_id = m.diary().job_id();
    attempt = m.diary().attempt();
    what = absl::StrCat(m.diary().lines_size(), " diary lines of part ",
                        m.diary().part());
  } else if (m.has_progress()) {
    s = HandleProgress(worker_id, m.progress());
    job_id = m.progress().job_id();
    attempt = m.progress().attempt();
    what = "a progress report";
  } else {
    s = HandleCheckpoint(worker_id, m.checkpoint());
    job_id = m.checkpoint().job_id();
    attempt = m.checkpoint().attempt();
    what = "a checkpoint report";
  }
  if (IsStoreFailure(s)) return s;
  if (s.ok()) {
    RETURN_IF_ERROR(savepoint.Release());
    if (m.has_diary() && metrics_ != nullptr) {
      int64_t bytes = 0;
      for (const auto& line : m.diary().lines()) bytes += line.text().size();
      metrics_->DiaryStored(m.diary().lines_size(), bytes);
    }
  } else {
    // Refused once: undone, acknowledged below so the worker does not send
    // it again, and said where the job's owner looks.
    RETURN_IF_ERROR(savepoint.Undo());
    std::string why =
        absl::StrCat("[dlbatch] ", what, " from worker '", worker.record.name,
                     "' could not be stored and were refused: ", s.message());
    spdlog::warn("job {}: {}", job_id, why);
    if (jobs_.contains(job_id)) RETURN_IF_ERROR(Diary(job_id, attempt, why));
  }
  if (m.has_diary()) {
    const v1::DiaryBatch& d = m.diary();
    int64_t max_seq = -1;
    for (const auto& line : d.lines()) max_seq = std::max(max_seq, line.seq());
    v1::SchedulerMessage ack;
    ack.mutable_diary_ack()->set_job_id(d.job_id());
    ack.mutable_diary_ack()->set_attempt(d.attempt());
    ack.mutable_diary_ack()->set_part(d.part());
    ack.mutable_diary_ack()->set_seq(max_seq);
    acks->emplace_back(e.session, std::move(ack));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::HandleDiary(const v1::DiaryBatch& d) {
  mu_.AssertHeld();
  if (d.lines().empty()) return absl::OkStatus();
  auto it = jobs_.find(d.job_id());
  if (it == jobs_.end()) {
    if (disk_->full()) return absl::OkStatus();
    // An ended job's late lines are stored (its diary is still whole);
    // lines of a job that does not exist (or was purged) are not.
    ASSIGN_OR_RETURN(std::optional<v1::JobState> state,
                     store_->JobState(d.job_id()));
    if (!state) {
      return absl::NotFoundError(absl::StrCat("no job ", d.job_id()));
    }
    for (const auto& line : d.lines()) {
      RETURN_IF_ERROR(store_
                          ->AddDiary(d.job_id(), d.attempt(), d.part(),
                                     line.seq(), line.time_ms(), line.stream(),
                                     line.text(), line.ending())
                          .status());
    }
    Changed(d.job_id());
    return absl::OkStatus();
  }
  ActiveJob& job = it->second;
  if (disk_->full()) {
    // What grows without bound waits for space; counted, and said at the
    // job's end.
    for (const auto& line : d.lines()) {
      ++job.disk_dropped_lines;
      job.disk_dropped_bytes += static_cast<int64_t>(line.text().size());
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(StoreCappedDiary(job, d));
  Changed(d.job_id());
  return absl::OkStatus();
}

absl::Status Scheduler::HandleRegister(
    const std::shared_ptr<WorkerSession>& session, const v1::Register& reg,
    Outbox* out) {
  mu_.AssertHeld();
  if (reg.name().empty() || reg.profile().empty()) {
    v1::SchedulerMessage refuse;
    refuse.set_refused("a worker must give a name and a profile");
    out->emplace_back(session, std::move(refuse));
    return absl::OkStatus();
  }
  // A worker older than this scheduler accepts is refused, naming both
  // versions; it stops instead of retrying (a refusal is final to it).
  if (absl::Status too_old =
          CheckWorkerVersion(reg.version(), kMinWorkerVersion, Version());
      !too_old.ok()) {
    spdlog::warn("refused worker '{}' on {}: {}", reg.name(), reg.host(),
                 std::string(too_old.message()));
    v1::SchedulerMessage refuse;
    refuse.set_refused(std::string(too_old.message()));
    out->emplace_back(session, std::move(refuse));
    return absl::OkStatus();
  }
  // A Slurm batch job's worker registers under its job's one-job
  // credential, for that job alone; and that credential registers nothing
  // else (slurm_registration.h).
  std::optional<slurm::SlurmJobRecord> slurm_job;
  if (reg.has_slurm()) {
    SlurmLockHeld();
    slurm_job = bridge().RecordOf(reg.slurm().job_id());
  }
  absl::Status allowed =
      CheckSlurmRegistration(session->owner(), reg, slurm_job);
  if (!allowed.ok()) {
    spdlog::warn("refused worker '{}' on {} ({}): {}", reg.name(), reg.host(),
                 session->owner(), std::string(allowed.message()));
    v1::SchedulerMessage refuse;
    refuse.set_refused(std::string(allowed.message()));
    out->emplace_back(session, std::move(refuse));
    return absl::OkStatus();
  }
  if (refuse_once_.erase(reg.name()) > 0) {
    v1::SchedulerMessage refuse;
    refuse.set_refused(
        absl::StrCat("worker '", reg.name(),
                     "' was removed by an admin; start it again to rejoin"));
    out->emplace_back(session, std::move(refuse));
    return absl::OkStatus();
  }
  // A connected worker's name is its credential's: another credential (a
  // job that started its own worker, another node group's token) may not
  // take it over and so be handed its jobs. The same credential may: a
  // restarted worker replaces its old stream.
  for (const auto& [id, other] : workers_) {
    if (other.record.name == reg.name() && other.session &&
        other.session != session &&
        other.session->owner() != session->owner()) {
      v1::SchedulerMessage refuse;
      refuse.set_refused(absl::StrCat(
          "the worker name '", reg.name(),
          "' belongs to a worker connected under another credential; give "
          "this worker another --name"));
      out->emplace_back(session, std::move(refuse));
      return absl::OkStatus();
    }
  }
  WorkerRecord rec;
  rec.name = reg.name();
  rec.host = reg.host();
  rec.profile = reg.profile();
  rec.devices.assign(reg.devices().begin(), reg.devices().end());
  rec.last_seen_ms = clock_->NowMs();
  absl::StatusOr<int64_t> id;
  {
    Savepoint savepoint(store_->db());
    RETURN_IF_ERROR(savepoint.status());
    id = store_->UpsertWorker(rec);
    if (IsStoreFailure(id.status())) return id.status();
    if (!id.ok()) {
      RETURN_IF_ERROR(savepoint.Undo());
      v1::SchedulerMessage refuse;
      refuse.set_refused(
          absl::StrCat("cannot record this worker: ", id.status().message()));
      out->emplace_back(session, std::move(refuse));
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(savepoint.Release());
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
  worker.version = reg.version();
  worker.last_seen_mono = clock_->MonotonicMs();
  session_worker_[session.get()] = rec.id;
  if (!core_->HasProfile(rec.profile)) {
    RETURN_IF_ERROR(store_->UpsertProfile(rec.profile, 0));
  }
  core_->WorkerOnline(rec.id, rec.profile, SlotCount(rec.devices));

  // Reconcile what the worker runs with what the store says it runs.
  std::set<std::tuple<int64_t, int, int>> reported;
  for (const auto& r : reg.running())
    reported.emplace(r.job_id(), r.attempt(), r.part());
  v1::SchedulerMessage registered;
  registered.mutable_registered()->set_worker_id(rec.id);
  registered.mutable_registered()->set_heartbeat_interval_ms(
      options_.heartbeat_interval_ms);
  registered.mutable_registered()->set_scheduler_version(
      std::string(Version()));
  registered.mutable_registered()->set_min_worker_version(kMinWorkerVersion);
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
    } else if ((it->second.cancel_requested || it->second.requeue_requested) &&
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
    core_->Finished(job_id, clock_->NowMs());
    RETURN_IF_ERROR(RequeueLost(it->second, why, out));
  }
  users_.RegisterWorkerUsers(*this, worker, reg, out);
  watchers_.PublishWorker(*this, rec.id);
  if (reg.has_slurm()) RETURN_IF_ERROR(JoinSlurmGang(worker, reg, out));
  spdlog::info("worker '{}' (#{}) {} profile '{}' with {} slots", rec.name,
               rec.id, was_lost ? "rejoined" : "joined", rec.profile,
               rec.devices.size());
  return absl::OkStatus();
}

absl::Status Scheduler::HandleEnded(int64_t worker_id,
                                    const v1::JobEnded& ended, Outbox* out) {
  mu_.AssertHeld();
  // Unknown once ended (a resend of an acknowledged report), or stale.
  ActiveJob* reported =
      ReportedJob(worker_id, ended.job_id(), ended.attempt(), ended.part());
  const int part = ended.part();
  if (reported == nullptr || reported->part_ended[part]) {
    return absl::OkStatus();
  }
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
    // Each blob once: hard links of one file are listed under every path.
    int64_t total = 0;
    absl::flat_hash_set<std::string> counted;
    for (const auto& f : ended.outputs()) {
      if (counted.insert(f.sha256()).second) total += f.size();
    }
    const int64_t quota = options_.max_output_bytes;
    if (quota > 0 && total > quota) {
      if (job.failure.empty()) {
        job.failure = absl::StrCat(
            "the job's outputs hold ", HumanBytes(total), " (", total,
            " bytes), more than the ", HumanBytes(quota), " (", quota,
            " bytes) a job may keep (the scheduler's --max-output-bytes); "
            "write less to $DLBATCH_OUTPUT_DIR");
      }
    } else {
      for (const auto& f : ended.outputs()) {
        if (!f.symlink().empty()) {
          files.push_back(f);
          continue;
        }
        auto size = blobs_->Size(f.sha256());
        if (!size.ok() || *size != f.size()) {
          if (job.failure.empty()) {
            job.failure = absl::StrCat("output '", f.path(),
                                       "' is missing from the store");
          }
          continue;
        }
        files.push_back(f);
      }
    }
    Savepoint savepoint(store_->db());
    RETURN_IF_ERROR(savepoint.status());
    absl::Status put = store_->PutOutputs(rec.id, files);
    if (IsStoreFailure(put)) return put;
    if (!put.ok()) {
      // Refused once: the job fails saying why, instead of the report
      // coming back forever.
      RETURN_IF_ERROR(savepoint.Undo());
      if (job.failure.empty()) {
        job.failure =
            absl::StrCat("its outputs could not be recorded: ", put.message());
      }
    } else {
      RETURN_IF_ERROR(savepoint.Release());
    }
  }
  // A part whose job does not end now is written down: a Slurm job's
  // worker leaves once its part has ended, and after a restart the part
  // must still be known ended without it.
  PartEnd part_end;
  part_end.job_id = rec.id;
  part_end.attempt = rec.attempt;
  part_end.part = part;
  part_end.exit_code = ended.exit_code();
  if (part_failed) {
    part_end.failure = ended.reason().empty() ? "failed" : ended.reason();
  }
  if (std::find(job.part_ended.begin(), job.part_ended.end(), false) !=
      job.part_ended.end()) {
    job.part_ends_stored = true;
    return store_->PutPartEnd(part_end);
  }
  SlurmLockHeld();
  if (bridge().SettlesWithSlurm(rec.id, rec.spec.profile())) {
    job.part_ends_stored = true;
    RETURN_IF_ERROR(store_->PutPartEnd(part_end));
    // Acknowledged (its workers may leave) but not ended: the reconciler
    // asks squeue at once whether Slurm killed it, and why.
    bridge().BeginSettling(rec.id, job.failure);
    return absl::OkStatus();
  }
  return EndAsReported(job, out);
}

absl::Status Scheduler::HandleGone(
    const std::shared_ptr<WorkerSession>& session) {
  mu_.AssertHeld();
  auto it = session_worker_.find(session.get());
  if (it == session_worker_.end()) return absl::OkStatus();
  WorkerState& worker = workers_.at(it->second);
  session_worker_.erase(it);
  if (worker.session == session) {
    worker.session = nullptr;
    // A Slurm job's worker done with its one job never comes back: it is
    // forgotten now (SlurmBridge::WorkerLeft).
    SlurmLockHeld();
    if (bridge().WorkerLeft(worker.record.id)) {
      std::vector<int64_t> failed;
      return control_.ForgetWorker(*this, worker.record.id,
                                   "gone with its Slurm job", &failed);
    }
    core_->WorkerOffline(worker.record.id);
    spdlog::warn(
        "worker '{}' disconnected; lost unless it returns within {} ms",
        worker.record.name, options_.heartbeat_timeout_ms);
    watchers_.PublishWorker(*this, worker.record.id);
  }
  return absl::OkStatus();
}

void Scheduler::CheckLiveness() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) {
      Recover(broken_);
      if (!broken_.ok()) return;
    }
    int64_t now = clock_->MonotonicMs();
    std::vector<int64_t> expired;
    SlurmLockHeld();
    for (auto& [id, w] : workers_) {
      if (!w.lost && now - w.last_seen_mono > options_.heartbeat_timeout_ms &&
          now >= w.grace_until_mono && !bridge().Departed(id)) {
        expired.push_back(id);
      }
    }
    if (!expired.empty()) {
      absl::Status s = InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (int64_t id : expired) {
          WorkerState& w = workers_.at(id);
          RETURN_IF_ERROR(LoseWorker(
              w,
              absl::StrCat("worker '", w.record.name,
                           "' lost: silent for over ",
                           FormatDurationMs(options_.heartbeat_timeout_ms)),
              &out));
        }
        return absl::OkStatus();
      });
      if (!s.ok()) return;  // recovered; tried again at the next tick
      (void)PlaceJobs(&out);
    }
    // Lost for --forget-offline-after: removed (control.cc).
    control_.ForgetOffline(*this, &out);
  }
  Deliver(out);
}

absl::Status Scheduler::LoseWorker(WorkerState& worker, const std::string& why,
                                   Outbox* out) {
  mu_.AssertHeld();
  spdlog::warn("{}", why);
  worker.lost = true;
  if (worker.session) {
    session_worker_.erase(worker.session.get());
    worker.session->Close(why);
    worker.session = nullptr;
  }
  for (JobId job_id : core_->WorkerLost(worker.record.id)) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    RETURN_IF_ERROR(RequeueLost(it->second, why, out));
  }
  watchers_.PublishWorker(*this, worker.record.id);
  return absl::OkStatus();
}

Scheduler::ActiveJob* Scheduler::ReportedJob(int64_t worker_id, int64_t job_id,
                                             int attempt, int part) {
  mu_.AssertHeld();
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

absl::Status Scheduler::HandleProgress(int64_t worker_id,
                                       const v1::JobProgress& report) {
  mu_.AssertHeld();
  ActiveJob* job =
      ReportedJob(worker_id, report.job_id(), report.attempt(), report.part());
  if (job == nullptr || report.part() != 0) return absl::OkStatus();
  const int64_t checkpoint_iteration = job->progress.checkpoint_iteration();
  job->progress = report.progress();
  job->progress.set_checkpoint_iteration(checkpoint_iteration);
  Changed(report.job_id());
  // Latest wins: on a full disk it waits in memory for the next report.
  if (disk_->full()) return absl::OkStatus();
  return store_->PutProgress(report.job_id(), job->progress);
}

absl::Status Scheduler::HandleCheckpoint(int64_t worker_id,
                                         const v1::CheckpointStored& report) {
  mu_.AssertHeld();
  ActiveJob* job =
      ReportedJob(worker_id, report.job_id(), report.attempt(), report.part());
  if (job == nullptr || report.part() != 0) return absl::OkStatus();
  if (job->checkpoint.files_size() > 0 &&
      report.iteration() < job->checkpoint.iteration()) {
    return absl::OkStatus();  // a resend of an older one
  }
  for (const auto& f : report.files()) {
    auto size = blobs_->Size(f.sha256());
    if (!size.ok() || *size != f.size()) {
      spdlog::warn("job {}: checkpoint file '{}' is not in the store; ignored",
                   report.job_id(), f.path());
      return absl::OkStatus();
    }
  }
  // Stored before memory takes it: a refused report leaves no trace.
  v1::TrainProgress progress = job->progress;
  progress.set_checkpoint_iteration(report.iteration());
  RETURN_IF_ERROR(store_->PutCheckpoint(report.job_id(), report));
  RETURN_IF_ERROR(store_->PutProgress(report.job_id(), progress));
  job->checkpoint = report;
  job->progress = std::move(progress);
  Changed(report.job_id());
  return absl::OkStatus();
}

void Scheduler::NoteReport(const v1::WorkerMessage& m) {
  mu_.AssertHeld();
  if (m.has_diary()) {
    metrics_->JobReported(m.diary().job_id(), m.diary().attempt());
  } else if (m.has_progress()) {
    metrics_->JobReported(m.progress().job_id(), m.progress().attempt());
  } else if (m.has_ended()) {
    metrics_->JobReported(m.ended().job_id(), m.ended().attempt());
  }
}

}  // namespace dlbatch::scheduler
