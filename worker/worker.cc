#include "worker/worker.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/blob_transfer.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/devices.h"
#include "worker/output_files.h"
#include "worker/train_job.h"

namespace dlbatch::worker {
namespace {

constexpr int kDiaryBatchLines = 500;
constexpr int kTransferThreads = 2;

bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

Worker::Worker(WorkerOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock) {
  channel_ = MakeChannel(options_.channel);
  link_ = v1::WorkerLink::NewStub(channel_);
  blobs_ = v1::Scheduler::NewStub(channel_);
  subprocesses_ = std::make_unique<SubprocessSet>(
      clock_,
      [this](int64_t key, const OutputLine& line) { OnLine(key, line); },
      [this](int64_t key, const ExitInfo& info) { OnExit(key, info); });
  threads_.emplace_back([this] { SendLoop(); });
  threads_.emplace_back([this] { JobsLoop(); });
  for (int i = 0; i < kTransferThreads; ++i)
    threads_.emplace_back([this] { TransferLoop(); });
}

Worker::~Worker() {
  Shutdown();
  for (auto& t : threads_) t.join();
}

void Worker::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  cv_.notify_all();
  transfer_cv_.notify_all();
  subprocesses_->Wake();
}

absl::Status Worker::Run() {
  int64_t backoff_ms = 100;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return absl::OkStatus();
    }
    absl::Status s = Session();
    if (s.code() == absl::StatusCode::kUnauthenticated ||
        s.code() == absl::StatusCode::kPermissionDenied ||
        s.code() == absl::StatusCode::kFailedPrecondition) {
      Shutdown();
      return s;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) return absl::OkStatus();
      spdlog::warn("scheduler at {}: {}; reconnecting in {} ms",
                   options_.channel.endpoint.original, s.ToString(),
                   backoff_ms);
      cv_.wait_for(lock, std::chrono::milliseconds(backoff_ms),
                   [this] { return stopping_; });
    }
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 2000);
    if (s.ok())
      backoff_ms = 100;  // a session that registered resets the backoff
  }
}

absl::Status Worker::Session() {
  grpc::ClientContext context;
  AddToken(&context, options_.channel.token);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::OkStatus();
    context_ = &context;
  }
  std::unique_ptr<Stream> stream = link_->Connect(&context);
  v1::WorkerMessage hello;
  auto* reg = hello.mutable_register_();
  reg->set_name(options_.name);
  reg->set_host(options_.host);
  reg->set_profile(options_.profile);
  for (const auto& d : options_.devices) *reg->add_devices() = d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, job] : jobs_) {
      auto* r = reg->add_running();
      r->set_job_id(job.start.job_id());
      r->set_attempt(job.start.attempt());
      r->set_part(job.start.part());
    }
  }
  absl::Status result;
  v1::SchedulerMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply)) {
    result = FromGrpcStatus(stream->Finish());
    if (result.ok())
      result = absl::UnavailableError("the stream closed at once");
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
    return result;
  }
  if (reply.has_refused()) {
    context.TryCancel();
    (void)stream->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
    return absl::FailedPreconditionError(
        absl::StrCat("the scheduler refused this worker: ", reply.refused()));
  }
  spdlog::info(
      "registered with {} as worker #{} '{}' in profile '{}' ({} slots)",
      options_.channel.endpoint.original, reply.registered().worker_id(),
      options_.name, options_.profile, options_.devices.size());
  {
    std::lock_guard<std::mutex> wlock(write_mu_);
    stream_ = stream.get();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    connected_ = true;
    dirty_ = true;
    heartbeat_ms_ =
        std::max<int64_t>(50, reply.registered().heartbeat_interval_ms());
    for (auto& [key, job] : jobs_) {
      job.sent_seq =
          job.unacked.empty() ? job.next_seq : job.unacked.front().seq() - 1;
      job.ended_sent = false;
      job.progress_unsent = job.progress.time_ms() > 0;
      job.checkpoint_unsent = job.checkpoint.has_value();
    }
  }
  cv_.notify_all();
  for (const auto& c : reply.registered().cancel()) {
    HandleCancel(c.job_id(), c.attempt(), c.part(), 5000,
                 "the scheduler no longer runs this job here");
  }
  v1::SchedulerMessage message;
  while (stream->Read(&message)) Handle(message);

  {
    std::lock_guard<std::mutex> lock(mu_);
    connected_ = false;
  }
  context.TryCancel();  // unblocks a Write in progress
  {
    std::lock_guard<std::mutex> wlock(write_mu_);
    stream_ = nullptr;
  }
  result = FromGrpcStatus(stream->Finish());
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
  if (result.ok())
    return absl::UnavailableError("the scheduler closed the stream");
  // A registered session that broke is a transient failure whatever its code.
  if (!Retryable(result)) result = absl::UnavailableError(result.message());
  return result;
}

void Worker::Handle(const v1::SchedulerMessage& message) {
  switch (message.msg_case()) {
    case v1::SchedulerMessage::kStart:
      HandleStart(message.start());
      break;
    case v1::SchedulerMessage::kCancel: {
      const auto& c = message.cancel();
      HandleCancel(c.job_id(), c.attempt(), c.part(), c.grace_ms(), c.reason());
      break;
    }
    case v1::SchedulerMessage::kDiaryAck: {
      const auto& a = message.diary_ack();
      std::lock_guard<std::mutex> lock(mu_);
      Job* job = FindLocked(a.job_id(), a.attempt(), a.part());
      if (job == nullptr) break;
      while (!job->unacked.empty() && job->unacked.front().seq() <= a.seq()) {
        job->unacked.pop_front();
      }
      break;
    }
    case v1::SchedulerMessage::kEndedAck: {
      const auto& a = message.ended_ack();
      std::string dir;
      {
        std::lock_guard<std::mutex> lock(mu_);
        Job* job = FindLocked(a.job_id(), a.attempt(), a.part());
        if (job == nullptr || job->phase != Job::kEnded) break;
        dir = job->dir;
        jobs_.erase(job->key);
      }
      if (!options_.keep_job_dirs) (void)RemoveTree(dir);
      break;
    }
    default:
      break;
  }
}

void Worker::HandleStart(const v1::StartJob& start) {
  int64_t key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (FindLocked(start.job_id(), start.attempt(), start.part()) != nullptr)
      return;
    key = next_key_++;
    Job& job = jobs_[key];
    job.key = key;
    job.start = start;
    job.dir = absl::StrCat(options_.work_dir, "/jobs/", start.job_id(), "-",
                           start.attempt(), "-", start.part());
  }
  spdlog::info("job {} (attempt {}) assigned devices [{}]", start.job_id(),
               start.attempt(), absl::StrJoin(start.devices(), ","));
  PostTransfer([this, key] { Prepare(key); });
}

void Worker::HandleCancel(int64_t job_id, int attempt, int part,
                          int64_t grace_ms, const std::string& reason) {
  int64_t key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindLocked(job_id, attempt, part);
    if (job == nullptr || job->cancel_requested ||
        job->phase >= Job::kFinishing)
      return;
    job->cancel_requested = true;
    job->cancel_reason = reason;
    AddDiaryLocked(*job, 0,
                   absl::StrCat("[dlbatch] stopping the job: ", reason));
    if (job->phase != Job::kRunning) return;  // Prepare sees the flag
    key = job->key;
  }
  cv_.notify_all();
  RunOnJobsThread(
      [this, key, grace_ms] { subprocesses_->Terminate(key, grace_ms); });
}

void Worker::SendLoop() {
  int64_t last_beat = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_),
                 [this] { return stopping_ || (connected_ && dirty_); });
    if (stopping_) return;
    if (!connected_) continue;
    dirty_ = false;
    std::vector<v1::WorkerMessage> out;
    std::vector<std::pair<int64_t, int64_t>> sent;  // key, seq
    std::vector<int64_t> ended;
    for (auto& [key, job] : jobs_) {
      // Lines first, then the report: the scheduler ends a job only after
      // every line before the report is committed.
      auto it = std::find_if(
          job.unacked.begin(), job.unacked.end(),
          [&](const v1::DiaryLine& l) { return l.seq() > job.sent_seq; });
      while (it != job.unacked.end()) {
        v1::WorkerMessage m;
        auto* d = m.mutable_diary();
        d->set_job_id(job.start.job_id());
        d->set_attempt(job.start.attempt());
        d->set_part(job.start.part());
        for (int n = 0; n < kDiaryBatchLines && it != job.unacked.end();
             ++n, ++it) {
          *d->add_lines() = *it;
        }
        sent.emplace_back(key, d->lines(d->lines_size() - 1).seq());
        out.push_back(std::move(m));
      }
      if (job.progress_unsent) {
        v1::WorkerMessage m;
        auto* p = m.mutable_progress();
        p->set_job_id(job.start.job_id());
        p->set_attempt(job.start.attempt());
        p->set_part(job.start.part());
        *p->mutable_progress() = job.progress;
        out.push_back(std::move(m));
        job.progress_unsent = false;  // a failed write: the reconnect resends
      }
      if (job.checkpoint_unsent) {
        v1::WorkerMessage m;
        *m.mutable_checkpoint() = *job.checkpoint;
        out.push_back(std::move(m));
        job.checkpoint_unsent = false;
      }
      if (job.ended && !job.ended_sent) {
        v1::WorkerMessage m;
        *m.mutable_ended() = *job.ended;
        out.push_back(std::move(m));
        ended.push_back(key);
      }
    }
    int64_t now = clock_->MonotonicMs();
    if (out.empty() && now - last_beat < heartbeat_ms_) continue;
    if (out.empty()) {
      v1::WorkerMessage beat;
      beat.mutable_heartbeat()->set_time_ms(clock_->NowMs());
      out.push_back(std::move(beat));
    }
    lock.unlock();
    bool ok = true;
    for (const auto& m : out) {
      if (!(ok = Write(m))) break;
    }
    lock.lock();
    if (!ok) continue;  // the session ends; the reconnect resends
    last_beat = now;
    for (auto [key, seq] : sent) {
      auto it = jobs_.find(key);
      if (it != jobs_.end())
        it->second.sent_seq = std::max(it->second.sent_seq, seq);
    }
    for (int64_t key : ended) {
      auto it = jobs_.find(key);
      if (it != jobs_.end()) it->second.ended_sent = true;
    }
  }
}

bool Worker::Write(const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return stream_ != nullptr && stream_->Write(message);
}

Worker::Job* Worker::FindLocked(int64_t job_id, int attempt, int part) {
  for (auto& [key, job] : jobs_) {
    if (job.start.job_id() == job_id && job.start.attempt() == attempt &&
        job.start.part() == part) {
      return &job;
    }
  }
  return nullptr;
}

void Worker::AddDiaryLocked(Job& job, int stream, const std::string& text) {
  v1::DiaryLine line;
  line.set_seq(++job.next_seq);
  line.set_time_ms(clock_->NowMs());
  line.set_stream(stream);
  line.set_text(text);
  job.unacked.push_back(std::move(line));
  dirty_ = true;
}

// ---- jobs thread ----

void Worker::RunOnJobsThread(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    jobs_commands_.push_back(std::move(fn));
  }
  subprocesses_->Wake();
}

void Worker::JobsLoop() {
  for (;;) {
    std::deque<std::function<void()>> commands;
    {
      std::lock_guard<std::mutex> lock(jobs_mu_);
      commands.swap(jobs_commands_);
    }
    for (auto& fn : commands) fn();
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
    }
    if (stopping) {
      // Kills and reaps every job; their reports are not sent (the
      // scheduler requeues them when this worker is lost).
      subprocesses_.reset();
      return;
    }
    subprocesses_->Poll(100);
    CheckDeadlines();
  }
}

void Worker::OnLine(int64_t key, const OutputLine& line) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (line.stream == 3) {
      OnChannelLineLocked(job, line);
      return;
    }
    // The trainer's own error line says what went wrong better than its
    // exit code: it becomes the job's reason.
    if (line.stream == 2 && job.start.spec().has_train() &&
        line.text.rfind("dlbatch-train: ", 0) == 0 &&
        job.trainer_error.empty()) {
      job.trainer_error = line.text.substr(std::strlen("dlbatch-train: "));
    }
    v1::DiaryLine d;
    d.set_seq(++job.next_seq);
    d.set_time_ms(line.time_ms);
    d.set_stream(line.stream);
    d.set_text(line.text);
    job.unacked.push_back(std::move(d));
    dirty_ = true;
  }
  cv_.notify_all();
}

void Worker::OnExit(int64_t key, const ExitInfo& info) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    it->second.phase = Job::kFinishing;
    if (info.leftover_killed > 0) {
      AddDiaryLocked(it->second, 0,
                     absl::StrCat("[dlbatch] killed ", info.leftover_killed,
                                  " process(es) the job left behind"));
    }
  }
  cv_.notify_all();
  PostTransfer([this, key, info] { Finish(key, info); });
}

void Worker::OnChannelLineLocked(Job& job, const OutputLine& line) {
  ChannelEvent event = ApplyChannelLine(line.text, line.time_ms, &job.progress);
  if (event.kind == ChannelEvent::kProgress && job.start.part() == 0) {
    job.progress_unsent = true;
    dirty_ = true;
    cv_.notify_all();
  } else if (event.kind == ChannelEvent::kCheckpoint && job.start.part() == 0) {
    job.checkpoint_wanted = event.iteration;
    if (!job.checkpoint_busy) {
      job.checkpoint_busy = true;
      const int64_t key = job.key;
      PostTransfer([this, key] { StoreCheckpoint(key); });
    }
  }
}

void Worker::CheckDeadlines() {
  int64_t now = clock_->MonotonicMs();
  std::vector<int64_t> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, job] : jobs_) {
      if (job.phase == Job::kRunning && job.deadline_mono > 0 &&
          now >= job.deadline_mono && !job.time_limit_hit) {
        job.time_limit_hit = true;
        AddDiaryLocked(job, 0,
                       absl::StrCat("[dlbatch] time limit ",
                                    FormatDurationMs(
                                        job.start.spec().time_limit_s() * 1000),
                                    " reached; stopping the job"));
        expired.push_back(key);
      }
    }
  }
  if (!expired.empty()) cv_.notify_all();
  for (int64_t key : expired) subprocesses_->Terminate(key, 10000);
}

// ---- transfer threads ----

void Worker::PostTransfer(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(transfer_mu_);
    transfers_.push_back(std::move(fn));
  }
  transfer_cv_.notify_one();
}

void Worker::TransferLoop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(transfer_mu_);
      transfer_cv_.wait(lock, [this] {
        std::lock_guard<std::mutex> l(mu_);
        return stopping_ || !transfers_.empty();
      });
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      fn = std::move(transfers_.front());
      transfers_.pop_front();
    }
    fn();
  }
}

void Worker::EndWithoutRunning(int64_t key, v1::JobState state,
                               const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (state == v1::JOB_STATE_FAILED)
      AddDiaryLocked(job, 0, "[dlbatch] " + reason);
    v1::JobEnded ended;
    ended.set_job_id(job.start.job_id());
    ended.set_attempt(job.start.attempt());
    ended.set_part(job.start.part());
    ended.set_state(state);
    ended.set_exit_code(-1);
    ended.set_reason(reason);
    ended.set_last_seq(job.next_seq);
    job.ended = std::move(ended);
    job.phase = Job::kEnded;
    dirty_ = true;
  }
  cv_.notify_all();
}

void Worker::Prepare(int64_t key) {
  v1::StartJob start;
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    start = it->second.start;
    dir = it->second.dir;
  }
  const v1::JobSpec& spec = start.spec();
  std::string out_dir = dir + "/output";
  absl::Status s = RemoveTree(dir);
  if (s.ok()) s = MakeDirs(out_dir, 0755);
  for (const auto& a : spec.attach()) {
    if (!s.ok()) break;
    s = Annotate(Fetch(a.sha256(), a.size(), dir + "/" + a.path(), a.mode()),
                 absl::StrCat("fetching attachment '", a.path(), "'"));
  }
  SubprocessOptions sp;
  if (s.ok() && spec.has_train()) {
    // A requeued attempt continues from the checkpoint an earlier one stored.
    for (const auto& f : start.checkpoint()) {
      if (!s.ok()) break;
      s = Annotate(
          Fetch(f.sha256(), f.size(), out_dir + "/" + f.path(), 0644),
          absl::StrCat("fetching the stored checkpoint's '", f.path(), "'"));
    }
    TrainLaunch launch;
    launch.trainer = options_.trainer;
    launch.job_dir = dir;
    launch.output_dir = out_dir;
    launch.rendezvous = RendezvousAddress();
    // Ranks of a one-worker job talk over loopback.
    launch.host = start.parts() > 1 ? options_.host : "127.0.0.1";
    launch.resume = start.checkpoint_size() > 0;
    if (s.ok()) s = PrepareTrainCommand(start, launch, &sp);
    if (s.ok() && launch.resume) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = jobs_.find(key);
      if (it != jobs_.end()) {
        AddDiaryLocked(
            it->second, 0,
            absl::StrCat(
                "[dlbatch] resuming from the stored checkpoint at iteration ",
                start.checkpoint_iteration()));
      }
    }
  } else if (s.ok()) {
    sp.argv.assign(spec.command().argv().begin(), spec.command().argv().end());
    sp.cwd = dir;
  }
  if (!s.ok()) {
    EndWithoutRunning(key, v1::JOB_STATE_FAILED, std::string(s.message()));
    return;
  }
  bool gpus = false;
  for (const auto& d : options_.devices) gpus |= d.kind() == "gpu";
  std::string devices = absl::StrJoin(start.devices(), ",");
  std::string visible;
  if (gpus) {
    absl::StatusOr<std::string> v = ChildVisibleDevices(
        start.devices(), std::getenv("CUDA_VISIBLE_DEVICES"));
    if (!v.ok()) {
      EndWithoutRunning(key, v1::JOB_STATE_FAILED,
                        std::string(v.status().message()));
      return;
    }
    visible = *std::move(v);
  }
  sp.env.insert(
      sp.env.begin(),
      {
          {"DLBATCH_JOB_ID", absl::StrCat(start.job_id())},
          {"DLBATCH_ATTEMPT", absl::StrCat(start.attempt())},
          {"DLBATCH_POOL", absl::StrCat(start.pool())},
          {"DLBATCH_PART", absl::StrCat(start.part())},
          {"DLBATCH_PARTS", absl::StrCat(std::max(1, start.parts()))},
          {"DLBATCH_DEVICES", devices},
          {"DLBATCH_OUTPUT_DIR", out_dir},
          // Exactly the job's GPUs (named as the worker's own
          // CUDA_VISIBLE_DEVICES names them); none on a worker of CPU slots.
          {"CUDA_VISIBLE_DEVICES", visible},
      });
  if (!gpus)
    sp.env.emplace_back("OMP_NUM_THREADS", absl::StrCat(start.devices_size()));
  for (const auto& [k, v] : spec.env()) sp.env.emplace_back(k, v);

  RunOnJobsThread([this, key, sp = std::move(sp)] {
    int64_t deadline = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = jobs_.find(key);
      if (it == jobs_.end()) return;
      if (it->second.cancel_requested) {
        std::string reason = it->second.cancel_reason;
        // Ended without a process: report from here.
        v1::JobEnded ended;
        ended.set_job_id(it->second.start.job_id());
        ended.set_attempt(it->second.start.attempt());
        ended.set_part(it->second.start.part());
        ended.set_state(v1::JOB_STATE_CANCELLED);
        ended.set_exit_code(-1);
        ended.set_reason(reason);
        ended.set_last_seq(it->second.next_seq);
        it->second.ended = std::move(ended);
        it->second.phase = Job::kEnded;
        dirty_ = true;
        cv_.notify_all();
        return;
      }
      int64_t limit_s = it->second.start.spec().time_limit_s();
      if (limit_s > 0) deadline = clock_->MonotonicMs() + limit_s * 1000;
    }
    auto pid = subprocesses_->Start(key, sp);
    if (!pid.ok()) {
      EndWithoutRunning(
          key, v1::JOB_STATE_FAILED,
          absl::StrCat("cannot start the job: ", pid.status().message()));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    it->second.phase = Job::kRunning;
    it->second.deadline_mono = deadline;
  });
}

void Worker::Finish(int64_t key, ExitInfo info) {
  v1::StartJob start;
  std::string out_dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    start = it->second.start;
    out_dir = it->second.dir + "/output";
  }
  v1::JobEnded ended;
  // Read without following symlinks; the size is checked before any byte.
  absl::StatusOr<OutputScan> scan =
      ScanOutputs(out_dir, start.max_output_bytes());
  absl::StatusOr<std::vector<v1::OutputFile>> stored =
      scan.ok()
          ? StoreOutputs(*scan,
                         [this](int fd, int64_t size, const std::string& what) {
                           return UploadOutput(fd, size, what);
                         })
          : scan.status();
  if (stored.status().code() == absl::StatusCode::kCancelled) return;
  absl::Status upload = stored.status();
  for (auto& f : stored.ok() ? *stored : std::vector<v1::OutputFile>{})
    *ended.add_outputs() = std::move(f);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    for (const std::string& line :
         scan.ok() ? scan->skipped : std::vector<std::string>{})
      AddDiaryLocked(job, 0, absl::StrCat("[dlbatch] ", line));
    ended.set_job_id(start.job_id());
    ended.set_attempt(start.attempt());
    ended.set_part(start.part());
    ended.set_exit_code(info.exited ? info.exit_code : 128 + info.term_signal);
    if (job.cancel_requested) {
      ended.set_state(v1::JOB_STATE_CANCELLED);
      ended.set_reason(job.cancel_reason);
    } else if (!upload.ok()) {
      ended.set_state(v1::JOB_STATE_FAILED);
      ended.set_reason(std::string(upload.message()));
      AddDiaryLocked(job, 0, absl::StrCat("[dlbatch] ", upload.message()));
    } else if (job.time_limit_hit) {
      ended.set_state(v1::JOB_STATE_FAILED);
      ended.set_reason(absl::StrCat(
          "time limit ", FormatDurationMs(start.spec().time_limit_s() * 1000),
          " reached"));
    } else if (info.exited && info.exit_code == 0) {
      ended.set_state(v1::JOB_STATE_FINISHED);
    } else {
      ended.set_state(v1::JOB_STATE_FAILED);
      ended.set_reason(
          job.trainer_error.empty()
              ? info.Describe()
              : absl::StrCat(info.Describe(), ": ", job.trainer_error));
    }
    ended.set_last_seq(job.next_seq);
    job.ended = std::move(ended);
    job.phase = Job::kEnded;
    dirty_ = true;
  }
  cv_.notify_all();
  spdlog::info("job {} (attempt {}) ended: {}", start.job_id(), start.attempt(),
               info.Describe());
}

// ---- train jobs: checkpoints and transfers ----

absl::Status Worker::Fetch(const std::string& sha256, int64_t size,
                           const std::string& dest, uint32_t mode) {
  RETURN_IF_ERROR(
      MakeDirs(std::filesystem::path(dest).parent_path().string(), 0755));
  for (int tries = 0;; ++tries) {
    absl::Status d = DownloadFile(blobs_.get(), options_.channel.token, sha256,
                                  size, dest, mode);
    if (d.ok() || !Retryable(d) || tries >= 20) return d;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

absl::StatusOr<v1::OutputFile> Worker::Upload(const std::string& path,
                                              const std::string& rel) {
  absl::StatusOr<LocalBlob> blob;
  for (int tries = 0;; ++tries) {
    blob = UploadFile(blobs_.get(), options_.channel.token, path);
    if (blob.ok() || !Retryable(blob.status()) || tries >= 120) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return absl::CancelledError("the worker is stopping");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!blob.ok()) return blob.status();
  v1::OutputFile f;
  f.set_path(rel);
  f.set_size(blob->size);
  f.set_sha256(blob->sha256);
  struct stat st;
  f.set_mode(::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644);
  return f;
}

absl::StatusOr<LocalBlob> Worker::UploadOutput(int fd, int64_t size,
                                               const std::string& what) {
  for (int tries = 0;; ++tries) {
    absl::StatusOr<LocalBlob> blob =
        UploadFd(blobs_.get(), options_.channel.token, fd, size, what);
    if (blob.ok() || !Retryable(blob.status()) || tries >= 120) return blob;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return absl::CancelledError("the worker is stopping");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

std::string Worker::RendezvousAddress() const {
  const Endpoint& e = options_.channel.endpoint;
  if (!e.is_unix) return e.original;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(e.path, ec);
  return "unix:" + (ec ? e.path : p.string());
}

void Worker::StoreCheckpoint(int64_t key) {
  for (;;) {
    v1::CheckpointStored stored;
    std::string dir;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = jobs_.find(key);
      if (it == jobs_.end()) return;
      Job& job = it->second;
      if (job.checkpoint_wanted < 0) {
        job.checkpoint_busy = false;
        return;
      }
      stored.set_iteration(job.checkpoint_wanted);
      job.checkpoint_wanted = -1;
      stored.set_job_id(job.start.job_id());
      stored.set_attempt(job.start.attempt());
      stored.set_part(job.start.part());
      dir = job.dir;
    }
    // Hard links hold this checkpoint's files while the trainer replaces
    // them with the next one (it writes a new file and renames it over).
    const std::string snap = absl::StrCat(dir, "/", kCheckpointSnapshotDir);
    absl::Status s = RemoveTree(snap);
    if (s.ok()) s = MakeDirs(snap, 0700);
    for (const char* name : kCheckpointFiles) {
      if (!s.ok()) break;
      const std::string from = absl::StrCat(dir, "/output/", name);
      const std::string to = absl::StrCat(snap, "/", name);
      if (::link(from.c_str(), to.c_str()) != 0) {
        s = absl::ErrnoToStatus(errno, absl::StrCat("linking ", from));
        break;
      }
      absl::StatusOr<v1::OutputFile> f = Upload(to, name);
      if (!f.ok()) {
        s = f.status();
        break;
      }
      *stored.add_files() = *std::move(f);
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (s.ok()) {
      job.checkpoint = std::move(stored);
      job.checkpoint_unsent = true;
      dirty_ = true;
      cv_.notify_all();
    } else if (s.code() != absl::StatusCode::kCancelled) {
      // The job goes on; a requeue would resume from the previous one.
      AddDiaryLocked(
          job, 0,
          absl::StrCat("[dlbatch] could not store the checkpoint of iteration ",
                       stored.iteration(), ": ", s.message()));
      cv_.notify_all();
    }
  }
}

}  // namespace dlbatch::worker
