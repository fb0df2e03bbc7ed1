// The worker streams, the loop thread's side of the scheduler: each batch
// of worker messages handled in one transaction (registrations, ends,
// progress, checkpoints, streams gone), and liveness. The diary lines are
// in worker_diary.cc.
#include "scheduler/worker_streams.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "common/version.h"
#include "scheduler/control.h"
#include "scheduler/kept_checkpoints.h"
#include "scheduler/preemptions.h"
#include "scheduler/slurm/registration.h"
#include "scheduler/users.h"
#include "scheduler/watchers.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

int SlotCount(const std::vector<v1::Device>& devices) {
  return static_cast<int>(devices.size());
}

// A worker's GPU readings are its session's: none shown once it is gone.
void ForgetGpus(SchedulerState::WorkerState& worker) {
  worker.gpus.clear();
  worker.gpus_read_ms = 0;
}

}  // namespace

void WorkerStreams::ProcessBatch(std::deque<WorkerEvent>& batch) {
  Outbox out;
  Outbox acks;  // sent only after the commit that makes them true
  {
    absl::MutexLock lock(&state_.mu_);
    if (!state_.broken_.ok()) {
      state_.Recover(state_.broken_);
      if (!state_.broken_.ok()) {
        // Nothing can be recorded: every stream is dropped, and workers
        // resend once the store works again.
        for (WorkerEvent& e : batch) {
          if (e.session)
            e.session->Close("the scheduler cannot write its store");
        }
        return;
      }
    }
    absl::Status failed;
    {
      Transaction txn(state_.store_->db());
      failed = txn.status();
      for (WorkerEvent& e : batch) {
        if (!failed.ok()) break;
        failed = HandleEvent(state_, e, &out, &acks);
      }
      if (failed.ok()) failed = state_.TimedCommit(txn);
    }  // rolled back unless committed
    if (!failed.ok()) {
      // Memory may be ahead of the store: nothing of this batch is sent.
      state_.Recover(failed);
      return;
    }
    (void)state_.PlaceJobs(&out);
  }
  state_.Deliver(acks);
  state_.Deliver(out);
}

void WorkerStreams::CheckLiveness() {
  Outbox out;
  {
    absl::MutexLock lock(&state_.mu_);
    if (!state_.broken_.ok()) {
      state_.Recover(state_.broken_);
      if (!state_.broken_.ok()) return;
    }
    int64_t now = state_.clock_->MonotonicMs();
    std::vector<int64_t> expired;
    state_.SlurmLockHeld();
    for (auto& [id, w] : state_.workers_) {
      if (!w.lost &&
          now - w.last_seen_mono > state_.options_.heartbeat_timeout_ms &&
          now >= w.grace_until_mono && !state_.bridge().Departed(id)) {
        expired.push_back(id);
      }
    }
    if (!expired.empty()) {
      absl::Status s =
          state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
            for (int64_t id : expired) {
              WorkerState& w = state_.workers_.at(id);
              RETURN_IF_ERROR(LoseWorker(
                  state_, w,
                  absl::StrCat(
                      "worker '", w.record.name, "' lost: silent for over ",
                      FormatDurationMs(state_.options_.heartbeat_timeout_ms)),
                  &out));
            }
            return absl::OkStatus();
          });
      if (!s.ok()) return;  // recovered; tried again at the next tick
      (void)state_.PlaceJobs(&out);
    }
    // Lost for --forget-offline-after: removed (control.cc).
    state_.control().ForgetOffline(state_, &out);
  }
  state_.Deliver(out);
}

absl::Status WorkerStreams::HandleEvent(SchedulerState& s, WorkerEvent& e,
                                        Outbox* out, Outbox* acks) {
  s.mu_.AssertHeld();
  if (!e.message) return HandleGone(s, e.session);
  const v1::WorkerMessage& m = *e.message;
  if (m.has_register_())
    return HandleRegister(s, e.session, m.register_(), out);
  auto it = s.session_worker_.find(e.session.get());
  if (it == s.session_worker_.end()) {
    return absl::OkStatus();  // not registered (or replaced)
  }
  const int64_t worker_id = it->second;
  WorkerState& worker = s.workers_.at(worker_id);
  worker.last_seen_mono = s.clock_->MonotonicMs();
  worker.record.last_seen_ms = s.clock_->NowMs();
  if (s.metrics_ != nullptr) NoteReport(s, m);
  if (m.has_ended()) {
    // Failures tied to the report become the job's failure (HandleEnded).
    RETURN_IF_ERROR(HandleEnded(s, worker_id, m.ended(), out));
    v1::SchedulerMessage ack;
    ack.mutable_ended_ack()->set_job_id(m.ended().job_id());
    ack.mutable_ended_ack()->set_attempt(m.ended().attempt());
    ack.mutable_ended_ack()->set_part(m.ended().part());
    acks->emplace_back(e.session, std::move(ack));
    return absl::OkStatus();
  }
  if (m.has_user_answer()) {
    // Memory only: answers hold for this session (users.cc).
    s.core_->SetWorkerUser(worker_id, m.user_answer().user(),
                           m.user_answer().known());
    if (m.user_answer().known()) {
      worker.unknown_since.erase(m.user_answer().user());
    } else {
      worker.unknown_since[m.user_answer().user()] = s.clock_->MonotonicMs();
    }
    return absl::OkStatus();
  }
  if (m.has_heartbeat() && m.heartbeat().gpus_size() > 0) {
    // Memory only: shown with the worker (WorkerInfo.gpus), never stored.
    worker.gpus.assign(m.heartbeat().gpus().begin(),
                       m.heartbeat().gpus().end());
    worker.gpus_read_ms = m.heartbeat().time_ms();
  }
  if (!m.has_diary() && !m.has_progress() && !m.has_checkpoint()) {
    return absl::OkStatus();  // heartbeat and JobStarted refresh liveness
  }
  Savepoint savepoint(s.store_->db());
  RETURN_IF_ERROR(savepoint.status());
  absl::Status status;
  int64_t job_id = 0;
  int attempt = 0;
  std::string what;
  if (m.has_diary()) {
    status = HandleDiary(s, m.diary());
    job_id = m.diary().job_id();
    attempt = m.diary().attempt();
    what = absl::StrCat(m.diary().lines_size(), " diary lines of part ",
                        m.diary().part());
  } else if (m.has_progress()) {
    status = HandleProgress(s, worker_id, m.progress());
    job_id = m.progress().job_id();
    attempt = m.progress().attempt();
    what = "a progress report";
  } else {
    status = HandleCheckpoint(s, worker_id, m.checkpoint());
    job_id = m.checkpoint().job_id();
    attempt = m.checkpoint().attempt();
    what = "a checkpoint report";
  }
  if (IsStoreFailure(status)) return status;
  if (status.ok()) {
    RETURN_IF_ERROR(savepoint.Release());
    if (m.has_diary() && s.metrics_ != nullptr) {
      int64_t bytes = 0;
      for (const auto& line : m.diary().lines()) bytes += line.text().size();
      s.metrics_->DiaryStored(m.diary().lines_size(), bytes);
    }
  } else {
    // Refused once: undone, acknowledged below so the worker does not send
    // it again, and said where the job's owner looks.
    RETURN_IF_ERROR(savepoint.Undo());
    std::string why = absl::StrCat(
        "[dlbatch] ", what, " from worker '", worker.record.name,
        "' could not be stored and were refused: ", status.message());
    spdlog::warn("job {}: {}", job_id, why);
    if (s.jobs_.contains(job_id))
      RETURN_IF_ERROR(s.Diary(job_id, attempt, why));
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

absl::Status WorkerStreams::HandleRegister(
    SchedulerState& s, const std::shared_ptr<WorkerSession>& session,
    const v1::Register& reg, Outbox* out) {
  s.mu_.AssertHeld();
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
    s.SlurmLockHeld();
    slurm_job = s.bridge().RecordOf(reg.slurm().job_id());
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
  if (s.refuse_once_.erase(reg.name()) > 0) {
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
  for (const auto& [id, other] : s.workers_) {
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
  rec.last_seen_ms = s.clock_->NowMs();
  absl::StatusOr<int64_t> id;
  {
    Savepoint savepoint(s.store_->db());
    RETURN_IF_ERROR(savepoint.status());
    id = s.store_->UpsertWorker(rec);
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
  WorkerState& worker = s.workers_[rec.id];
  if (worker.session && worker.session != session) {
    s.session_worker_.erase(worker.session.get());
    worker.session->Close("replaced by a newer connection of the same worker");
  }
  const bool was_lost = worker.lost;
  worker.record = rec;
  worker.session = session;
  ForgetGpus(worker);  // this session reports its own
  worker.lost = false;
  worker.version = reg.version();
  worker.last_seen_mono = s.clock_->MonotonicMs();
  s.session_worker_[session.get()] = rec.id;
  if (!s.core_->HasProfile(rec.profile)) {
    RETURN_IF_ERROR(s.store_->UpsertProfile(rec.profile, 0));
  }
  s.core_->WorkerOnline(rec.id, rec.profile, SlotCount(rec.devices));

  // Reconcile what the worker runs with what the store says it runs.
  std::set<std::tuple<int64_t, int, int>> reported;
  for (const auto& r : reg.running())
    reported.emplace(r.job_id(), r.attempt(), r.part());
  v1::SchedulerMessage registered;
  registered.mutable_registered()->set_worker_id(rec.id);
  registered.mutable_registered()->set_heartbeat_interval_ms(
      s.options_.heartbeat_interval_ms);
  registered.mutable_registered()->set_scheduler_version(
      std::string(Version()));
  registered.mutable_registered()->set_min_worker_version(kMinWorkerVersion);
  // Parts cancelled while the worker was away (or just before a restart):
  // the CancelJob sent then may never have reached it, so it goes again.
  Outbox cancels;
  for (const auto& r : reg.running()) {
    auto it = s.jobs_.find(r.job_id());
    bool ours = it != s.jobs_.end() &&
                it->second.record.attempt == r.attempt() && r.part() >= 0 &&
                r.part() < static_cast<int>(it->second.record.parts.size()) &&
                it->second.record.parts[r.part()].worker == rec.id;
    if (!ours) {
      *registered.mutable_registered()->add_cancel() = r;
    } else if (Preemptions::Stopping(it->second) &&
               !it->second.cancel_requested &&
               !it->second.part_ended[r.part()]) {
      cancels.emplace_back(
          session, s.preemptions().StopMessage(s, it->second, r.part()));
    } else if ((it->second.cancel_requested || it->second.requeue_requested) &&
               !it->second.part_ended[r.part()]) {
      v1::SchedulerMessage msg;
      auto* cancel = msg.mutable_cancel();
      cancel->set_job_id(r.job_id());
      cancel->set_attempt(r.attempt());
      cancel->set_part(r.part());
      cancel->set_grace_ms(s.options_.cancel_grace_ms);
      cancel->set_reason(it->second.cancel_reason);
      cancels.emplace_back(session, std::move(msg));
    }
  }
  std::vector<int64_t> lost;
  for (auto& [job_id, job] : s.jobs_) {
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
    auto it = s.jobs_.find(job_id);
    if (it == s.jobs_.end()) continue;
    std::string why =
        absl::StrCat("worker '", rec.name, "' restarted without the job");
    s.core_->Finished(job_id, s.clock_->NowMs());
    RETURN_IF_ERROR(s.RequeueLost(it->second, why, out));
  }
  s.users().RegisterWorkerUsers(s, worker, reg, out);
  s.watchers().PublishWorker(s, rec.id);
  if (reg.has_slurm()) RETURN_IF_ERROR(JoinSlurmGang(s, worker, reg, out));
  spdlog::info("worker '{}' (#{}) {} profile '{}' with {} slots", rec.name,
               rec.id, was_lost ? "rejoined" : "joined", rec.profile,
               rec.devices.size());
  return absl::OkStatus();
}

absl::Status WorkerStreams::HandleEnded(SchedulerState& s, int64_t worker_id,
                                        const v1::JobEnded& ended,
                                        Outbox* out) {
  s.mu_.AssertHeld();
  // Unknown once ended (a resend of an acknowledged report), or stale.
  ActiveJob* reported =
      ReportedJob(s, worker_id, ended.job_id(), ended.attempt(), ended.part());
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
      s.CancelParts(job, absl::StrCat("part ", part, " failed"), part, out);
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
    const int64_t quota = s.options_.max_output_bytes;
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
        auto size = s.blobs_->Size(f.sha256());
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
    Savepoint savepoint(s.store_->db());
    RETURN_IF_ERROR(savepoint.status());
    absl::Status put = s.store_->PutOutputs(rec.id, files);
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
    return s.store_->PutPartEnd(part_end);
  }
  s.SlurmLockHeld();
  if (s.bridge().SettlesWithSlurm(rec.id, rec.spec.profile())) {
    job.part_ends_stored = true;
    RETURN_IF_ERROR(s.store_->PutPartEnd(part_end));
    // Acknowledged (its workers may leave) but not ended: the reconciler
    // asks squeue at once whether Slurm killed it, and why.
    s.bridge().BeginSettling(rec.id, job.failure);
    return absl::OkStatus();
  }
  return s.EndAsReported(job, out);
}

absl::Status WorkerStreams::HandleGone(
    SchedulerState& s, const std::shared_ptr<WorkerSession>& session) {
  s.mu_.AssertHeld();
  auto it = s.session_worker_.find(session.get());
  if (it == s.session_worker_.end()) return absl::OkStatus();
  WorkerState& worker = s.workers_.at(it->second);
  s.session_worker_.erase(it);
  if (worker.session == session) {
    worker.session = nullptr;
    ForgetGpus(worker);
    // A Slurm job's worker done with its one job never comes back: it is
    // forgotten now (SlurmBridge::WorkerLeft).
    s.SlurmLockHeld();
    if (s.bridge().WorkerLeft(worker.record.id)) {
      std::vector<int64_t> failed;
      return s.control().ForgetWorker(s, worker.record.id,
                                      "gone with its Slurm job", &failed);
    }
    s.core_->WorkerOffline(worker.record.id);
    spdlog::warn(
        "worker '{}' disconnected; lost unless it returns within {} ms",
        worker.record.name, s.options_.heartbeat_timeout_ms);
    s.watchers().PublishWorker(s, worker.record.id);
  }
  return absl::OkStatus();
}

absl::Status WorkerStreams::LoseWorker(SchedulerState& s, WorkerState& worker,
                                       const std::string& why, Outbox* out) {
  s.mu_.AssertHeld();
  spdlog::warn("{}", why);
  worker.lost = true;
  ForgetGpus(worker);
  if (worker.session) {
    s.session_worker_.erase(worker.session.get());
    worker.session->Close(why);
    worker.session = nullptr;
  }
  for (JobId job_id : s.core_->WorkerLost(worker.record.id)) {
    auto it = s.jobs_.find(job_id);
    if (it == s.jobs_.end()) continue;
    RETURN_IF_ERROR(s.RequeueLost(it->second, why, out));
  }
  s.watchers().PublishWorker(s, worker.record.id);
  return absl::OkStatus();
}

SchedulerState::ActiveJob* WorkerStreams::ReportedJob(SchedulerState& s,
                                                      int64_t worker_id,
                                                      int64_t job_id,
                                                      int attempt, int part) {
  s.mu_.AssertHeld();
  auto it = s.jobs_.find(job_id);
  if (it == s.jobs_.end()) return nullptr;
  const JobRecord& rec = it->second.record;
  if (rec.attempt != attempt || part < 0 ||
      part >= static_cast<int>(rec.parts.size()) ||
      rec.parts[part].worker != worker_id) {
    return nullptr;
  }
  return &it->second;
}

absl::Status WorkerStreams::HandleProgress(SchedulerState& s, int64_t worker_id,
                                           const v1::JobProgress& report) {
  s.mu_.AssertHeld();
  ActiveJob* job = ReportedJob(s, worker_id, report.job_id(), report.attempt(),
                               report.part());
  if (job == nullptr || report.part() != 0) return absl::OkStatus();
  const int64_t checkpoint_iteration = job->progress.checkpoint_iteration();
  job->progress = report.progress();
  job->progress.set_checkpoint_iteration(checkpoint_iteration);
  if (s.metrics_ != nullptr) {
    s.metrics_->JobProgress(report.job_id(), job->record.user,
                            job->record.spec.profile(), job->progress);
  }
  s.Changed(report.job_id());
  // Latest wins: on a full disk it waits in memory for the next report.
  if (s.disk_->full()) return absl::OkStatus();
  RETURN_IF_ERROR(s.store_->PutProgress(report.job_id(), job->progress));
  // The web face charts the history (GET /api/v1/jobs/ID/progress).
  return s.store_->AppendProgress(report.job_id(), job->progress);
}

absl::Status WorkerStreams::HandleCheckpoint(
    SchedulerState& s, int64_t worker_id, const v1::CheckpointStored& report) {
  s.mu_.AssertHeld();
  ActiveJob* job = ReportedJob(s, worker_id, report.job_id(), report.attempt(),
                               report.part());
  if (job == nullptr) return absl::OkStatus();
  const v1::JobSpec& spec = job->record.spec;
  if (report.part() != 0 && !PerPartCheckpoints(spec)) return absl::OkStatus();
  const std::optional<int64_t> newest =
      NewestOfPart(job->kept_checkpoints, report.part());
  if (newest && report.iteration() < *newest) {
    return absl::OkStatus();  // a resend of an older one
  }
  const char* unit = spec.has_train() ? "iteration " : "step ";
  const std::string what = absl::StrCat(
      "the checkpoint of ", unit, report.iteration(),
      PerPartCheckpoints(spec) ? absl::StrCat(" of part ", report.part())
                               : std::string());
  if (report.files_size() == 0) {
    // Nothing a later attempt could be given back.
    return s.Diary(report.job_id(), report.attempt(),
                   absl::StrCat("[dlbatch] ", what,
                                " is not kept: $DLBATCH_CHECKPOINT_DIR held "
                                "no files; write the checkpoint there before "
                                "announcing it"));
  }
  for (const auto& f : report.files()) {
    if (!f.symlink().empty()) continue;
    auto size = s.blobs_->Size(f.sha256());
    if (!size.ok() || *size != f.size()) {
      spdlog::warn("job {}: checkpoint file '{}' is not in the store; ignored",
                   report.job_id(), f.path());
      return absl::OkStatus();
    }
  }
  // The kept set with it, the step a resume would use, and the oldest of
  // each part past the few kept.
  std::vector<v1::CheckpointStored> kept = job->kept_checkpoints;
  PutKept(&kept, report);
  const std::optional<int64_t> resume =
      ResumeStep(KeysOf(kept),
                 ResumeParts(spec, static_cast<int>(job->record.parts.size())));
  const std::vector<CheckpointKey> drop =
      CheckpointsToDrop(KeysOf(kept), resume, kKeptCheckpoints);
  for (const CheckpointKey& k : drop) EraseKept(&kept, k);
  // Kept checkpoints count against the output quota, as the outputs do.
  const int64_t quota = s.options_.max_output_bytes;
  const int64_t bytes = KeptBytes(kept);
  if (quota > 0 && bytes > quota) {
    return s.Diary(
        report.job_id(), report.attempt(),
        absl::StrCat(
            "[dlbatch] ", what,
            " is not kept: with it the job's stored "
            "checkpoints would hold ",
            HumanBytes(bytes), " (", bytes, " bytes), more than the ",
            HumanBytes(quota), " (", quota,
            " bytes) a job may keep (the scheduler's --max-output-bytes); "
            "the job goes on, and a later attempt resumes from ",
            job->checkpoint.files_size() > 0
                ? absl::StrCat(unit, job->checkpoint.iteration())
                : std::string("the start")));
  }
  // Stored before memory takes it: a refused report leaves no trace.
  RETURN_IF_ERROR(s.store_->PutKeptCheckpoint(report.job_id(), report));
  for (const CheckpointKey& k : drop) {
    RETURN_IF_ERROR(
        s.store_->DeleteKeptCheckpoint(report.job_id(), k.part, k.step));
  }
  const v1::CheckpointStored* found = FindKept(kept, 0, resume);
  v1::CheckpointStored checkpoint =
      found != nullptr ? *found : v1::CheckpointStored();
  const bool moved = !SameCheckpoint(checkpoint, job->checkpoint);
  v1::TrainProgress progress = job->progress;
  if (moved) {
    progress.set_checkpoint_iteration(resume.value_or(0));
    RETURN_IF_ERROR(s.store_->PutCheckpoint(report.job_id(), checkpoint));
    RETURN_IF_ERROR(s.store_->PutProgress(report.job_id(), progress));
  }
  job->kept_checkpoints = std::move(kept);
  if (moved) {
    job->checkpoint = std::move(checkpoint);
    job->checkpoint_ms = s.clock_->NowMs();
    job->progress = std::move(progress);
  }
  s.Changed(report.job_id());
  return absl::OkStatus();
}

void WorkerStreams::NoteReport(SchedulerState& s, const v1::WorkerMessage& m) {
  s.mu_.AssertHeld();
  if (m.has_diary()) {
    s.metrics_->JobReported(m.diary().job_id(), m.diary().attempt());
  } else if (m.has_progress()) {
    s.metrics_->JobReported(m.progress().job_id(), m.progress().attempt());
  } else if (m.has_ended()) {
    s.metrics_->JobReported(m.ended().job_id(), m.ended().attempt());
  }
}

absl::Status WorkerStreams::JoinSlurmGang(SchedulerState& s,
                                          const WorkerState& worker,
                                          const v1::Register& reg,
                                          Outbox* out) {
  s.mu_.AssertHeld();
  s.SlurmLockHeld();
  slurm::WorkerMail mail{out};
  return s.bridge().Join(worker.record.id, worker.record.name,
                         worker.record.devices, reg.slurm(), mail);
}

}  // namespace dlbatch::scheduler
