// Which interface holds a rank's address, and what NCCL_SOCKET_IFNAME a
// rank of a job spanning machines gets: against this machine's real
// interfaces (getifaddrs), whatever they are.
#include "trainer/comm/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <memory>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

// An IPv4 address of this machine outside 127/8 and its interface, if it
// has one.
std::optional<std::pair<std::string, std::string>> OutsideAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> owner(list, &freeifaddrs);
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr a =
        reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, text, sizeof text);
    return std::make_pair(std::string(text), std::string(i->ifa_name));
  }
  return std::nullopt;
}

// An IPv4 address on no interface of this machine: one of the documentation
// ranges (RFC 5737), which a sandbox may still use, so checked.
std::string AbsentAddress() {
  for (const char* candidate :
       {"192.0.2.77", "198.51.100.77", "203.0.113.77"}) {
    if (!InterfaceWithAddress(candidate).ok()) return candidate;
  }
  return "";
}

TEST(NetInterface, LoopbackIsLo) {
  absl::StatusOr<std::string> lo = InterfaceWithAddress("127.0.0.1");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "lo");
}

TEST(NetInterface, AnAddressOfThisMachineNamesItsInterface) {
  const auto outside = OutsideAddress();
  if (!outside)
    GTEST_SKIP() << "this machine has no IPv4 address outside 127/8";
  absl::StatusOr<std::string> name = InterfaceWithAddress(outside->first);
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(*name, outside->second);
}

TEST(NetInterface, AnAddressOfNoInterfaceListsTheMachinesOnes) {
  const std::string absent = AbsentAddress();
  ASSERT_FALSE(absent.empty()) << "every candidate address is this machine's";
  absl::StatusOr<std::string> none = InterfaceWithAddress(absent);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("'" + absent + "'"));
  EXPECT_THAT(none.status().message(), HasSubstr("lo 127.0.0.1"));
  EXPECT_THAT(none.status().message(), HasSubstr("--host"));

  // (Empty: refused by the resolver at once, with no DNS query.)
  absl::StatusOr<std::string> bad = InterfaceWithAddress("");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("address '' does not resolve"));
}

TEST(NetInterface, NcclFollowsTheRanksAddressOnlyAcrossMachines) {
  // One machine (a worker's ranks meet on loopback): NCCL's own choice.
  for (const char* host : {"127.0.0.1", "::1"}) {
    absl::StatusOr<std::optional<std::string>> one =
        NcclSocketInterface(host, nullptr);
    ASSERT_TRUE(one.ok()) << host << ": " << one.status();
    EXPECT_FALSE(one->has_value()) << host;
  }
  // An address on no interface: the error, before NCCL waits for peers.
  EXPECT_EQ(NcclSocketInterface(AbsentAddress(), nullptr).status().code(),
            absl::StatusCode::kNotFound);

  const auto outside = OutsideAddress();
  if (!outside)
    GTEST_SKIP() << "this machine has no IPv4 address outside 127/8";
  absl::StatusOr<std::optional<std::string>> spread =
      NcclSocketInterface(outside->first, nullptr);
  ASSERT_TRUE(spread.ok()) << spread.status();
  ASSERT_TRUE(spread->has_value());
  EXPECT_EQ(**spread, "=" + outside->second);  // exactly that interface
  // The user's setting wins.
  absl::StatusOr<std::optional<std::string>> set =
      NcclSocketInterface(outside->first, "eth");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_FALSE(set->has_value());
}

}  // namespace
}  // namespace dlbatch::trainer
