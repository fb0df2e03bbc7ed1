#include "trainer/comm/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlbatch::trainer {
namespace {

// The address bytes of an AF_INET or AF_INET6 sockaddr; empty otherwise.
std::string AddressBytes(const sockaddr* sa) {
  if (sa == nullptr) return "";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return std::string(reinterpret_cast<const char*>(&in->sin_addr),
                       sizeof in->sin_addr);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    return std::string(reinterpret_cast<const char*>(&in6->sin6_addr),
                       sizeof in6->sin6_addr);
  }
  return "";
}

std::string Numeric(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* at =
      sa->sa_family == AF_INET
          ? static_cast<const void*>(
                &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
          : static_cast<const void*>(
                &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return inet_ntop(sa->sa_family, at, text, sizeof text) != nullptr ? text
                                                                    : "?";
}

// The addresses `host` names, as AddressBytes.
absl::StatusOr<std::vector<std::string>> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rank's address '", host, "' does not resolve: ", gai_strerror(rc),
        "; give the worker --host an address of this machine"));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(found,
                                                           &freeaddrinfo);
  std::vector<std::string> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    std::string bytes = AddressBytes(a->ai_addr);
    if (!bytes.empty()) out.push_back(std::move(bytes));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> InterfaceWithAddress(const std::string& host) {
  absl::StatusOr<std::vector<std::string>> wanted = Resolve(host);
  if (!wanted.ok()) return wanted.status();
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot list this machine's network interfaces: ",
                     std::strerror(errno)));
  }
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> owner(list, &freeifaddrs);
  std::vector<std::string> seen;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    const std::string bytes = AddressBytes(i->ifa_addr);
    if (bytes.empty()) continue;
    for (const std::string& w : *wanted) {
      if (w == bytes) return std::string(i->ifa_name);
    }
    seen.push_back(absl::StrCat(i->ifa_name, " ", Numeric(i->ifa_addr)));
  }
  return absl::NotFoundError(absl::StrCat(
      "no network interface of this machine has the rank's address '", host,
      "' (",
      seen.empty() ? "none has an IP address" : absl::StrJoin(seen, ", "),
      "); give the worker --host one of these"));
}

absl::StatusOr<std::optional<std::string>> NcclSocketInterface(
    const std::string& host, const char* current) {
  if (current != nullptr) return std::optional<std::string>();
  absl::StatusOr<std::vector<std::string>> addresses = Resolve(host);
  if (!addresses.ok()) return addresses.status();
  bool loopback = !addresses->empty();
  for (const std::string& a : *addresses) {
    static const in6_addr kLoop6 = IN6ADDR_LOOPBACK_INIT;
    const bool v4 = a.size() == 4 && static_cast<unsigned char>(a[0]) == 127;
    const bool v6 = a.size() == sizeof kLoop6 &&
                    std::memcmp(a.data(), &kLoop6, sizeof kLoop6) == 0;
    loopback &= v4 || v6;
  }
  if (loopback) return std::optional<std::string>();
  absl::StatusOr<std::string> name = InterfaceWithAddress(host);
  if (!name.ok()) return name.status();
  return std::optional<std::string>(absl::StrCat("=", *name));
}

}  // namespace dlbatch::trainer
