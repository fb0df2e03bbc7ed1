// Per-user limits and fair-share usage through the real CLI and scheduler:
// `dlbatch admin limit set|list` and `dlbatch admin usage`, for admins only
// (nobody is played with setpriv on the world-connectable socket), kept in
// the store across a restart.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;

class LimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
    c_.StartScheduler({"--socket-mode", "0666"});
    c_.StartWorker("w1", 4);
    ASSERT_TRUE(c_.WaitWorkers(1));
  }
  Result Nobody(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups"};
    for (const std::string& a : c_.CliArgv(args)) argv.push_back(a);
    return Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
  }
  void Restart() {
    c_.KillScheduler(SIGKILL);
    c_.StartScheduler();
    ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
  }
  std::string WaitReason(int64_t id) {
    return c_.ShowJson(id).value("wait_reason", "");
  }
  // root's decayed usage in slot-seconds, per `dlbatch admin usage --json`.
  double RootUsage() {
    Result r = c_.Cli({"admin", "usage", "--json"});
    EXPECT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    if (!j.is_object() || !j.contains("users")) return -1;
    for (const auto& u : j["users"]) {
      if (u.value("user", "") == "root") return u.value("slot_seconds", 0.0);
    }
    return -1;
  }

  Cluster c_;
};

TEST_F(LimitsTest, TheThirdJobWaitsAtTwoSlotsAndLimitsSurviveARestart) {
  Result set = c_.Cli({"admin", "limit", "set", "root", "--profile", "local",
                       "--slots", "2", "--queued", "1"});
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_EQ(set.out, "root on 'local': slots 2, queued 1\n");
  const std::string sleep =
      c_.JobFile("sleep.yaml", "command: [sleep, '300']\n");
  const int64_t a = c_.Submit(sleep);
  const int64_t b = c_.Submit(sleep);
  ASSERT_TRUE(c_.WaitState(a, "JOB_STATE_RUNNING")) << c_.Logs();
  ASSERT_TRUE(c_.WaitState(b, "JOB_STATE_RUNNING")) << c_.Logs();
  const int64_t third = c_.Submit(sleep);
  const std::string held = "waiting: root holds 2 of their 2 slots on 'local'";
  ASSERT_TRUE(WaitFor([&] { return WaitReason(third) == held; }, 5000))
      << WaitReason(third);
  EXPECT_EQ(c_.State(third), "JOB_STATE_QUEUED");  // 2 of 4 slots are free
  // One queued job at most: a fourth is refused, saying the limit.
  Result over = c_.Cli({"submit", "-q", sleep});
  EXPECT_NE(over.code, 0) << over.out;
  EXPECT_NE(over.err.find("root has 1 of their 1 queued jobs on 'local'"), npos)
      << over.err;

  Restart();
  Result list = c_.Cli({"admin", "limit", "list", "--json"});
  ASSERT_EQ(list.code, 0) << list.err;
  const nlohmann::json limits = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(limits.is_object() && limits.contains("limits")) << list.out;
  ASSERT_EQ(limits["limits"].size(), 1u) << list.out;
  EXPECT_EQ(limits["limits"][0].value("user", ""), "root");
  EXPECT_EQ(limits["limits"][0].value("profile", ""), "local");
  EXPECT_EQ(limits["limits"][0].value("max_slots", 0), 2);
  EXPECT_EQ(limits["limits"][0].value("max_queued", 0), 1);
  Result table = c_.Cli({"admin", "limit", "list"});
  EXPECT_NE(table.out.find("USER"), npos) << table.out;
  EXPECT_NE(table.out.find("root"), npos) << table.out;
  ASSERT_TRUE(WaitFor([&] { return WaitReason(third) == held; }, 10000))
      << WaitReason(third);
  over = c_.Cli({"submit", "-q", sleep});
  EXPECT_NE(over.code, 0) << over.out;
  EXPECT_NE(over.err.find("queued jobs on 'local'"), npos) << over.err;

  // 0 removes the slot limit (the queued one stays): the third starts.
  set = c_.Cli(
      {"admin", "limit", "set", "root", "--profile", "local", "--slots", "0"});
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_EQ(set.out, "root on 'local': slots -, queued 1\n");
  EXPECT_TRUE(c_.WaitState(third, "JOB_STATE_RUNNING")) << WaitReason(third);
  set = c_.Cli(
      {"admin", "limit", "set", "root", "--profile", "local", "--clear"});
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_EQ(c_.Cli({"admin", "limit", "list"}).out, "no limits are set\n");
}

TEST_F(LimitsTest, UsageSurvivesARestart) {
  const int64_t id = c_.Submit(
      c_.JobFile("short.yaml", "command: [sleep, '1']\n"), {"--pool", "2"});
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  const double before = RootUsage();
  EXPECT_GE(before, 1.9);  // two slots for at least a second
  EXPECT_LT(before, 30);
  Result human = c_.Cli({"admin", "usage"});
  EXPECT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("half-life of 7d"), npos) << human.out;
  EXPECT_NE(human.out.find("100.0%"), npos) << human.out;
  Restart();
  const double after = RootUsage();
  // Decay over a few seconds with a 7-day half-life, and whole slot-ms.
  EXPECT_NEAR(after, before, 0.01) << "before " << before;
}

// Fair share across a restart: root used the cluster before it, so
// nobody's job, submitted after root's next one, starts first. (Without the
// stored usage, root would count as having used nothing, and go first.)
TEST_F(LimitsTest, FairShareRemembersUsageAcrossARestart) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run the CLI as another user (setpriv)";
  }
  const int64_t used = c_.Submit(
      c_.JobFile("used.yaml", "command: [sleep, '2']\n"), {"--pool", "4"});
  ASSERT_TRUE(c_.WaitState(used, "JOB_STATE_FINISHED")) << c_.Logs();
  Restart();
  // nobody holds every slot for a second (less than root's two).
  const std::string hold = c_.JobFile("hold.yaml", "command: [sleep, '1']\n");
  ASSERT_EQ(chmod(hold.c_str(), 0644), 0);
  Result r = Nobody({"submit", "-q", "--pool", "4", hold});
  ASSERT_EQ(r.code, 0) << r.err;
  const int64_t held = std::stoll(r.out);
  ASSERT_TRUE(c_.WaitState(held, "JOB_STATE_RUNNING")) << c_.Logs();
  const std::string quick = c_.JobFile("quick.yaml", "command: [true]\n");
  ASSERT_EQ(chmod(quick.c_str(), 0644), 0);
  const int64_t roots = c_.Submit(quick, {"--pool", "4"});
  r = Nobody({"submit", "-q", "--pool", "4", quick});
  ASSERT_EQ(r.code, 0) << r.err;
  const int64_t theirs = std::stoll(r.out);
  ASSERT_TRUE(c_.WaitState(roots, "JOB_STATE_FINISHED")) << c_.Logs();
  ASSERT_TRUE(c_.WaitState(theirs, "JOB_STATE_FINISHED")) << c_.Logs();
  // RFC 3339 in UTC with milliseconds: ordered as text.
  const std::string root_start = c_.ShowJson(roots).value("start_time", "");
  const std::string their_start = c_.ShowJson(theirs).value("start_time", "");
  EXPECT_LT(their_start, root_start)
      << "nobody's job " << theirs << " should start before root's " << roots;
}

TEST_F(LimitsTest, OnlyAnAdminSetsLimitsOrReadsUsage) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run the CLI as another user (setpriv)";
  }
  Result set = Nobody({"admin", "limit", "set", "nobody", "--profile", "local",
                       "--slots", "100"});
  EXPECT_NE(set.code, 0) << set.out;
  EXPECT_NE(set.err.find("permission denied: setting limits is for admins"),
            npos)
      << set.err;
  Result list = Nobody({"admin", "limit", "list"});
  EXPECT_NE(list.code, 0);
  EXPECT_NE(list.err.find("permission denied"), npos) << list.err;
  Result usage = Nobody({"admin", "usage"});
  EXPECT_NE(usage.code, 0);
  EXPECT_NE(usage.err.find("permission denied"), npos) << usage.err;
  EXPECT_EQ(c_.Cli({"admin", "limit", "list"}).out, "no limits are set\n");
  // Bad input from an admin: said what to change, nothing set.
  Result profile = c_.Cli(
      {"admin", "limit", "set", "root", "--profile", "nope", "--slots", "1"});
  EXPECT_NE(profile.code, 0);
  EXPECT_NE(profile.err.find("unknown profile 'nope'; known profiles: local"),
            npos)
      << profile.err;
  Result nothing =
      c_.Cli({"admin", "limit", "set", "root", "--profile", "local"});
  EXPECT_NE(nothing.code, 0);
  EXPECT_NE(nothing.err.find("say which limit to set"), npos) << nothing.err;
  EXPECT_EQ(c_.Cli({"admin", "limit", "list"}).out, "no limits are set\n");
}

}  // namespace
}  // namespace dlbatch::testing
