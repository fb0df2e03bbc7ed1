// The Slurm thread: launches with sbatch outside the host's lock, and the
// reconcile of squeue with the jobs' records (Reconcile, pure) whose
// decisions it carries out through the host.
#include <algorithm>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/slurm/bridge.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler::slurm {
namespace {

// How long the Slurm job of an ended job may run on before it is
// scancelled: its workers upload, report and leave within this.
constexpr int64_t kLingerMs = 15000;
// How often squeue is read while a job's end waits for Slurm's word
// (settling_): its Slurm job leaves COMPLETING within moments.
constexpr int64_t kSettlingPollMs = 250;
// How long past its grace a job stopping for a preemption keeps its Slurm
// job: its worker kills it at the grace itself, then reports and uploads.
constexpr int64_t kStopMarginMs = 15000;
// How long a stopping job's worker is without a stream before its Slurm
// job is signalled instead: a worker reconnects within a few seconds.
constexpr int64_t kUnreachableMs = 10000;

}  // namespace

void SlurmBridge::Loop() {
  int64_t next_reconcile = 0;  // at once: adopt or cancel what Slurm holds
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const int64_t wait = next_reconcile - clock_->MonotonicMs();
      if (!poked_ && !stopping_ && wait > 0) {
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(wait));
      }
      if (stopping_) return;
      poked_ = false;
    }
    std::vector<int64_t> launches;
    bool any = false;
    {
      absl::MutexLock lock(&host_->mutex());
      launches.assign(launches_.begin(), launches_.end());
      launches_.clear();
      any = !records_.empty() || !launches.empty();
    }
    for (int64_t id : launches) Launch(id);
    const int64_t now = clock_->MonotonicMs();
    // A job just submitted is watched from the next poll on.
    if (!launches.empty()) {
      next_reconcile = std::min(next_reconcile, now + options_.poll_ms);
    }
    // A poke with no launch is a cancel or an end: reconcile now.
    if (now >= next_reconcile || launches.empty()) {
      if (any || next_reconcile == 0) Reconcile();
      absl::MutexLock lock(&host_->mutex());
      int64_t poll = records_.empty() ? options_.poll_ms * 5 : options_.poll_ms;
      if (!settling_.empty()) poll = std::min(poll, kSettlingPollMs);
      next_reconcile = clock_->MonotonicMs() + poll;
    }
  }
}

void SlurmBridge::Launch(int64_t job_id) {
  SlurmProfile profile;
  BatchRequest request;
  WorkerLaunch launch;
  // On CPU-only nodes the pool is shared over as few nodes as hold it,
  // which follows the partition's CPUs per node (sinfo, outside the lock).
  int node_cpus = 0;
  {
    std::string name;
    {
      absl::MutexLock lock(&host_->mutex());
      std::optional<HostJob> job = host_->FindJob(job_id);
      if (!job) return;
      name = job->profile;
    }
    const SlurmProfile* p = ProfileOf(name);
    if (p == nullptr) return;
    if (p->gpus_per_node <= 0) {
      absl::StatusOr<PartitionLimits> limits = Limits(*p, tool_);
      if (!limits.ok()) {
        absl::MutexLock lock(&host_->mutex());
        waiting_[job_id] = absl::StrCat(
            "could not be submitted to Slurm (cannot read partition '",
            p->partition, "' with sinfo: ", limits.status().message(),
            "); trying again");
        host_->JobChanged(job_id);
        launches_.insert(job_id);
        return;
      }
      node_cpus = limits->max_cpus_per_node;
    }
  }
  {
    absl::MutexLock lock(&host_->mutex());
    std::optional<HostJob> job = host_->FindJob(job_id);
    if (!job) return;
    if (job->state != v1::JOB_STATE_QUEUED || job->held ||
        job->waits_for_others || launching_.count(job_id) > 0) {
      return;
    }
    auto r = records_.find(job_id);
    if (r != records_.end() && r->second.attempt == job->attempt + 1) {
      return;  // launched already (adopted after a restart, or in Slurm)
    }
    profile = *ProfileOf(job->profile);
    absl::StatusOr<BatchRequest> planned = RequestOf(*job, node_cpus);
    if (!planned.ok()) {
      const std::string why(planned.status().message());
      (void)host_->InTransaction(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
            return host_->EndQueued(job_id, v1::JOB_STATE_FAILED,
                                    absl::StrCat("[dlbatch] ", why), why);
          });
      return;
    }
    request = *planned;
    auto l = launch_.find(profile.name);
    if (l != launch_.end()) launch = l->second;
    launching_.insert(job_id);
  }
  absl::StatusOr<SlurmJobRecord> record =
      absl::InternalError("no one-job credential could be made");
  if (absl::StatusOr<std::string> token = NewJobToken(); token.ok()) {
    launch.token = *token;
    record = launcher_->Launch(profile, request, launch);
  } else {
    record = token.status();
  }
  absl::MutexLock lock(&host_->mutex());
  launching_.erase(job_id);
  if (record.ok()) {
    spdlog::info("job {} attempt {}: Slurm job {} (partition {})", job_id,
                 request.attempt, record->slurm_id, profile.partition);
    waiting_[job_id] =
        absl::StrCat("submitted to Slurm as job ", record->slurm_id);
    host_->JobChanged(job_id);
    return;
  }
  spdlog::warn("job {}: {}", job_id, record.status().ToString());
  if (!host_->FindJob(job_id)) return;
  if (record.status().code() == absl::StatusCode::kFailedPrecondition) {
    // Slurm refused it, in its own words: it would refuse it again.
    const std::string why =
        absl::StrCat("Slurm refused the job: ", record.status().message());
    (void)host_->InTransaction(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
          return host_->EndQueued(job_id, v1::JOB_STATE_FAILED,
                                  "[dlbatch] " + why, why);
        });
    return;
  }
  waiting_[job_id] = absl::StrCat("could not be submitted to Slurm (",
                                  record.status().message(), "); trying again");
  host_->JobChanged(job_id);
  // Its intent, if committed, is the reconciler's to adopt or relaunch;
  // without one it is launched again at the next poll.
  if (records_.count(job_id) == 0) launches_.insert(job_id);
}

void SlurmBridge::Reconcile() {
  SlurmTool& tool = *tool_;
  std::vector<std::string> partitions;
  ReconcileInput in;
  in.instance = instance_;
  for (const SlurmProfile& p : options_.profiles) {
    if (std::find(partitions.begin(), partitions.end(), p.partition) ==
        partitions.end()) {
      partitions.push_back(p.partition);
    }
    in.partitions[p.name] = p.partition;
  }
  absl::StatusOr<std::vector<SqueueRow>> rows = ReadQueue(tool, partitions);
  if (!rows.ok()) {
    spdlog::warn("cannot read Slurm's queue: {}", rows.status().ToString());
    SettleWithoutSlurm(in.settling_wait_ms);
    return;
  }
  in.rows = *std::move(rows);
  const Snapshot snapshot = Read(in);
  in.now_ms = clock_->NowMs();
  for (const SlurmJobRecord& r : snapshot.given_back) {
    if (r.slurm_id != 0) {
      spdlog::info("scancel Slurm job {}: dlbatch job {} is held", r.slurm_id,
                   r.job_id);
      if (absl::Status s = CancelBatch(tool, r.slurm_id); !s.ok()) {
        spdlog::warn("scancel {}: {}", r.slurm_id, s.ToString());
        continue;  // its record stays: tried again at the next poll
      }
    }
    if (absl::Status s = Forget(r.job_id); !s.ok()) {
      spdlog::warn("job {}: {}", r.job_id, s.ToString());
    }
  }
  const ReconcileDecisions d = slurm::Reconcile(in);
  std::set<int64_t> left_alone;
  for (const auto& l : d.left_alone) {
    left_alone.insert(l.slurm_id);
    if (left_alone_.insert(l.slurm_id).second) spdlog::warn("{}", l.why);
  }
  std::erase_if(left_alone_,
                [&](int64_t id) { return left_alone.count(id) == 0; });
  CancelSlurmJobs(in, d, snapshot.release);
  EndStopping(in, snapshot.stopping);
  for (const auto& a : d.adopt) {
    SlurmJobRecord record;
    {
      absl::MutexLock lock(&host_->mutex());
      auto it = records_.find(a.job_id);
      if (it == records_.end()) continue;
      record = it->second;
    }
    record.slurm_id = a.slurm_id;
    spdlog::info("job {}: adopted Slurm job {}", a.job_id, a.slurm_id);
    if (absl::Status s = Put(record); !s.ok()) {
      spdlog::warn("job {}: {}", a.job_id, s.ToString());
    }
  }
  Apply(d, snapshot.settle_now);
  for (int64_t job_id : d.forget) {
    if (absl::Status s = Forget(job_id); !s.ok()) {
      spdlog::warn("job {}: {}", job_id, s.ToString());
    }
  }
  for (int64_t job_id : d.relaunch) {
    if (absl::Status s = Forget(job_id); !s.ok()) continue;
    absl::MutexLock lock(&host_->mutex());
    std::optional<HostJob> job = host_->FindJob(job_id);
    if (job && job->state == v1::JOB_STATE_QUEUED) Enqueue(job_id);
  }
  PreemptFor(in);
}

void SlurmBridge::SettleWithoutSlurm(int64_t wait_ms) {
  host_->WithLock(
      [&](WorkerMail& mail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
        std::vector<int64_t> due;
        for (const auto& [job_id, since] : settling_) {
          if (clock_->NowMs() - since >= wait_ms) {
            due.push_back(job_id);
          }
        }
        if (due.empty()) return;
        (void)host_->InTransaction(
            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
              for (int64_t job_id : due) {
                if (!SettlingJob(job_id)) {
                  // Ended or requeued another way.
                  settling_.erase(job_id);
                  continue;
                }
                RETURN_IF_ERROR(host_->EndAsReported(job_id, mail));
              }
              return absl::OkStatus();
            });
      });
}

SlurmBridge::Snapshot SlurmBridge::Read(ReconcileInput& in) {
  Snapshot snapshot;
  absl::MutexLock lock(&host_->mutex());
  snapshot.release = release_;
  std::vector<int64_t>& settle_now = snapshot.settle_now;
  for (auto it = settling_.begin(); it != settling_.end();) {
    const std::optional<HostJob> job = SettlingJob(it->first);
    if (!job) {
      it = settling_.erase(it);  // ended or requeued another way
      continue;
    }
    if (!Settles(*job)) settle_now.push_back(it->first);
    in.settling_since[it->first] = it->second;
    ++it;
  }
  for (const auto& [job_id, record] : records_) {
    // One being submitted is the launcher's until sbatch answers.
    if (launching_.count(job_id) > 0) continue;
    const std::optional<HostJob> job = host_->FindJob(job_id);
    // A held job gives its Slurm job back at once (scancel, record
    // forgotten): it is submitted again when released.
    if (job && job->held && job->state == v1::JOB_STATE_QUEUED) {
      snapshot.given_back.push_back(record);
      continue;
    }
    in.records.push_back(record);
    // A record of an attempt that is over (the job was requeued) is an
    // ended job's: its Slurm job goes, whatever the job does now.
    if (!job) continue;
    if (job->state == v1::JOB_STATE_QUEUED) {
      if (record.attempt == job->attempt + 1) {
        in.jobs[job_id] = JobPhase::kWaiting;
      }
    } else if (record.attempt == job->attempt) {
      const bool settling = settling_.count(job_id) > 0 &&
                            std::find(settle_now.begin(), settle_now.end(),
                                      job_id) == settle_now.end();
      in.jobs[job_id] = settling ? JobPhase::kSettling : JobPhase::kRunning;
      if (job->stopping) {
        snapshot.stopping[job_id] = {job->stop_deadline_ms,
                                     job->stop_unreachable};
      }
    }
  }
  // Jobs being submitted now hold names squeue may show already.
  for (int64_t job_id : launching_) {
    SlurmJobRecord launching;
    launching.job_id = job_id;
    launching.submitted_ms = clock_->NowMs();
    in.records.push_back(launching);
    in.jobs[job_id] = JobPhase::kWaiting;
  }
  return snapshot;
}

void SlurmBridge::CancelSlurmJobs(const ReconcileInput& in,
                                  const ReconcileDecisions& d,
                                  const std::set<int64_t>& release) {
  // A Slurm job still running for a job that has ended is left a while to
  // end by itself (its workers leave as the job ends, and Slurm then says
  // COMPLETED rather than CANCELLED); waiting ones and strays go at once.
  std::set<int64_t> lingering;
  for (const auto& c : d.cancel) {
    auto row = std::find_if(
        in.rows.begin(), in.rows.end(),
        [&](const SqueueRow& r) { return r.slurm_id == c.slurm_id; });
    auto record = std::find_if(
        in.records.begin(), in.records.end(),
        [&](const SlurmJobRecord& r) { return r.slurm_id == c.slurm_id; });
    const bool known = record != in.records.end();
    const bool at_once = known && release.count(record->job_id) > 0;
    if (known && !at_once && row != in.rows.end() &&
        MapSlurmState(*row, "").phase == SlurmPhase::kRunning) {
      auto [since, added] = lingering_.try_emplace(c.slurm_id, in.now_ms);
      lingering.insert(c.slurm_id);
      if (in.now_ms - since->second < kLingerMs) continue;
    }
    spdlog::info("scancel Slurm job {}: {}", c.slurm_id, c.why);
    if (absl::Status s = CancelBatch(*tool_, c.slurm_id); !s.ok()) {
      spdlog::warn("scancel {}: {}", c.slurm_id, s.ToString());
    }
  }
  std::erase_if(lingering_,
                [&](const auto& e) { return lingering.count(e.first) == 0; });
}

void SlurmBridge::EndStopping(const ReconcileInput& in,
                              std::map<int64_t, StoppingJob> stopping) {
  // A worker is unreachable for the signal once it has been for a while:
  // one reconnecting (after the scheduler's restart) is asked on its new
  // stream.
  for (auto& [job_id, job] : stopping) {
    if (!job.unreachable) {
      unreachable_since_.erase(job_id);
      continue;
    }
    const int64_t since =
        unreachable_since_.try_emplace(job_id, in.now_ms).first->second;
    job.unreachable = in.now_ms - since >= kUnreachableMs;
  }
  std::erase_if(unreachable_since_,
                [&](const auto& e) { return stopping.count(e.first) == 0; });
  const StopDecisions d =
      StopPreempted(in, stopping, signalled_, kStopMarginMs);
  for (int64_t slurm_id : d.signal) {
    spdlog::info(
        "scancel --batch --signal=TERM Slurm job {}: its dlbatch job is "
        "preempted and a worker of it cannot be asked to stop",
        slurm_id);
    if (absl::Status s = SignalBatch(*tool_, slurm_id, "TERM"); !s.ok()) {
      spdlog::warn("scancel --signal {}: {}", slurm_id, s.ToString());
      continue;  // tried again at the next poll
    }
    signalled_.insert(slurm_id);
  }
  for (int64_t slurm_id : d.cancel) {
    spdlog::info(
        "scancel Slurm job {}: its dlbatch job is preempted and has not "
        "stopped within its grace",
        slurm_id);
    if (absl::Status s = CancelBatch(*tool_, slurm_id); !s.ok()) {
      spdlog::warn("scancel {}: {}", slurm_id, s.ToString());
    }
  }
  std::erase_if(signalled_, [&](int64_t slurm_id) {
    return std::none_of(
        in.records.begin(), in.records.end(), [&](const SlurmJobRecord& r) {
          return r.slurm_id == slurm_id && stopping.count(r.job_id) > 0;
        });
  });
}

void SlurmBridge::Apply(const ReconcileDecisions& d,
                        const std::vector<int64_t>& settle_now) {
  host_->WithLock([&](WorkerMail& mail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                      host_->mutex()) {
    for (const auto& [job_id, reason] : d.waiting) {
      if (gangs_.count(job_id) > 0 || !host_->FindJob(job_id)) continue;
      std::string& held = waiting_[job_id];
      if (held != reason) {
        held = reason;
        host_->JobChanged(job_id);
      }
    }
    // Workers that left before their job ended go once it has.
    std::vector<int64_t> done;
    for (int64_t worker : departed_) {
      if (!host_->PartsOn(worker).holds) done.push_back(worker);
    }
    if (!done.empty()) {
      (void)host_->InTransaction(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
            for (int64_t worker : done) {
              departed_.erase(worker);
              RETURN_IF_ERROR(
                  host_->ForgetWorker(worker, "gone with its Slurm job"));
            }
            return absl::OkStatus();
          });
    }
    if (d.lost.empty() && d.reported.empty() && settle_now.empty()) return;
    std::vector<int64_t> as_reported = d.reported;
    as_reported.insert(as_reported.end(), settle_now.begin(), settle_now.end());
    (void)host_->InTransaction(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
          for (const auto& lost : d.lost) {
            std::optional<HostJob> job = host_->FindJob(lost.job_id);
            if (!job) continue;
            RETURN_IF_ERROR(JobLost(*job, lost.reason, lost.machine_fault,
                                    lost.preempted, mail));
          }
          for (int64_t job_id : as_reported) {
            // Still waiting: nothing else ended it since the read.
            if (SettlingJob(job_id)) {
              RETURN_IF_ERROR(host_->EndAsReported(job_id, mail));
            }
          }
          return absl::OkStatus();
        });
  });
}

absl::Status SlurmBridge::JobLost(const HostJob& job, const std::string& reason,
                                  bool machine_fault, bool preempted,
                                  WorkerMail& mail) {
  host_->mutex().AssertHeld();
  const int64_t id = job.id;
  gangs_.erase(id);
  waiting_.erase(id);
  settling_.erase(id);
  if (job.state == v1::JOB_STATE_QUEUED) {
    // Its Slurm job ended before all its workers were in: no attempt ran.
    // A preemption is no fault of the job's: it is not counted.
    if (preempted && !job.cancel_requested) {
      RETURN_IF_ERROR(host_->Note(
          id,
          absl::StrCat("[dlbatch] ", reason, "; submitted to Slurm again")));
      host_->Enqueue(id);
      return absl::OkStatus();
    }
    if (machine_fault && ++resubmits_[id] < options_.max_attempts) {
      RETURN_IF_ERROR(host_->PutResubmits(id, resubmits_[id]));
      RETURN_IF_ERROR(host_->Note(
          id,
          absl::StrCat("[dlbatch] ", reason, "; submitted to Slurm again")));
      host_->Enqueue(id);
      return absl::OkStatus();
    }
    if (resubmits_.erase(id) > 0) {
      RETURN_IF_ERROR(host_->PutResubmits(id, 0));
    }
    return host_->EndQueued(
        id,
        job.cancel_requested ? v1::JOB_STATE_CANCELLED : v1::JOB_STATE_FAILED,
        absl::StrCat("[dlbatch] ", reason, "; job failed"), reason);
  }
  // It ran. Preempted by Slurm: queued again as preempted, not counted.
  if (preempted && !job.cancel_requested && !job.stopping) {
    return host_->RequeuePreempted(id, reason, mail);
  }
  // Stopping for dlbatch's preemption (its Slurm job ended at the grace,
  // or Slurm ended it first): the host queues it again as that preemption.
  if (job.stopping && !job.cancel_requested) {
    return host_->RequeueLost(id, reason, mail);
  }
  // A machine's fault, or a job stopped behind dlbatch's back with a
  // checkpoint to resume from, is requeued within its attempts; its own
  // time limit (Slurm's --time) or a job with nothing stored fails.
  const bool timed_out = absl::StrContains(reason, "time limit");
  const bool resumable = job.has_checkpoint && !timed_out;
  if (machine_fault || resumable || job.cancel_requested) {
    return host_->RequeueLost(id, reason, mail);
  }
  return host_->FailRunning(id, reason, mail);
}

}  // namespace dlbatch::scheduler::slurm
