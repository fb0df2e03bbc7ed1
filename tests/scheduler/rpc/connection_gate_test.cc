// The gate on connections that have not authenticated: the oldest goes past
// the limit, all go past the deadline, authenticated ones stay; connections
// are known by their calls' peer names. Real sockets, a fake clock.
#include "scheduler/rpc/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::scheduler {
namespace {

// One connection: the end the gate watches and the peer's end.
struct Conn {
  int server = -1;
  int peer = -1;
};

Conn Connect() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return Conn{fds[0], fds[1]};
}

// True when the peer sees its connection shut down (EOF), within 1 s.
bool PeerSeesEnd(int peer) {
  struct pollfd p = {peer, POLLIN, 0};
  if (::poll(&p, 1, 1000) != 1) return false;
  char c;
  return ::recv(peer, &c, 1, MSG_DONTWAIT) == 0;
}

bool PeerStillOpen(int peer) {
  struct pollfd p = {peer, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

// The gate knows a connection by the name its calls give their peer.
std::string Peer(const Conn& c) {
  return absl::StrCat("ipv4:10.0.0.1:", 40000 + c.server);
}

class ConnectionGateTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const Conn& c : conns_) {
      ::close(c.server);
      ::close(c.peer);
    }
  }
  Conn Add() {
    conns_.push_back(Connect());
    return conns_.back();
  }
  FakeClock clock_;
  std::vector<Conn> conns_;
};

TEST_F(ConnectionGateTest, PastTheLimitTheOldestWaitingConnectionIsShut) {
  ConnectionGate gate(2, 10000, &clock_);
  Conn a = Add(), b = Add(), c = Add();
  ASSERT_TRUE(gate.Admit(a.server, Peer(a)));
  clock_.Advance(1);
  ASSERT_TRUE(gate.Admit(b.server, Peer(b)));
  gate.Authenticated(Peer(b));  // b is not waiting any more
  clock_.Advance(1);
  ASSERT_TRUE(gate.Admit(c.server, Peer(c)));
  EXPECT_EQ(gate.pending(), 2);
  Conn d = Add();
  ASSERT_TRUE(gate.Admit(d.server, Peer(d)));  // a, the oldest waiting, goes
  EXPECT_TRUE(PeerSeesEnd(a.peer));
  EXPECT_TRUE(PeerStillOpen(b.peer));
  EXPECT_TRUE(PeerStillOpen(c.peer));
  EXPECT_TRUE(PeerStillOpen(d.peer));
  EXPECT_EQ(gate.pending(), 2);
  EXPECT_EQ(gate.shut_down(), 1);
}

TEST_F(ConnectionGateTest, PastTheDeadlineOnlyUnauthenticatedOnesAreShut) {
  ConnectionGate gate(100, 10000, &clock_);
  Conn quiet = Add(), talker = Add(), late = Add();
  ASSERT_TRUE(gate.Admit(quiet.server, Peer(quiet)));
  ASSERT_TRUE(gate.Admit(talker.server, Peer(talker)));
  clock_.Advance(5000);
  ASSERT_TRUE(gate.Admit(late.server, Peer(late)));
  gate.Authenticated(Peer(talker));
  EXPECT_EQ(gate.Sweep(), 0);
  clock_.Advance(5000);
  EXPECT_EQ(gate.Sweep(), 1);
  EXPECT_TRUE(PeerSeesEnd(quiet.peer));
  EXPECT_TRUE(PeerStillOpen(talker.peer));
  EXPECT_TRUE(PeerStillOpen(late.peer));
  clock_.Advance(5000);
  EXPECT_EQ(gate.Sweep(), 1);
  EXPECT_TRUE(PeerSeesEnd(late.peer));
  EXPECT_TRUE(PeerStillOpen(talker.peer));
  EXPECT_EQ(gate.pending(), 0);
}

TEST_F(ConnectionGateTest, ANameAdmittedAgainShutsTheConnectionWaitingUnderIt) {
  // One client address and port to two addresses of this machine: two live
  // connections with one name. The older is shut rather than left unwatched.
  ConnectionGate gate(100, 10000, &clock_);
  Conn first = Add(), second = Add();
  ASSERT_TRUE(gate.Admit(first.server, "ipv4:10.0.0.1:40000"));
  clock_.Advance(6000);
  ASSERT_TRUE(gate.Admit(second.server, "ipv4:10.0.0.1:40000"));
  EXPECT_TRUE(PeerSeesEnd(first.peer));
  EXPECT_TRUE(PeerStillOpen(second.peer));
  EXPECT_EQ(gate.pending(), 1);
  EXPECT_EQ(gate.shut_down(), 1);
  // The first one's deadline is not the second's.
  clock_.Advance(6000);
  EXPECT_EQ(gate.Sweep(), 0);
  EXPECT_TRUE(PeerStillOpen(second.peer));
  clock_.Advance(6000);
  EXPECT_EQ(gate.Sweep(), 1);
  EXPECT_TRUE(PeerSeesEnd(second.peer));
}

TEST_F(ConnectionGateTest, AnIpv6PeerIsKnownPercentEncodedOrNot) {
  // gRPC 1.51 writes an IPv6 peer with its brackets percent-encoded.
  ConnectionGate gate(100, 10000, &clock_);
  Conn a = Add(), b = Add();
  ASSERT_TRUE(gate.Admit(a.server, "ipv6:[::1]:40000"));
  ASSERT_TRUE(gate.Admit(b.server, "ipv6:[fe80::1%2]:40001"));
  gate.Authenticated("ipv6:%5B::1%5D:40000");
  EXPECT_EQ(gate.pending(), 1);
  gate.Authenticated("ipv6:%5Bfe80::1%252%5D:40001");
  EXPECT_EQ(gate.pending(), 0);
  clock_.Advance(20000);
  EXPECT_EQ(gate.Sweep(), 0);
  EXPECT_TRUE(PeerStillOpen(a.peer));
  EXPECT_TRUE(PeerStillOpen(b.peer));
  EXPECT_EQ(PercentDecoded("ipv6:%5B::1%5D:1%"), "ipv6:[::1]:1%");
  EXPECT_EQ(PercentDecoded("%zz%4"), "%zz%4");
}

TEST_F(ConnectionGateTest, TcpPeerNameIsTheNameGrpcGivesIt) {
  // A real loopback TCP connection, as the acceptor names it; gRPC names
  // it the same (the TLS integration tests check that end).
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr),
            0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr),
            0);
  int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  struct sockaddr_in mine = {};
  len = sizeof mine;
  ::getsockname(client, reinterpret_cast<sockaddr*>(&mine), &len);
  EXPECT_EQ(TcpPeerName(accepted),
            absl::StrCat("ipv4:127.0.0.1:", ntohs(mine.sin_port)));
  EXPECT_EQ(TcpPeerName(listener), "");  // no peer
  ::close(accepted);
  ::close(client);
  ::close(listener);
}

TEST_F(ConnectionGateTest, PeersItNeverAdmittedAreIgnored) {
  ConnectionGate gate(100, 10000, &clock_);
  Conn a = Add();
  ASSERT_TRUE(gate.Admit(a.server, Peer(a)));
  for (const char* peer : {"unix:/run/dlbatch.sock", "fd:", "fd:x", "fd:99999",
                           "ipv4:127.0.0.1:5", "ipv4:10.0.0.1:4", "%", ""}) {
    gate.Authenticated(peer);
  }
  EXPECT_EQ(gate.pending(), 1);
}

}  // namespace
}  // namespace dlbatch::scheduler
