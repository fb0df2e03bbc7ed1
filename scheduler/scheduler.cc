// Client operations and placement. Start, loading and recovery are in
// scheduler_load.cc; the parts the Scheduler owns have files of their own.
#include "scheduler/scheduler.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/duration.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/array_spec.h"
#include "proto/job_state.h"
#include "proto/jobspec_sweep.h"
#include "proto/jobspec_yaml.h"
#include "scheduler/kept_checkpoints.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

// What a submit asked for, as a SHA-256 (hex): its spec with the defaults
// Submit fills in, and its --after set, serialized deterministically. The
// request id and user are the key it is stored under, so left out.
std::string RequestDigest(const v1::JobSpec& spec,
                          const std::vector<int64_t>& after) {
  v1::SubmitJobRequest canonical;
  *canonical.mutable_spec() = spec;
  canonical.mutable_after()->Add(after.begin(), after.end());
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    canonical.SerializeToCodedStream(&out);
  }
  return Sha256Hex(bytes);
}

}  // namespace

Scheduler::Scheduler(Store* store, StoreReader* reader, BlobStore* blobs,
                     const Clock* clock, SchedulerOptions options,
                     DiskGuard* disk)
    : SchedulerState(store, reader, blobs, clock, std::move(options), disk),
      admin_(*this),
      users_(*this),
      control_(*this),
      watchers_(*this),
      streams_(*this),
      slurm_(*this),
      follow_(std::make_unique<DiaryFollowHub>(static_cast<FollowSource*>(this),
                                               clock)) {
  SetParts({.control = &control_,
            .users = &users_,
            .watchers = &watchers_,
            .preemptions = &preemptions_,
            .follow = follow_.get(),
            .bridge = &slurm_.bridge()});
  absl::MutexLock lock(&mu_);
  core_ = NewCore();
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
    queue_cv_.SignalAll();
    stop_cv_.SignalAll();
  }
  bridge().Stop();
  if (loop_.joinable()) loop_.join();
  admin_.JoinRetention();
}

bool Scheduler::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&queue_mu_);
  const absl::Time until = absl::Now() + d;
  while (!stopping_) {
    if (stop_cv_.WaitWithDeadline(&queue_mu_, until)) break;
  }
  return !stopping_;
}

absl::StatusOr<v1::SubmitJobReply> Scheduler::Submit(
    const v1::SubmitJobRequest& request) {
  v1::JobSpec spec = request.spec();
  if (spec.pool() == 0) spec.set_pool(1);
  if (spec.profile().empty()) spec.set_profile("local");
  if (spec.max_nodes() == 0) spec.set_max_nodes(1);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  // A sweep is one job per combination, an array one per index (never
  // both); a plain spec is one job. Either is a group with one id.
  std::vector<v1::JobSpec> specs;
  if (!spec.array().empty() || spec.has_array_task()) {
    ASSIGN_OR_RETURN(specs, ExpandArray(spec));
  } else {
    ASSIGN_OR_RETURN(specs, ExpandSweep(spec));
  }
  const bool array = !spec.array().empty();
  const bool sweep = spec.sweep().axes_size() > 0 || array;
  {
    std::set<std::string> profiles;
    for (const v1::JobSpec& s : specs) profiles.insert(s.profile());
    users_.AskBeforeSubmit(profiles, request.user());
  }
  // Jobs for Slurm: refused now where they could never run (sinfo is read
  // without the lock).
  for (const v1::JobSpec& s : specs) {
    if (bridge().ProfileOf(s.profile()) != nullptr) {
      if (s.array_task().limit() > 0) {
        // Slurm's queue starts them, not the placement core that keeps %N.
        return absl::InvalidArgumentError(absl::StrCat(
            "array: %", s.array_task().limit(),
            " is kept by dlbatch's own "
            "workers, and profile '",
            s.profile(),
            "' is Slurm's; leave out the %N, or use another profile"));
      }
      RETURN_IF_ERROR(bridge().CheckSubmit(s, request.user()));
    }
  }
  // --after as a set: the same jobs in any order are the same request.
  std::vector<int64_t> after(request.after().begin(), request.after().end());
  std::sort(after.begin(), after.end());
  after.erase(std::unique(after.begin(), after.end()), after.end());
  const std::string digest = RequestDigest(spec, after);
  v1::SubmitJobReply reply;
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    // Under the lock: a purge deletes blobs under it too.
    for (const auto& a : spec.attach()) {
      auto size = blobs_->Size(a.sha256());
      if (!size.ok() || *size != a.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("attachment '", a.path(),
                         "' was not uploaded to the scheduler; upload it "
                         "first (the dlbatch CLI does this for you)"));
      }
    }
    if (!request.request_id().empty()) {
      // A sweep's request id is stored on its first job. The same id with
      // the same request is a retry: it gets that job; with another, the
      // user reused an id by mistake, and nothing is made.
      ASSIGN_OR_RETURN(
          auto existing,
          store_->JobForRequest(request.user(), request.request_id()));
      if (existing && !existing->request_sha256.empty() &&
          existing->request_sha256 != digest) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request id '", request.request_id(), "' was used for job ",
            existing->job_id,
            " with a different job spec; use a new --request-id, or resubmit "
            "the same job"));
      }
      if (existing) {
        reply.set_job_id(existing->job_id);
        reply.set_duplicate(true);
        ASSIGN_OR_RETURN(int64_t sweep_id, store_->SweepIdOf(existing->job_id));
        reply.set_sweep_id(sweep_id);
        if (sweep_id == 0) {
          reply.add_job_ids(existing->job_id);
        } else {
          ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                           store_->SweepJobIds(sweep_id));
          reply.mutable_job_ids()->Add(ids.begin(), ids.end());
        }
        return reply;
      }
    }
    RETURN_IF_ERROR(CheckWritable());
    // --after: every job named exists and has not ended badly.
    for (int64_t dep : after) {
      ASSIGN_OR_RETURN(std::optional<v1::JobState> state,
                       store_->JobState(dep));
      if (!state) {
        return absl::InvalidArgumentError(
            absl::StrCat("--after ", dep, ": no job ", dep,
                         "; `dlbatch jobs` lists the jobs"));
      }
      if (IsTerminal(*state) && *state != v1::JOB_STATE_FINISHED) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--after ", dep, ": job ", dep, " has ", JobStateName(*state),
            "; --after waits for jobs that finish well (requeue it with "
            "dlbatch requeue ",
            dep, ", or leave it out)"));
      }
    }
    const int64_t now = clock_->NowMs();
    std::vector<JobRecord> records;
    records.reserve(specs.size());
    std::map<std::string, int> per_profile;  // this submit's jobs so far
    for (v1::JobSpec& job_spec : specs) {
      JobRecord rec;
      if (records.empty()) {
        rec.request_id = request.request_id();
        rec.request_sha256 = digest;
      }
      rec.user = request.user();
      rec.spec = std::move(job_spec);
      rec.state = v1::JOB_STATE_QUEUED;
      rec.submit_ms = now;
      // A job of a Slurm profile waits in Slurm, not in the placement
      // core: what it may ask was checked against the partition above.
      if (bridge().ProfileOf(rec.spec.profile()) != nullptr) {
        records.push_back(std::move(rec));
        continue;
      }
      RETURN_IF_ERROR(
          core_->CheckSatisfiable(ToQueued(rec), control_.Labels(*this)));
      RETURN_IF_ERROR(users_.CheckUserRuns(*this, rec));
      // Within the user's queued limit with this submit's earlier jobs.
      const int count = ++per_profile[rec.spec.profile()];
      RETURN_IF_ERROR(core_->CheckAdmission(ToQueued(rec), count));
      RETURN_IF_ERROR(CheckDevicesFit(rec.spec));
      records.push_back(std::move(rec));
    }
    {
      // Every job of a sweep, or none. Memory changes only after the
      // commit, so a failure here needs no recovery.
      absl::Status s = [&]() -> absl::Status {
        Transaction txn(store_->db());
        RETURN_IF_ERROR(txn.status());
        int64_t sweep_id = 0;
        if (sweep) {
          ASSIGN_OR_RETURN(sweep_id, store_->NextSweepId());
        }
        for (JobRecord& rec : records) {
          rec.sweep_id = sweep_id;
          if (array) rec.spec.mutable_array_task()->set_id(sweep_id);
          ASSIGN_OR_RETURN(rec.id, store_->InsertJob(rec));
          RETURN_IF_ERROR(store_->AddEvent(rec.id, v1::JOB_STATE_QUEUED, 0,
                                           rec.submit_ms, ""));
          if (!after.empty()) {
            JobControlRecord control;
            control.job_id = rec.id;
            control.after = after;
            RETURN_IF_ERROR(store_->PutJobControl(control));
          }
        }
        RETURN_IF_ERROR(TimedCommit(txn));
        reply.set_sweep_id(sweep_id);
        return absl::OkStatus();
      }();
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        disk_->NoteFull(s);
        return absl::ResourceExhaustedError(disk_->Reason());
      }
      RETURN_IF_ERROR(s);
    }
    reply.set_job_id(records.front().id);
    for (JobRecord& rec : records) {
      const int64_t id = rec.id;
      if (metrics_ != nullptr) {
        metrics_->JobSubmitted(rec.spec.profile());
        metrics_->JobMoved(rec.spec.profile(), v1::JOB_STATE_UNSPECIFIED,
                           v1::JOB_STATE_QUEUED);
      }
      reply.add_job_ids(id);
      if (after.empty()) {
        EnqueueJob(rec);
      } else {
        jobs_[id].after = after;
        waiting_after_.insert(id);
        after_dirty_ = true;  // some may have finished already
      }
      jobs_[id].record = std::move(rec);
      Changed(id);
    }
    // The jobs are committed whatever placement does now; a placement that
    // cannot be recorded recovers and is tried again.
    (void)PlaceJobs(&out);
  }
  Deliver(out);
  return reply;
}

absl::Status Scheduler::CheckDevicesFit(const v1::JobSpec& spec) const {
  mu_.AssertHeld();
  if (!spec.has_train()) return absl::OkStatus();
  const std::string& env = spec.train().options().execution_environment();
  if (env != "gpu" && env != "multi-gpu") return absl::OkStatus();
  std::set<std::string> with_gpus;
  for (const auto& [id, w] : workers_) {
    for (const auto& d : w.record.devices) {
      if (d.kind() == "gpu") with_gpus.insert(w.record.profile);
    }
  }
  if (with_gpus.count(spec.profile()) > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "train.options.execution_environment: ", env,
      " asks for GPUs, but the workers of "
      "profile '",
      spec.profile(), "' offer CPU slots only; use cpu or auto",
      with_gpus.empty()
          ? ", or start a worker with GPUs (dlbatch-worker without --cpu-slots)"
          : absl::StrCat(", or a profile with GPUs (--profile ",
                         absl::StrJoin(with_gpus, " or --profile "), ")")));
}

absl::Status Scheduler::PlaceJobs(Outbox* out) {
  mu_.AssertHeld();
  if (!broken_.ok()) return broken_;
  RETURN_IF_ERROR(
      control_.ResolveAfter(*this));  // jobs waiting for others (--after)
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Decision> decisions = core_->Schedule(clock_->NowMs());
  double ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
  ++passes_;
  last_pass_ms_ = ms;
  max_pass_ms_ = std::max(max_pass_ms_, ms);
  if (metrics_ != nullptr) {
    metrics_->PlacementPass(ms / 1000);
    metrics_->Profiles(core_->Profiles());
  }
  if (decisions.empty()) return preemptions_.Pass(*this, out);
  Outbox starts;
  absl::Status s = InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t now = clock_->NowMs();
    for (const Decision& d : decisions) {
      RETURN_IF_ERROR(BeginAttempt(jobs_.at(d.job), d.parts, now, &starts));
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;  // recovered; nothing of it is sent
  if (metrics_ != nullptr) {
    for (const Decision& d : decisions) {
      const JobRecord& rec = jobs_.at(d.job).record;
      metrics_->JobMoved(rec.spec.profile(), v1::JOB_STATE_QUEUED,
                         v1::JOB_STATE_RUNNING);
      metrics_->JobPlaced(rec.id, rec.attempt);
      if (rec.attempt == 1) {
        metrics_->QueueWait(static_cast<double>(std::max<int64_t>(
                                0, rec.start_ms - rec.submit_ms)) /
                            1000);
      }
    }
  }
  for (auto& start : starts) out->push_back(std::move(start));
  return preemptions_.Pass(*this, out);
}

absl::StatusOr<v1::Job> Scheduler::GetJob(int64_t job_id) {
  ASSIGN_OR_RETURN(auto rec, reader_->GetJob(job_id));
  if (!rec) {
    return absl::NotFoundError(
        absl::StrCat("no job ", job_id, "; `dlbatch jobs` lists the jobs"));
  }
  v1::Job job = RecordToProto(*rec);
  ASSIGN_OR_RETURN(auto history, reader_->History(job_id));
  for (auto& h : history) *job.add_history() = std::move(h);
  ASSIGN_OR_RETURN(int64_t lines, reader_->DiaryCount(job_id));
  job.set_diary_lines(lines);
  ASSIGN_OR_RETURN(auto preemptions, reader_->Preemptions(job_id));
  for (auto& p : preemptions) *job.add_preemptions() = std::move(p);
  {
    // Committed with (or before) the row just read; memory overrides below.
    ASSIGN_OR_RETURN(TrainState train, reader_->GetTrainState(job_id));
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointStored> kept,
                     reader_->KeptCheckpoints(job_id));
    SetKeptCheckpoints(kept, train.checkpoint, &job);
    *job.mutable_progress() = std::move(train.progress);
    *job.mutable_checkpoint() = std::move(*train.checkpoint.mutable_files());
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) {
    // Memory is at least as new as the committed row just read.
    const JobRecord& live = it->second.record;
    *job.mutable_progress() = it->second.progress;
    *job.mutable_checkpoint() = it->second.checkpoint.files();
    SetKeptCheckpoints(it->second.kept_checkpoints, it->second.checkpoint,
                       &job);
    job.set_state(it->second.cancel_requested && !IsTerminal(live.state)
                      ? v1::JOB_STATE_CANCELLING
                      : live.state);
    if (live.state == v1::JOB_STATE_QUEUED) {
      // One walk of its profile's queue for both (Slurm's queue has no
      // place of ours).
      std::optional<WaitInfo> info;
      if (bridge().ProfileOf(live.spec.profile()) == nullptr)
        info = core_->ExplainMany({job_id})[0];
      job.set_wait_reason(watchers_.WaitReason(*this, it->second, info));
      job.set_queue_position(info ? info->position : 0);
    }
    job.set_held(it->second.held);
    job.clear_preemptions();  // memory's are as new
    for (const auto& p : it->second.preemptions) *job.add_preemptions() = p;
    job.mutable_after()->Add(it->second.after.begin(), it->second.after.end());
  }
  for (auto& part : *job.mutable_placement()) {
    auto w = workers_.find(part.worker_id());
    if (w != workers_.end()) part.set_worker_name(w->second.record.name);
  }
  return job;
}

namespace {

// ListJobsRequest.sort's name -> the jobs table's column.
absl::StatusOr<std::string> JobSortColumn(const std::string& sort) {
  if (sort.empty() || sort == "id") return std::string("id");
  if (sort == "submit_time") return std::string("submit_ms");
  for (const char* same : {"name", "user", "state", "priority"}) {
    if (sort == same) return sort;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot sort jobs by '", sort,
                   "'; use id, submit_time, name, user, state or priority"));
}

}  // namespace

absl::StatusOr<v1::ListJobsReply> Scheduler::ListJobs(
    const v1::ListJobsRequest& request) {
  JobListQuery query;
  for (int s : request.states())
    query.states.push_back(static_cast<v1::JobState>(s));
  ASSIGN_OR_RETURN(query.sort_column, JobSortColumn(request.sort()));
  if (request.limit() < 0 || request.offset() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit and offset must be 0 or more; got limit ",
                     request.limit(), " and offset ", request.offset()));
  }
  query.limit = request.limit();
  query.offset = request.offset();
  query.descending = request.newest_first();
  query.sweep_id = request.sweep_id();
  query.user = request.user();
  query.name_glob = request.name_glob();
  query.name_contains = request.name_contains();
  query.count_total = request.count_total();
  v1::ListJobsReply reply;
  RETURN_IF_ERROR(reader_->ListJobSummaries(query, &reply));
  if (request.sweep_id() != 0 && reply.jobs().empty()) {
    // None in these states, or no such sweep at all?
    v1::ListJobsReply any;
    RETURN_IF_ERROR(
        reader_->ListJobSummaries({}, 1, false, &any, request.sweep_id()));
    if (any.jobs().empty()) {
      return absl::NotFoundError(
          absl::StrCat("no sweep ", request.sweep_id(),
                       "; `dlbatch submit` of a job file with `sweep:` prints "
                       "its sweep id, and "
                       "`dlbatch show <job id>` names a job's sweep"));
    }
  }
  // Progress comes with the summaries (committed with each report); why a
  // queued job waits, and its place in the queue, come from memory, as
  // GetJob's do: the placement core explains the listing's queued jobs in
  // one walk of each profile's queue (ExplainMany), and only the first
  // kListedWaitReasons get their reason written, so mu_ is never held long
  // for a listing of every job. Held and --after come from memory, as
  // GetJob's do; so do the names of the placement's workers.
  constexpr int kListedWaitReasons = 200;
  absl::MutexLock lock(&mu_);
  std::vector<JobId> queued;
  for (const v1::Job& job : reply.jobs()) {
    auto it = jobs_.find(job.id());
    if (job.state() == v1::JOB_STATE_QUEUED && it != jobs_.end() &&
        it->second.record.state == v1::JOB_STATE_QUEUED &&
        bridge().ProfileOf(it->second.record.spec.profile()) == nullptr) {
      queued.push_back(job.id());
    }
  }
  // Every queued job's place; the first kListedWaitReasons explained.
  const std::vector<int> places = core_->QueuePositions(queued);
  std::unordered_map<int64_t, int> place_of;
  for (size_t i = 0; i < queued.size(); ++i) place_of[queued[i]] = places[i];
  if (queued.size() > kListedWaitReasons) queued.resize(kListedWaitReasons);
  const std::vector<std::optional<WaitInfo>> explained =
      core_->ExplainMany(queued);
  std::unordered_map<int64_t, const std::optional<WaitInfo>*> info_of;
  for (size_t i = 0; i < queued.size(); ++i) info_of[queued[i]] = &explained[i];
  int reasons = 0;
  for (v1::Job& job : *reply.mutable_jobs()) {
    for (v1::DevicePart& part : *job.mutable_placement()) {
      auto w = workers_.find(part.worker_id());
      if (w != workers_.end()) part.set_worker_name(w->second.record.name);
    }
    if (IsTerminal(job.state())) continue;  // no longer in jobs_
    auto it = jobs_.find(job.id());
    if (it == jobs_.end()) continue;
    job.mutable_after()->Add(it->second.after.begin(), it->second.after.end());
    // A listing carries a job's latest preemption only (`show` has all).
    if (!it->second.preemptions.empty())
      *job.add_preemptions() = it->second.preemptions.back();
    if (job.state() != v1::JOB_STATE_QUEUED) continue;
    if (it->second.held) job.set_held(true);
    if (it->second.record.state != v1::JOB_STATE_QUEUED) continue;
    if (auto place = place_of.find(job.id()); place != place_of.end())
      job.set_queue_position(place->second);
    if (++reasons > kListedWaitReasons) continue;
    auto info = info_of.find(job.id());
    job.set_wait_reason(
        info != info_of.end()
            ? watchers_.WaitReason(*this, it->second, *info->second)
            : watchers_.WaitReason(*this, it->second));
  }
  return reply;
}

absl::StatusOr<v1::CancelJobsReply> Scheduler::Cancel(
    const v1::CancelJobsRequest& request) {
  v1::CancelJobsReply reply;
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) RETURN_IF_ERROR(CheckWritable());
    // A cancel writes little and frees space later: taken on a full disk.
    RETURN_IF_ERROR(InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (int64_t id : request.job_ids()) {
        auto* result = reply.add_results();
        result->set_job_id(id);
        auto it = jobs_.find(id);
        if (it == jobs_.end()) {
          ASSIGN_OR_RETURN(auto rec, reader_->GetJob(id));
          if (!rec) {
            result->set_error(absl::StrCat("no job ", id));
          } else {
            result->set_state(rec->state);
            result->set_error(absl::StrCat("job ", id, " has already ",
                                           JobStateName(rec->state)));
          }
          continue;
        }
        ActiveJob& job = it->second;
        std::string why = "cancelled by request";
        if (job.record.state == v1::JOB_STATE_QUEUED) {
          core_->Dequeue(id);
          result->set_state(v1::JOB_STATE_CANCELLED);
          RETURN_IF_ERROR(EndJob(job, v1::JOB_STATE_CANCELLED, 0, why));
          jobs_.erase(it);
          continue;
        }
        result->set_state(v1::JOB_STATE_CANCELLING);
        if (!job.cancel_requested) {
          job.cancel_requested = true;
          job.cancel_reason = why;
          RETURN_IF_ERROR(SetState(job, v1::JOB_STATE_CANCELLING, why));
          CancelParts(job, why, -1, &out);
        }
      }
      return absl::OkStatus();
    }));
    (void)PlaceJobs(&out);
  }
  Deliver(out);
  bridge().Poke();  // scancel without waiting (a no-op without Slurm)
  return reply;
}

absl::StatusOr<v1::WaitJobsReply> Scheduler::Wait(
    const v1::WaitJobsRequest& request, const std::function<bool()>& gone) {
  return WaitBlocking(*follow_, request, gone);
}

absl::Status Scheduler::ReadDiary(
    const v1::ReadDiaryRequest& request,
    const std::function<bool(const v1::DiaryChunk&)>& send,
    const std::function<bool()>& gone) {
  return ReadDiaryBlocking(*follow_, request, send, gone);
}

absl::StatusOr<FollowSource::DiaryRead> Scheduler::ReadDiaryLines(
    int64_t job, int64_t after, int limit, const std::vector<int32_t>& ranks) {
  DiaryRead read;
  {
    // Taking mu_ also waits out a commit whose Changed() notified us.
    absl::MutexLock lock(&mu_);
    read.ended = !jobs_.contains(job);
  }
  // `ended` was read first, so once true every line is already committed.
  ASSIGN_OR_RETURN(read.lines,
                   reader_->ReadDiary(job, after, limit, ranks, &read.scanned));
  if (read.ended) {
    ASSIGN_OR_RETURN(auto rec, reader_->GetJob(job));
    if (!rec) {
      return absl::NotFoundError(
          absl::StrCat("no job ", job, "; `dlbatch jobs` lists the jobs"));
    }
    read.state = rec->state;
  }
  return read;
}

absl::StatusOr<int64_t> Scheduler::DiaryTailStart(
    int64_t job, int64_t tail, const std::vector<int32_t>& ranks) {
  // Read outside mu_. A start past 0 means the job has lines, so it exists;
  // only a short or empty diary needs the job looked up.
  ASSIGN_OR_RETURN(int64_t start, reader_->DiaryTailStart(job, tail, ranks));
  if (start > 0) return start;
  ASSIGN_OR_RETURN(auto rec, reader_->GetJob(job));
  if (!rec) {
    return absl::NotFoundError(
        absl::StrCat("no job ", job, "; `dlbatch jobs` lists the jobs"));
  }
  return 0;
}

absl::StatusOr<bool> Scheduler::JobEnded(int64_t job) {
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.contains(job)) return false;
  }
  ASSIGN_OR_RETURN(auto rec, reader_->GetJob(job));
  if (!rec) return absl::NotFoundError(absl::StrCat("no job ", job));
  return true;
}

v1::ListWorkersReply Scheduler::ListWorkers() {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersReply reply;
  std::map<int64_t, std::vector<int64_t>> running;
  for (const auto& [id, job] : jobs_) {
    for (const Part& p : job.record.parts) {
      if (job.record.state != v1::JOB_STATE_QUEUED)
        running[p.worker].push_back(id);
    }
  }
  for (const auto& [id, w] : workers_) {
    auto* info = reply.add_workers();
    info->set_id(id);
    info->set_name(w.record.name);
    info->set_host(w.record.host);
    info->set_profile(w.record.profile);
    info->set_online(w.session != nullptr);
    for (const auto& d : w.record.devices) *info->add_devices() = d;
    info->set_free_slots(
        w.session ? static_cast<int>(core_->FreeDevices(id).size()) : 0);
    auto& jobs = running[id];
    std::sort(jobs.begin(), jobs.end());
    info->mutable_running_jobs()->Add(jobs.begin(), jobs.end());
    info->set_last_seen_ms(w.record.last_seen_ms);
    info->set_version(w.version);
    info->set_draining(w.draining);
    info->set_drain_reason(w.drain_reason);
    if (w.session != nullptr) {
      info->mutable_gpus()->Add(w.gpus.begin(), w.gpus.end());
      info->set_gpus_read_ms(w.gpus_read_ms);
    }
  }
  return reply;
}

v1::ListProfilesReply Scheduler::ListProfiles() {
  v1::ListProfilesReply reply = ListProfilesLocked();
  // Slurm's view of each Slurm profile, read with sinfo outside the lock.
  for (v1::ProfileInfo& info : *reply.mutable_profiles()) {
    const slurm::SlurmProfile* p = bridge().ProfileOf(info.name());
    if (p == nullptr) continue;
    v1::SlurmPartition* view = info.mutable_slurm();
    view->set_partition(p->partition);
    absl::StatusOr<slurm::PartitionView> read = slurm_.View(info.name());
    if (!read.ok()) {
      view->set_error(std::string(read.status().message()));
      continue;
    }
    view->set_nodes(read->nodes);
    view->set_idle(read->idle);
    view->set_busy(read->busy);
    view->set_unavailable(read->unavailable);
    view->set_gpus(read->gpus);
    view->set_gpus_used(read->gpus_used);
    if (info.max_pool() == 0 && p->gpus_per_node > 0) {
      info.set_max_pool(read->nodes * p->gpus_per_node);
    }
  }
  return reply;
}

v1::ListProfilesReply Scheduler::ListProfilesLocked() {
  absl::MutexLock lock(&mu_);
  v1::ListProfilesReply reply;
  std::map<std::string, std::set<std::string>> kinds;
  for (const auto& [id, w] : workers_) {
    for (const auto& d : w.record.devices)
      kinds[w.record.profile].insert(d.kind());
  }
  for (const ProfileSummary& p : core_->Profiles()) {
    auto* info = reply.add_profiles();
    info->set_name(p.name);
    const bool slurm = std::any_of(
        options_.slurm_profiles.begin(), options_.slurm_profiles.end(),
        [&](const slurm::SlurmProfile& s) { return s.name == p.name; });
    info->set_type(slurm ? "slurm" : "workers");
    info->set_workers(p.workers);
    info->set_workers_online(p.workers_online);
    info->set_total_slots(p.online_slots);
    info->set_free_slots(p.free_slots);
    int max_pool = p.known_slots;
    if (p.max_pool_configured > 0)
      max_pool = std::min(max_pool, p.max_pool_configured);
    info->set_max_pool(max_pool);
    const auto& k = kinds[p.name];
    info->set_slot_kind(k.empty()      ? "none"
                        : k.size() > 1 ? "mixed"
                                       : *k.begin());
    info->set_queued_jobs(p.queued);
    info->set_running_jobs(p.running);
    if (slurm) {
      // Its queued jobs wait in Slurm, not in the placement core.
      int queued = 0;
      for (const auto& [id, job] : jobs_) {
        queued += job.record.state == v1::JOB_STATE_QUEUED &&
                  job.record.spec.profile() == p.name;
      }
      info->set_queued_jobs(queued);
    }
  }
  return reply;
}

absl::StatusOr<v1::ListOutputsReply> Scheduler::ListOutputs(int64_t job_id) {
  ASSIGN_OR_RETURN(auto rec, reader_->GetJob(job_id));
  if (!rec) {
    return absl::NotFoundError(
        absl::StrCat("no job ", job_id, "; `dlbatch jobs` lists the jobs"));
  }
  v1::ListOutputsReply reply;
  reply.set_state(rec->state);
  ASSIGN_OR_RETURN(auto files, reader_->Outputs(job_id));
  for (auto& f : files) *reply.add_files() = std::move(f);
  return reply;
}

}  // namespace dlbatch::scheduler
