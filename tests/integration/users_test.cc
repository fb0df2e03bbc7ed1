// Several users on one scheduler's Unix socket: who calls is what the kernel
// says, never what the client claims; a user reaches only their own jobs;
// only admins (root, the scheduler's user) register workers or purge.
// Other users are played with `setpriv` as nobody (65534).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr char kNobody[] = "nobody";

class UsersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root to run the CLI as another user (setpriv)";
    }
    // nobody must reach the socket: the folder is passable, the socket
    // world-connectable, the state folder stays 0700.
    ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
    c_.StartScheduler(ExtraFlags());
    c_.StartWorker("w1", 2);
    ASSERT_TRUE(c_.WaitWorkers(1));
  }
  virtual std::vector<std::string> ExtraFlags() {
    return {"--socket-mode", "0666"};
  }

  // The CLI as nobody; `as_root_claim`: with a shim that makes it believe
  // it is root.
  Result Nobody(const std::vector<std::string>& args,
                bool as_root_claim = false) {
    std::vector<std::string> argv = {"setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups"};
    for (const std::string& a : c_.CliArgv(args)) argv.push_back(a);
    std::map<std::string, std::string> env = {{"HOME", "/tmp"},
                                              {"XDG_STATE_HOME", "/tmp"}};
    if (as_root_claim) env["LD_PRELOAD"] = BinDir() + "/libroot_shim.so";
    return Exec(argv, env, 60000);
  }
  int64_t SubmitAsNobody(const std::string& yaml, bool as_root_claim = false) {
    const std::string file = c_.JobFile("nobody.yaml", yaml);
    EXPECT_EQ(chmod(file.c_str(), 0644), 0);
    Result r = Nobody({"submit", "-q", file}, as_root_claim);
    EXPECT_EQ(r.code, 0) << r.out << r.err << c_.Logs();
    return r.code == 0 ? std::stoll(r.out) : -1;
  }

  Cluster c_;
};

TEST_F(UsersTest, TheCallerIsWhoTheKernelSaysNotWhatTheClientClaims) {
  const int64_t id = SubmitAsNobody("command: [echo, hi]\n",
                                    /*as_root_claim=*/true);
  ASSERT_GT(id, 0);
  EXPECT_EQ(c_.ShowJson(id).value("user", ""), kNobody);
  // The shim works: a program run as nobody with it believes it is root,
  // so without the scheduler's own word the job would have been root's.
  Result id_u = Exec({"setpriv", "--reuid=65534", "--regid=65534",
                      "--clear-groups", "id", "-un"},
                     {{"LD_PRELOAD", BinDir() + "/libroot_shim.so"}});
  EXPECT_EQ(id_u.out, "root\n") << id_u.err;
}

TEST_F(UsersTest, AUserReachesOnlyTheirOwnJobsAndAnAdminReachesAll) {
  const int64_t root_job =
      c_.Submit(c_.JobFile("root.yaml",
                           "env: {SECRET: hunter2}\n"
                           "command: [sh, -c, 'echo root-diary; echo kept > "
                           "$DLBATCH_OUTPUT_DIR/out.txt; sleep 300']\n"));
  ASSERT_TRUE(c_.WaitState(root_job, "JOB_STATE_RUNNING")) << c_.Logs();
  const std::string id = std::to_string(root_job);
  const std::string denied =
      "permission denied: job " + id + " belongs to root";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"show", id}, {"diary", id}, {"fetch-outputs", "--list", id}}) {
    Result r = Nobody(args);
    EXPECT_NE(r.code, 0) << args[0] << ": " << r.out;
    EXPECT_NE(r.err.find(denied), std::string::npos)
        << args[0] << ": " << r.err;
    EXPECT_EQ(r.out.find("root-diary"), std::string::npos);
  }
  Result cancel = Nobody({"cancel", id});
  EXPECT_NE(cancel.code, 0);
  EXPECT_NE(cancel.err.find(denied), std::string::npos) << cancel.err;
  EXPECT_EQ(c_.State(root_job), "JOB_STATE_RUNNING");
  // `jobs` shows everyone's states, never another's env:.
  Result jobs = Nobody({"jobs", "--json"});
  EXPECT_EQ(jobs.code, 0) << jobs.err;
  EXPECT_NE(jobs.out.find("\"id\": " + id + ","), std::string::npos)
      << jobs.out;
  EXPECT_EQ(jobs.out.find("hunter2"), std::string::npos) << jobs.out;
  Result purge = Nobody({"admin", "purge", "--before", "1s"});
  EXPECT_NE(purge.code, 0);
  EXPECT_NE(purge.err.find("permission denied"), std::string::npos)
      << purge.err;

  // Their own job they reach; root, an admin, reaches it too.
  const int64_t own = SubmitAsNobody("command: [sleep, '300']\n");
  ASSERT_GT(own, 0);
  Result shown = Nobody({"show", std::to_string(own)});
  EXPECT_EQ(shown.code, 0) << shown.err;
  Result cancelled = c_.Cli({"cancel", std::to_string(own)});
  EXPECT_EQ(cancelled.code, 0) << cancelled.err;
  EXPECT_TRUE(c_.WaitState(own, "JOB_STATE_CANCELLED"));
  Result root_cancels = c_.Cli({"cancel", id});
  EXPECT_EQ(root_cancels.code, 0) << root_cancels.err;
}

TEST_F(UsersTest, AJobRunsAsItsOwnerAndReachesNothingOfTheCluster) {
  const std::string state = c_.scheduler_state();
  const int64_t id = SubmitAsNobody(
      "command: [sh, -c, 'id -u; id -g; echo HOME=$HOME USER=$USER; stat -c "
      "%U:%a .; ls " +
      state + "; cat " + state + "/dlbatch.db | head -c 15; true']\n");
  ASSERT_GT(id, 0);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  const std::string diary = c_.Cli({"diary", std::to_string(id)}).out;
  EXPECT_NE(diary.find("65534\n65534\n"), std::string::npos) << diary;
  EXPECT_NE(diary.find("USER=nobody"), std::string::npos) << diary;
  EXPECT_NE(diary.find("nobody:700"), std::string::npos) << diary;
  EXPECT_NE(diary.find("Permission denied"), std::string::npos) << diary;
  EXPECT_EQ(diary.find("SQLite format"), std::string::npos) << diary;
  // A job of root's still runs as root.
  const int64_t mine = c_.Submit(c_.JobFile("id.yaml", "command: [id, -u]\n"));
  ASSERT_TRUE(c_.WaitState(mine, "JOB_STATE_FINISHED"));
  EXPECT_EQ(c_.Cli({"diary", std::to_string(mine)}).out, "0\n");
}

TEST_F(UsersTest, OnlyAnAdminRegistersAWorker) {
  Result r =
      Exec({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            "timeout", "3", BinDir() + "/dlbatch-worker", "--scheduler",
            c_.address(), "--name", "w1", "--work-dir",
            "/tmp/dlbatch-nobody-worker-" + std::to_string(getpid()),
            "--cpu-slots", "1", "--no-cgroups"},
           {{"HOME", "/tmp"}}, 20000);
  EXPECT_NE((r.out + r.err).find("may not register a worker"),
            std::string::npos)
      << r.out << r.err;
  // The real w1 is still the one registered, online.
  Result workers = c_.Cli({"workers"});
  EXPECT_NE(workers.out.find("online"), std::string::npos) << workers.out;
  EXPECT_EQ(workers.out.find("offline"), std::string::npos) << workers.out;
}

class SharedVisibilityTest : public UsersTest {
  std::vector<std::string> ExtraFlags() override {
    return {"--socket-mode", "0666", "--shared-visibility"};
  }
};

TEST_F(SharedVisibilityTest, EveryoneReadsNobodyCancelsAnothersJob) {
  const int64_t root_job = c_.Submit(c_.JobFile(
      "root.yaml",
      "env: {SECRET: hunter2}\ncommand: [sh, -c, 'echo root-diary; sleep "
      "300']\n"));
  ASSERT_TRUE(c_.WaitState(root_job, "JOB_STATE_RUNNING")) << c_.Logs();
  const std::string id = std::to_string(root_job);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Nobody({"diary", id}).out.find("root-diary") !=
               std::string::npos;
      },
      10000));
  Result shown = Nobody({"show", "--json", id});
  EXPECT_EQ(shown.code, 0) << shown.err;
  EXPECT_EQ(shown.out.find("hunter2"), std::string::npos) << shown.out;
  Result cancel = Nobody({"cancel", id});
  EXPECT_NE(cancel.code, 0);
  EXPECT_NE(cancel.err.find("belongs to root"), std::string::npos)
      << cancel.err;
  EXPECT_EQ(c_.State(root_job), "JOB_STATE_RUNNING");
}

// A job starts from a clean environment: nothing of the worker's own
// (its token, an operator's secrets) reaches it but PATH, HOME, USER,
// LOGNAME, LANG and what the operator passes with --job-env; and a job run
// as root cannot have the loader or a shell run code for it.
TEST(JobEnvironment, IsCleanAndCannotInjectIntoRoot) {
  Cluster c;
  c.StartScheduler();
  setenv("DLBATCH_TOKEN", "worker-secret-token", 1);
  setenv("CLOUD_SECRET", "s3cr3t", 1);
  setenv("PASSED_ON", "by-the-operator", 1);
  c.StartWorker("w1", 1, "local", {"--job-env", "PASSED_ON"});
  unsetenv("DLBATCH_TOKEN");
  unsetenv("CLOUD_SECRET");
  unsetenv("PASSED_ON");
  ASSERT_TRUE(c.WaitWorkers(1));
  const int64_t id = c.Submit(
      c.JobFile("env.yaml", "env: {MINE: from-the-job}\ncommand: [env]\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED")) << c.Logs();
  const std::string env = c.Cli({"diary", std::to_string(id)}).out;
  EXPECT_EQ(env.find("worker-secret-token"), std::string::npos) << env;
  EXPECT_EQ(env.find("DLBATCH_TOKEN"), std::string::npos) << env;
  EXPECT_EQ(env.find("s3cr3t"), std::string::npos) << env;
  EXPECT_NE(env.find("PASSED_ON=by-the-operator"), std::string::npos) << env;
  EXPECT_NE(env.find("MINE=from-the-job"), std::string::npos) << env;
  EXPECT_NE(env.find("PATH="), std::string::npos) << env;
  EXPECT_NE(env.find("DLBATCH_JOB_ID=" + std::to_string(id)), std::string::npos)
      << env;

  if (geteuid() != 0)
    GTEST_SKIP() << "the worker runs jobs as root only as root";
  const int64_t inject = c.Submit(c.JobFile(
      "inject.yaml", "env: {LD_PRELOAD: /tmp/evil.so}\ncommand: [true]\n"));
  ASSERT_TRUE(c.WaitState(inject, "JOB_STATE_FAILED")) << c.State(inject);
  const std::string reason = c.ShowJson(inject).value("reason", "");
  EXPECT_NE(reason.find("env: may not set LD_PRELOAD for a job run as root"),
            std::string::npos)
      << reason;
}

}  // namespace
}  // namespace dlbatch::testing
