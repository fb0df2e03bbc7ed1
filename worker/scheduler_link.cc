#include "worker/scheduler_link.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/tls_client.h"
#include "spdlog/spdlog.h"

namespace dlbatch::worker {
namespace {

class GrpcLinkStream final : public LinkStream {
 public:
  GrpcLinkStream(v1::WorkerLink::Stub* stub, const std::string& token) {
    AddToken(&context_, token);
    stream_ = stub->Connect(&context_);
  }
  bool Write(const v1::WorkerMessage& message) override {
    return stream_->Write(message);
  }
  bool Read(v1::SchedulerMessage* message) override {
    return stream_->Read(message);
  }
  void Cancel() override { context_.TryCancel(); }
  absl::Status Finish() override { return FromGrpcStatus(stream_->Finish()); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>>
      stream_;
};

class GrpcLinkTransport final : public LinkTransport {
 public:
  GrpcLinkTransport(std::shared_ptr<grpc::Channel> channel,
                    ChannelConfig config)
      : channel_(std::move(channel)),
        stub_(v1::WorkerLink::NewStub(channel_)),
        config_(std::move(config)) {}

  absl::StatusOr<std::unique_ptr<LinkStream>> Connect(
      int64_t timeout_ms) override {
    // Waiting here (instead of in the stream's first write) bounds how long
    // one attempt takes and lets the caller's backoff, not gRPC's, decide
    // when the next one starts.
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                    std::chrono::milliseconds(timeout_ms))) {
      if (!config_.endpoint.is_unix) {
        // Reached but not trusted (a scheduler restored without its keys,
        // a CA replaced): say so. Still retried: running jobs go on, and
        // the operator may put the right CA back.
        absl::Status why =
            ProbeTls(config_, std::min<int64_t>(timeout_ms, 2000));
        if (absl::IsFailedPrecondition(why)) {
          return absl::UnavailableError(why.message());
        }
      }
      return absl::UnavailableError(
          absl::StrCat("not reachable within ", timeout_ms, " ms"));
    }
    return std::make_unique<GrpcLinkStream>(stub_.get(), config_.token);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerLink::Stub> stub_;
  const ChannelConfig config_;
};

}  // namespace

std::unique_ptr<LinkTransport> MakeGrpcLinkTransport(
    std::shared_ptr<grpc::Channel> channel, const ChannelConfig& config) {
  return std::make_unique<GrpcLinkTransport>(std::move(channel), config);
}

SchedulerLink::SchedulerLink(LinkOptions options, LinkTransport* transport,
                             const Clock* clock)
    : options_(std::move(options)), transport_(transport), clock_(clock) {
  sender_ = std::thread([this] { SendLoop(); });
}

SchedulerLink::~SchedulerLink() {
  Stop();
  sender_.join();
}

void SchedulerLink::SetHandler(LinkHandler* handler) { handler_ = handler; }

void SchedulerLink::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  if (stream_ != nullptr) stream_->Cancel();
  if (connecting_ != nullptr) connecting_->Cancel();
}

void SchedulerLink::Open(const JobRef& ref) {
  absl::MutexLock lock(&mu_);
  outbox_.Open(ref);
}

void SchedulerLink::Post(const v1::WorkerMessage& record) {
  absl::MutexLock lock(&mu_);
  outbox_.Add(record);
}

std::vector<JobRef> SchedulerLink::Held() const {
  absl::MutexLock lock(&mu_);
  return outbox_.Held();
}

size_t SchedulerLink::Unacked(const JobRef& ref) const {
  absl::MutexLock lock(&mu_);
  return outbox_.Unacked(ref);
}

bool SchedulerLink::connected() const {
  absl::MutexLock lock(&mu_);
  return stream_ != nullptr;
}

absl::Status SchedulerLink::Run() {
  int64_t backoff_ms = options_.min_backoff_ms;
  for (;;) {
    absl::Status s = Session();
    if (s.code() == absl::StatusCode::kUnauthenticated ||
        s.code() == absl::StatusCode::kPermissionDenied ||
        s.code() == absl::StatusCode::kFailedPrecondition) {
      Stop();
      return s;
    }
    if (!removed_.empty()) {
      // Final: reconnecting would only be refused (or, from a scheduler
      // that forgot the removal, join as a new worker).
      spdlog::warn("leaving: the scheduler at {} says: {}", options_.scheduler,
                   removed_);
      Stop();
      return absl::OkStatus();
    }
    if (s.ok()) backoff_ms = options_.min_backoff_ms;  // it had registered
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    if (s.ok()) {
      // Its break was logged by Session(), with the reason.
      spdlog::info("reconnecting to {} in {} ms", options_.scheduler,
                   backoff_ms);
    } else {
      spdlog::warn("scheduler at {}: {}; reconnecting in {} ms",
                   options_.scheduler, s.ToString(), backoff_ms);
    }
    auto stopping = [this]()
                        ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping),
                         absl::Milliseconds(backoff_ms));
    if (stopping_) return absl::OkStatus();
    if (!s.ok()) backoff_ms = std::min(backoff_ms * 2, options_.max_backoff_ms);
  }
}

// Returns OK after a registered session broke (reconnect at once), an error
// otherwise.
absl::Status SchedulerLink::Session() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<LinkStream>> opened =
      transport_->Connect(options_.connect_timeout_ms);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<LinkStream> stream = *std::move(opened);
  v1::WorkerMessage hello;
  v1::Register* reg = hello.mutable_register_();
  reg->set_name(options_.name);
  reg->set_host(options_.host);
  reg->set_profile(options_.profile);
  for (const auto& d : options_.devices) *reg->add_devices() = d;
  reg->set_runs_as_any_user(options_.runs_as_any_user);
  reg->set_user(options_.user);
  if (options_.slurm_job) *reg->mutable_slurm() = *options_.slurm_job;
  reg->set_version(options_.version);
  reg->set_leaves_when_removed(true);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    connecting_ = stream.get();
    for (const JobRef& ref : outbox_.Held()) ref.To(reg->add_running());
  }
  auto clear_connecting = [&] {
    absl::MutexLock lock(&mu_);
    connecting_ = nullptr;
  };
  v1::SchedulerMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply)) {
    clear_connecting();
    absl::Status s = stream->Finish();
    return s.ok() ? absl::UnavailableError("the stream closed at once") : s;
  }
  if (reply.has_refused()) {
    clear_connecting();
    stream->Cancel();
    (void)stream->Finish();
    return absl::FailedPreconditionError(
        absl::StrCat("the scheduler refused this worker: ", reply.refused()));
  }
  spdlog::info(
      "registered with {} as worker #{} '{}' in profile '{}' ({} slots; "
      "scheduler version {})",
      options_.scheduler, reply.registered().worker_id(), options_.name,
      options_.profile, options_.devices.size(),
      reply.registered().scheduler_version().empty()
          ? "unknown"
          : reply.registered().scheduler_version());
  {
    absl::MutexLock lock(&mu_);
    connecting_ = nullptr;
    if (stopping_) {
      stream->Cancel();
      (void)stream->Finish();
      return absl::OkStatus();
    }
    heartbeat_ms_ =
        std::max<int64_t>(50, reply.registered().heartbeat_interval_ms());
    outbox_.Rewind();
    answers_.clear();
    stream_ = stream.get();
  }
  for (const auto& c : reply.registered().cancel()) {
    v1::SchedulerMessage m;
    v1::CancelJob* cancel = m.mutable_cancel();
    JobRef::Of(c).To(cancel);
    cancel->set_grace_ms(5000);
    cancel->set_reason("the scheduler no longer runs this job here");
    handler_->OnSchedulerMessage(m);
  }
  v1::SchedulerMessage message;
  while (removed_.empty() && stream->Read(&message)) {
    switch (message.msg_case()) {
      case v1::SchedulerMessage::kRefused:
        // This worker was removed (Register.leaves_when_removed): final.
        removed_ = message.refused();
        if (removed_.empty()) removed_ = "removed";
        break;
      case v1::SchedulerMessage::kDiaryAck: {
        absl::MutexLock lock(&mu_);
        outbox_.AckDiary(JobRef::Of(message.diary_ack()),
                         message.diary_ack().seq());
        break;
      }
      case v1::SchedulerMessage::kEndedAck: {
        bool held;
        {
          absl::MutexLock lock(&mu_);
          held = outbox_.AckEnded(JobRef::Of(message.ended_ack()));
        }
        if (held) handler_->OnSchedulerMessage(message);
        break;
      }
      case v1::SchedulerMessage::kUserQuery: {
        const std::string& user = message.user_query().user();
        v1::WorkerMessage answer;
        answer.mutable_user_answer()->set_user(user);
        answer.mutable_user_answer()->set_known(options_.knows_user
                                                    ? options_.knows_user(user)
                                                    : user == options_.user);
        absl::MutexLock lock(&mu_);
        answers_.push_back(std::move(answer));
        break;
      }
      default:
        handler_->OnSchedulerMessage(message);
    }
  }
  Detach(stream.get());
  absl::Status result = stream->Finish();
  if (!removed_.empty()) return absl::OkStatus();  // Run() leaves
  // A registered session that broke is a transient failure whatever its
  // code; reconnect at once.
  spdlog::warn("the stream to {} broke: {}", options_.scheduler,
               result.ok() ? "closed by the scheduler" : result.ToString());
  return absl::OkStatus();
}

void SchedulerLink::Detach(LinkStream* stream) {
  stream->Cancel();  // unblocks a write in progress
  absl::MutexLock lock(&mu_);
  stream_ = nullptr;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_; };
  mu_.Await(absl::Condition(&idle));
}

void SchedulerLink::SendLoop() {
  // Only this thread reads or sets these.
  int64_t last_write_ms = 0;
  int64_t last_gpus_ms = 0;
  // The stream last given GPU readings: a new session gets them at once
  // (the scheduler forgot the last ones when the old one ended).
  const LinkStream* gpus_sent_on = nullptr;
  for (;;) {
    std::vector<v1::WorkerMessage> out;
    LinkStream* stream;
    bool beat = false;
    bool read_gpus = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ ||
               (stream_ != nullptr && (outbox_.HasDue() || !answers_.empty()));
      };
      int64_t wait_ms = heartbeat_ms_;
      if (options_.read_gpus)
        wait_ms = std::min(wait_ms, options_.gpu_report_ms);
      mu_.AwaitWithTimeout(absl::Condition(&ready),
                           absl::Milliseconds(wait_ms));
      if (stopping_) return;
      if (stream_ == nullptr) continue;
      out.swap(answers_);
      for (auto& m : outbox_.TakeDue()) out.push_back(std::move(m));
      const int64_t now = clock_->MonotonicMs();
      read_gpus =
          options_.read_gpus && (stream_ != gpus_sent_on ||
                                 now - last_gpus_ms >= options_.gpu_report_ms);
      beat = out.empty() && now - last_write_ms >= heartbeat_ms_;
      if (out.empty() && !beat && !read_gpus) continue;
      if (read_gpus) {
        gpus_sent_on = stream_;
        last_gpus_ms = now;
      }
      stream = stream_;
      writing_ = true;
    }
    // NVML is read without the lock (Detach() waits for it, as for a
    // write); its readings ride on a heartbeat of their own.
    std::vector<v1::GpuReading> gpus;
    if (read_gpus) gpus = options_.read_gpus();
    if (beat || !gpus.empty()) {
      v1::WorkerMessage m;
      m.mutable_heartbeat()->set_time_ms(clock_->NowMs());
      for (auto& g : gpus) *m.mutable_heartbeat()->add_gpus() = std::move(g);
      out.push_back(std::move(m));
    }
    if (!out.empty()) last_write_ms = clock_->MonotonicMs();
    // Written without the lock; Detach() waits for this to finish. A failed
    // write ends the session, and the next one sends everything again.
    for (const auto& m : out) {
      if (!stream->Write(m)) break;
    }
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }
}

}  // namespace dlbatch::worker
