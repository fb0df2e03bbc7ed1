#include "common/rendezvous_client.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/endpoint.h"
#include "common/status.h"
#include "common/tls_client.h"

namespace dlbatch {
namespace {

constexpr absl::Duration kSlice = absl::Seconds(5);
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);
// Beyond a call's own wait: how long the scheduler may take to answer it.
constexpr absl::Duration kCallMargin = absl::Seconds(10);

}  // namespace

absl::StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Open(
    RendezvousPlace place, std::string setter) {
  ChannelConfig channel;
  ASSIGN_OR_RETURN(channel.endpoint, ParseEndpoint(place.address));
  if (!place.ca_pem.empty()) {
    channel.ca_pem = place.ca_pem;
    channel.ca_file = place.ca_name;
  }
  std::unique_ptr<v1::Scheduler::Stub> stub =
      v1::Scheduler::NewStub(MakeChannel(channel));
  return std::unique_ptr<RendezvousClient>(new RendezvousClient(
      std::move(place), std::move(setter), std::move(stub)));
}

std::string RendezvousClient::Where(const char* doing,
                                    const std::string& key) const {
  return absl::StrCat(doing, " rendezvous key '", key, "' at the scheduler ",
                      place_.address);
}

absl::Status RendezvousClient::Set(const std::string& key,
                                   const std::string& value,
                                   absl::Time deadline) {
  v1::RendezvousSetRequest request;
  request.set_job_id(place_.job_id);
  request.set_attempt(place_.attempt);
  request.set_secret(place_.secret);
  request.set_key(key);
  request.set_value(value);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallMargin));
    v1::RendezvousSetReply reply;
    absl::Status s =
        FromGrpcStatus(stub_->RendezvousSet(&context, request, &reply));
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() > deadline)
      return Annotate(s, Where("setting", key));
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(kRetryPause));
  }
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& key,
                                                  absl::Time deadline) {
  v1::RendezvousGetRequest request;
  request.set_job_id(place_.job_id);
  request.set_attempt(place_.attempt);
  request.set_secret(place_.secret);
  request.set_key(key);
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    const absl::Duration wait = std::min(left, kSlice);
    request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + wait + kCallMargin));
    v1::RendezvousGetReply reply;
    absl::Status s =
        FromGrpcStatus(stub_->RendezvousGet(&context, request, &reply));
    if (s.ok()) return std::move(*reply.mutable_value());
    if (s.code() == absl::StatusCode::kUnavailable) {
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(kRetryPause));
    } else if (s.code() != absl::StatusCode::kNotFound) {
      return Annotate(s, Where("reading", key));
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat(Where("waiting for", key), ": it did not appear in time; ",
                   setter_, " most likely never started"));
}

}  // namespace dlbatch
