// systemd's readiness protocol: SendNotify reaches path and abstract
// datagram sockets, and the real scheduler started with NOTIFY_SOCKET (as
// systemd starts a Type=notify unit) sends READY=1 with its MAINPID once it
// serves, and STOPPING=1 on SIGTERM.
#include "common/sd_notify.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

// A bound datagram socket as systemd's manager keeps one.
class NotifyListener {
 public:
  // `name`: a path, or '@' and an abstract name.
  explicit NotifyListener(const std::string& name) : name_(name) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    socklen_t len = offsetof(struct sockaddr_un, sun_path) + name.size();
    if (name[0] == '@') {
      addr.sun_path[0] = '\0';
    } else {
      ++len;
    }
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0;
  }
  ~NotifyListener() {
    close(fd_);
    if (name_[0] != '@') unlink(name_.c_str());
  }
  bool bound() const { return bound_; }

  // The next datagram, or "" after `timeout_ms`.
  std::string Receive(int timeout_ms) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return "";
    char buf[4096];
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  std::string name_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(SdNotify, PathAndAbstractSockets) {
  Cluster c;
  NotifyListener path(c.dir() + "/notify.sock");
  ASSERT_TRUE(path.bound());
  ASSERT_TRUE(SendNotify(c.dir() + "/notify.sock", "READY=1").ok());
  EXPECT_EQ(path.Receive(5000), "READY=1");

  const std::string abstract = absl::StrCat("@dlbatch-test-", getpid());
  NotifyListener named(abstract);
  ASSERT_TRUE(named.bound());
  ASSERT_TRUE(SendNotify(abstract, "STATUS=x\nREADY=1").ok());
  EXPECT_EQ(named.Receive(5000), "STATUS=x\nREADY=1");
}

TEST(SdNotify, BadNamesAndNoListenerAreErrors) {
  EXPECT_FALSE(SendNotify("relative.sock", "READY=1").ok());
  EXPECT_FALSE(SendNotify("@", "READY=1").ok());
  EXPECT_FALSE(SendNotify(std::string(200, '/'), "READY=1").ok());
  Cluster c;
  absl::Status s = SendNotify(c.dir() + "/nobody-listens", "READY=1");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nobody-listens"), std::string::npos)
      << s.message();
}

TEST(SdNotify, WithoutNotifySocketNothingIsSent) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(Notify("READY=1").ok());
}

TEST(SdNotify, SchedulerSaysReadyThenStopping) {
  Cluster c;
  const std::string socket = c.dir() + "/notify.sock";
  NotifyListener listener(socket);
  ASSERT_TRUE(listener.bound());
  // The scheduler inherits this process's environment.
  setenv("NOTIFY_SOCKET", socket.c_str(), 1);
  c.StartScheduler();
  unsetenv("NOTIFY_SOCKET");
  const std::string ready = listener.Receive(15000);
  EXPECT_NE(ready.find("READY=1"), std::string::npos) << ready;
  EXPECT_NE(ready.find(absl::StrCat("MAINPID=", c.scheduler_pid())),
            std::string::npos)
      << ready;
  EXPECT_NE(ready.find("STATUS=listening on unix:"), std::string::npos)
      << ready;
  // Ready means serving: the CLI gets an answer at once.
  Result jobs = c.Cli({"jobs"});
  EXPECT_EQ(jobs.code, 0) << jobs.err;
  c.KillScheduler(SIGTERM);
  EXPECT_EQ(listener.Receive(5000), "STOPPING=1");
}

}  // namespace
}  // namespace dlbatch::testing
