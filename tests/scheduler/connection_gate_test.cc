// The gate on connections that have not authenticated: the oldest goes past
// the limit, all go past the deadline, authenticated ones stay. Real
// sockets, a fake clock.
#include "scheduler/connection_gate.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

std::string Peer(const Conn& c) { return absl::StrCat("fd:", c.server); }

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
  ASSERT_TRUE(gate.Admit(a.server));
  clock_.Advance(1);
  ASSERT_TRUE(gate.Admit(b.server));
  gate.Authenticated(Peer(b));  // b is not waiting any more
  clock_.Advance(1);
  ASSERT_TRUE(gate.Admit(c.server));
  EXPECT_EQ(gate.pending(), 2);
  Conn d = Add();
  ASSERT_TRUE(gate.Admit(d.server));  // a, the oldest waiting, goes
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
  ASSERT_TRUE(gate.Admit(quiet.server));
  ASSERT_TRUE(gate.Admit(talker.server));
  clock_.Advance(5000);
  ASSERT_TRUE(gate.Admit(late.server));
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

TEST_F(ConnectionGateTest, AReusedDescriptorNumberIsANewConnection) {
  ConnectionGate gate(100, 10000, &clock_);
  Conn first = Add();
  const int number = first.server;
  ASSERT_TRUE(gate.Admit(first.server));
  // gRPC closes the connection's descriptor; the next one gets its number.
  ::close(first.server);
  Conn second = Connect();
  if (second.server != number) {
    ASSERT_NE(::dup2(second.server, number), -1);
    ::close(second.server);
    second.server = number;
  }
  conns_.back() = Conn{-1, first.peer};
  conns_.push_back(second);
  clock_.Advance(6000);
  ASSERT_TRUE(gate.Admit(second.server));
  EXPECT_EQ(gate.pending(), 1);
  // The first connection's deadline does not shut the second.
  clock_.Advance(6000);
  EXPECT_EQ(gate.Sweep(), 0);
  EXPECT_TRUE(PeerStillOpen(second.peer));
  // The first connection's socket was let go (its peer sees the end).
  EXPECT_TRUE(PeerSeesEnd(first.peer));
  clock_.Advance(6000);
  EXPECT_EQ(gate.Sweep(), 1);
  EXPECT_TRUE(PeerSeesEnd(second.peer));
}

TEST_F(ConnectionGateTest, PeersItNeverAdmittedAreIgnored) {
  ConnectionGate gate(100, 10000, &clock_);
  Conn a = Add();
  ASSERT_TRUE(gate.Admit(a.server));
  for (const char* peer : {"unix:/run/dlbatch.sock", "fd:", "fd:x", "fd:99999",
                           "ipv4:127.0.0.1:5"}) {
    gate.Authenticated(peer);
  }
  EXPECT_EQ(gate.pending(), 1);
}

}  // namespace
}  // namespace dlbatch::scheduler
