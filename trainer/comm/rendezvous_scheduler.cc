// The scheduler's rendezvous: Set and Get as gRPC calls. A Get waits on the
// scheduler in slices (it holds a call at most 10 s) until the caller's
// timeout, so a rank that never arrives is reported by key.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/endpoint.h"
#include "common/status.h"
#include "common/tls_client.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {
namespace {

constexpr absl::Duration kSlice = absl::Seconds(5);
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);

class SchedulerRendezvous final : public Rendezvous {
 public:
  SchedulerRendezvous(SchedulerRendezvousConfig config,
                      std::unique_ptr<v1::Scheduler::Stub> stub)
      : config_(std::move(config)), stub_(std::move(stub)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    v1::RendezvousSetRequest request;
    request.set_job_id(config_.job_id);
    request.set_attempt(config_.attempt);
    request.set_secret(config_.secret);
    request.set_key(key);
    request.set_value(value);
    absl::Status last;
    // A scheduler that is restarting is waited for a while.
    for (int tries = 0; tries < 50; ++tries) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::RendezvousSetReply reply;
      last = FromGrpcStatus(stub_->RendezvousSet(&context, request, &reply));
      if (last.code() != absl::StatusCode::kUnavailable) break;
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(kRetryPause));
    }
    return Annotate(last, absl::StrCat("setting rendezvous key '", key,
                                       "' at the scheduler ", config_.address));
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    v1::RendezvousGetRequest request;
    request.set_job_id(config_.job_id);
    request.set_attempt(config_.attempt);
    request.set_secret(config_.secret);
    request.set_key(key);
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      const absl::Duration wait = std::min(left, kSlice);
      request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + wait + absl::Seconds(10)));
      v1::RendezvousGetReply reply;
      absl::Status s =
          FromGrpcStatus(stub_->RendezvousGet(&context, request, &reply));
      if (s.ok()) return std::move(*reply.mutable_value());
      if (s.code() == absl::StatusCode::kUnavailable) {
        std::this_thread::sleep_for(absl::ToChronoMilliseconds(kRetryPause));
        continue;
      }
      if (s.code() != absl::StatusCode::kNotFound) {
        return Annotate(s,
                        absl::StrCat("reading rendezvous key '", key,
                                     "' at the scheduler ", config_.address));
      }
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous key '", key, "' did not appear at the scheduler within ",
        absl::FormatDuration(timeout),
        "; a rank of this job most likely never started"));
  }

 private:
  const SchedulerRendezvousConfig config_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> OpenSchedulerRendezvous(
    const SchedulerRendezvousConfig& config) {
  ChannelConfig channel;
  ASSIGN_OR_RETURN(channel.endpoint, ParseEndpoint(config.address));
  // Over TCP (always TLS) the worker hands over the CA it trusts.
  if (const char* ca = std::getenv(kRendezvousCaEnv); ca != nullptr) {
    channel.ca_pem = ca;
    channel.ca_file = kRendezvousCaEnv;
  }
  std::unique_ptr<v1::Scheduler::Stub> stub =
      v1::Scheduler::NewStub(MakeChannel(channel));
  return std::unique_ptr<Rendezvous>(
      new SchedulerRendezvous(config, std::move(stub)));
}

}  // namespace dlbatch::trainer
