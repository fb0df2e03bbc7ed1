#include "worker/launch_rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/rendezvous_client.h"
#include "common/status.h"

namespace dlbatch::worker {
namespace {

constexpr char kPortKey[] = "launch/master_port";

std::string HostKey(int part) { return absl::StrCat("launch/host/", part); }

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
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> meeting,
                   RendezvousClient::Open({.address = place.address,
                                           .ca_pem = place.ca_pem,
                                           .ca_name = "the worker's CA",
                                           .job_id = place.job_id,
                                           .attempt = place.attempt,
                                           .secret = place.secret},
                                          "the part that sets it"));
  const absl::Time deadline = absl::Now() + timeout;
  PartsMet met;
  if (part == 0) {
    ASSIGN_OR_RETURN(met.master_port, FreeTcpPort());
    RETURN_IF_ERROR(
        meeting->Set(kPortKey, absl::StrCat(met.master_port), deadline));
  }
  RETURN_IF_ERROR(meeting->Set(HostKey(part), host, deadline));
  for (int p = 0; p < parts; ++p) {
    if (p == part) {
      met.hosts.push_back(host);
      continue;
    }
    ASSIGN_OR_RETURN(std::string h, meeting->Get(HostKey(p), deadline));
    met.hosts.push_back(std::move(h));
  }
  if (part != 0) {
    ASSIGN_OR_RETURN(std::string port, meeting->Get(kPortKey, deadline));
    if (!absl::SimpleAtoi(port, &met.master_port) || met.master_port < 1 ||
        met.master_port > 65535) {
      return absl::InternalError(
          absl::StrCat("part 0 gave the master port '", port, "'"));
    }
  }
  return met;
}

}  // namespace dlbatch::worker
