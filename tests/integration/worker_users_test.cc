// Placement knows whose jobs each worker runs: a worker started as root runs
// any user its machine knows (the scheduler asks it), one started as another
// user runs only that user's. The scheduler runs as nobody here, so that a
// worker run as nobody (the scheduler's own user, an admin on its socket)
// may register beside root's; users are played with setpriv.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr int kNobody = 65534;
constexpr auto npos = std::string::npos;

std::vector<std::string> As(int uid) {
  const std::string id = std::to_string(uid);
  return {"/usr/bin/setpriv", "--reuid=" + id, "--regid=" + id,
          "--clear-groups"};
}

class WorkerUsersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root to run the scheduler, a worker and the CLI "
                      "as other users (setpriv)";
    }
    // The scheduler's folder (socket, state) is nobody's.
    ASSERT_EQ(chown(c_.dir().c_str(), kNobody, kNobody), 0);
    ASSERT_EQ(chmod(c_.dir().c_str(), 0755), 0);
    c_.set_scheduler_prefix(As(kNobody));
    c_.StartScheduler({"--socket-mode", "0666"});
    c_.StartWorker("wroot", 1);
    c_.StartWorker("wnobody", 1, "local", {"--no-cgroups"}, As(kNobody));
    ASSERT_TRUE(c_.WaitWorkers(2)) << c_.Logs();
  }

  Result CliAs(int uid, const std::vector<std::string>& args) {
    std::vector<std::string> argv = As(uid);
    for (const std::string& a : c_.CliArgv(args)) argv.push_back(a);
    return Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
  }
  std::string JobFile(const std::string& name, const std::string& yaml) {
    const std::string file = c_.JobFile(name, yaml);
    EXPECT_EQ(chmod(file.c_str(), 0644), 0);
    return file;
  }
  std::string WorkerOf(int64_t id) {
    const nlohmann::json job = c_.ShowJson(id);
    if (!job.contains("placement") || job["placement"].empty()) return "";
    return job["placement"][0].value("worker_name", "");
  }

  Cluster c_;
};

TEST_F(WorkerUsersTest, EachWorkerGetsOnlyJobsOfUsersItRuns) {
  // A user no worker runs (uid 4242 has no account) is refused at submit,
  // each worker named with why.
  Result ghost =
      CliAs(4242, {"submit", "-q", JobFile("ghost.yaml", "command: [true]\n")});
  EXPECT_NE(ghost.code, 0) << ghost.out;
  EXPECT_NE(ghost.err.find("no worker of profile 'local' runs uid4242's jobs"),
            npos)
      << ghost.err;
  EXPECT_NE(ghost.err.find("'wnobody' runs as nobody, so only nobody's jobs"),
            npos)
      << ghost.err;
  EXPECT_NE(ghost.err.find("'wroot' has no user uid4242"), npos) << ghost.err;

  // Root's jobs go to wroot only: the second waits while wnobody is free,
  // and says why.
  const int64_t first =
      c_.Submit(JobFile("sleep.yaml", "command: [sleep, '300']\n"));
  ASSERT_TRUE(c_.WaitState(first, "JOB_STATE_RUNNING")) << c_.Logs();
  EXPECT_EQ(WorkerOf(first), "wroot");
  const int64_t second = c_.Submit(JobFile("id.yaml", "command: [id, -u]\n"));
  std::string reason;
  ASSERT_TRUE(WaitFor(
      [&] {
        reason = c_.ShowJson(second).value("wait_reason", "");
        return !reason.empty();
      },
      5000));
  EXPECT_EQ(c_.State(second), "JOB_STATE_QUEUED");
  EXPECT_NE(reason.find("on the 1 worker that runs root's jobs: 0 free"), npos)
      << reason;
  EXPECT_NE(reason.find("'wnobody' runs as nobody, so only nobody's jobs"),
            npos)
      << reason;
  Result shown = c_.Cli({"show", std::to_string(second)});
  EXPECT_NE(shown.out.find("'wnobody' runs as nobody"), npos) << shown.out;

  // Nobody's job goes to wnobody and runs as nobody.
  Result sub = CliAs(
      kNobody, {"submit", "-q", JobFile("nobody.yaml", "command: [id, -u]\n")});
  ASSERT_EQ(sub.code, 0) << sub.err << c_.Logs();
  const int64_t theirs = std::stoll(sub.out);
  ASSERT_TRUE(c_.WaitState(theirs, "JOB_STATE_FINISHED")) << c_.Logs();
  EXPECT_EQ(WorkerOf(theirs), "wnobody");
  EXPECT_EQ(c_.Cli({"diary", std::to_string(theirs)}).out, "65534\n");
  EXPECT_EQ(c_.State(second), "JOB_STATE_QUEUED");

  // Once root's first job ends, the second starts on wroot, as root.
  Result cancel = c_.Cli({"cancel", std::to_string(first)});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  ASSERT_TRUE(c_.WaitState(second, "JOB_STATE_FINISHED")) << c_.Logs();
  EXPECT_EQ(WorkerOf(second), "wroot");
  EXPECT_EQ(c_.Cli({"diary", std::to_string(second)}).out, "0\n");
}

}  // namespace
}  // namespace dlbatch::testing
