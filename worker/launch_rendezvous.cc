#include "worker/launch_rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch::worker {
namespace {

constexpr absl::Duration kSlice = absl::Seconds(5);
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);
constexpr char kPortKey[] = "launch/master_port";

std::string HostKey(int part) { return absl::StrCat("launch/host/", part); }

class Meeting {
 public:
  Meeting(const MeetingPlace& place, std::unique_ptr<v1::Scheduler::Stub> stub)
      : place_(place), stub_(std::move(stub)) {}

  absl::Status Set(const std::string& key, const std::string& value,
                   absl::Time deadline) {
    v1::RendezvousSetRequest request;
    request.set_job_id(place_.job_id);
    request.set_attempt(place_.attempt);
    request.set_secret(place_.secret);
    request.set_key(key);
    request.set_value(value);
    for (;;) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::RendezvousSetReply reply;
      absl::Status s =
          FromGrpcStatus(stub_->RendezvousSet(&context, request, &reply));
      // A scheduler that is restarting is waited for.
      if (s.code() != absl::StatusCode::kUnavailable || absl::Now() > deadline)
        return Annotate(s, Where("setting", key));
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(kRetryPause));
    }
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) {
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
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + wait + absl::Seconds(10)));
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
        absl::StrCat(Where("waiting for", key),
                     ": it did not appear in time; the part that sets it most "
                     "likely never started"));
  }

 private:
  std::string Where(const char* doing, const std::string& key) const {
    return absl::StrCat(doing, " rendezvous key '", key, "' at the scheduler ",
                        place_.address);
  }

  const MeetingPlace& place_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

}  // namespace

absl::StatusOr<int> FreeTcpPort() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool v6 = fd >= 0;
  const int s = v6 ? fd : ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ErrnoStatus(errno, "socket", "finding a free port");
  int bound;
  if (v6) {
    int off = 0;  // every IPv4 address too
    ::setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    bound = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    bound = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  sockaddr_storage got{};
  socklen_t len = sizeof(got);
  if (bound != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&got), &len) != 0) {
    const int err = errno;
    ::close(s);
    return ErrnoStatus(err, "bind", "finding a free port");
  }
  ::close(s);
  return v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port)
            : ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
}

absl::StatusOr<PartsMet> MeetParts(const MeetingPlace& place, int part,
                                   int parts, const std::string& host,
                                   absl::Duration timeout) {
  ChannelConfig channel;
  ASSIGN_OR_RETURN(channel.endpoint, ParseEndpoint(place.address));
  if (!place.ca_pem.empty()) {
    channel.ca_pem = place.ca_pem;
    channel.ca_file = "the worker's CA";
  }
  Meeting meeting(place, v1::Scheduler::NewStub(MakeChannel(channel)));
  const absl::Time deadline = absl::Now() + timeout;
  PartsMet met;
  if (part == 0) {
    ASSIGN_OR_RETURN(met.master_port, FreeTcpPort());
    RETURN_IF_ERROR(
        meeting.Set(kPortKey, absl::StrCat(met.master_port), deadline));
  }
  RETURN_IF_ERROR(meeting.Set(HostKey(part), host, deadline));
  for (int p = 0; p < parts; ++p) {
    if (p == part) {
      met.hosts.push_back(host);
      continue;
    }
    ASSIGN_OR_RETURN(std::string h, meeting.Get(HostKey(p), deadline));
    met.hosts.push_back(std::move(h));
  }
  if (part != 0) {
    ASSIGN_OR_RETURN(std::string port, meeting.Get(kPortKey, deadline));
    if (!absl::SimpleAtoi(port, &met.master_port) || met.master_port < 1 ||
        met.master_port > 65535) {
      return absl::InternalError(
          absl::StrCat("part 0 gave the master port '", port, "'"));
    }
  }
  return met;
}

}  // namespace dlbatch::worker
