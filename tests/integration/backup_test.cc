// `dlbatch admin backup` and `dlbatch admin status` through the real
// binaries: a backup taken while jobs run, restored into a fresh state
// folder with tar, serves every job, its diary and its outputs, and
// the running job goes on on its reconnected worker.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;

std::string Id(int64_t id) { return std::to_string(id); }

TEST(Backup, ARestoredBackupTakenWhileJobsRunHasEveryJobAndItsOutputs) {
  Cluster c;
  ASSERT_EQ(chmod(c.dir().c_str(), 0711), 0);
  const std::vector<std::string> flags = {"--socket-mode", "0666"};
  c.StartScheduler(flags);
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  const int64_t done = c.Submit(
      c.JobFile("out.yaml",
                "command: [sh, -c, 'echo hello-from-done; echo payload > "
                "$DLBATCH_OUTPUT_DIR/result.txt']\n"));
  ASSERT_TRUE(c.WaitState(done, "JOB_STATE_FINISHED")) << c.Logs();
  const int64_t running = c.Submit(c.JobFile(
      "run.yaml",
      "command: [sh, -c, 'echo started; while :; do sleep 0.2; done']\n"));
  ASSERT_TRUE(c.WaitState(running, "JOB_STATE_RUNNING")) << c.Logs();
  const int64_t queued = c.Submit(
      c.JobFile("wait.yaml", "command: [echo, later]\n"), {"--pool", "2"});
  EXPECT_EQ(c.State(queued), "JOB_STATE_QUEUED");

  // Only admins take backups.
  const std::string file = c.dir() + "/backup.tar";
  std::vector<std::string> argv = {"setpriv", "--reuid=65534", "--regid=65534",
                                   "--clear-groups"};
  for (const std::string& a : c.CliArgv({"admin", "backup", "/tmp/x.tar"}))
    argv.push_back(a);
  Result other =
      Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.err.find("permission denied: backing up is for admins"), npos)
      << other.err;

  // Taken while a job runs and writes its diary.
  Result backup = c.Cli({"admin", "backup", file});
  ASSERT_EQ(backup.code, 0) << backup.err << c.Logs();
  EXPECT_NE(backup.out.find("backed up 3 jobs and 1 stored file to " + file),
            npos)
      << backup.out;
  struct stat st;
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // An existing file is kept unless --force.
  Result again = c.Cli({"admin", "backup", file});
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("exists; name another file, or pass --force"), npos)
      << again.err;
  EXPECT_EQ(c.Cli({"admin", "backup", "--force", file}).code, 0);

  // GNU tar reads it: the store and the output's stored file (a Unix
  // socket's scheduler has no token or TLS keys to keep).
  Result list = Exec({"tar", "-tf", file});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find("dlbatch.db\n"), npos) << list.out;
  EXPECT_NE(list.out.find("blobs/"), npos) << list.out;

  // Restore: the scheduler is gone; a fresh state folder from the archive.
  c.KillScheduler(SIGKILL);
  ASSERT_EQ(rename(c.scheduler_state().c_str(),
                   (c.scheduler_state() + ".lost").c_str()),
            0);
  ASSERT_EQ(mkdir(c.scheduler_state().c_str(), 0700), 0);
  Result extract = Exec({"tar", "-xf", file, "-C", c.scheduler_state()});
  ASSERT_EQ(extract.code, 0) << extract.err;
  c.StartScheduler(flags);
  ASSERT_TRUE(c.WaitWorkers(1)) << c.Logs();

  EXPECT_EQ(c.State(done), "JOB_STATE_FINISHED");
  EXPECT_EQ(c.State(queued), "JOB_STATE_QUEUED");
  // The worker kept the job through the outage and reconnected to the
  // restored scheduler, which knew it as running.
  EXPECT_EQ(c.State(running), "JOB_STATE_RUNNING");
  Result diary = c.Cli({"diary", Id(done)});
  EXPECT_NE(diary.out.find("hello-from-done"), npos) << diary.out;
  const std::string outputs = c.dir() + "/fetched";
  Result fetch = c.Cli({"fetch-outputs", Id(done), "-o", outputs});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  EXPECT_EQ(ReadAll(outputs + "/result.txt"), "payload\n");

  Result status = c.Cli({"admin", "status", "--json"});
  ASSERT_EQ(status.code, 0) << status.err;
  const nlohmann::json s = nlohmann::json::parse(status.out);
  EXPECT_EQ(s["jobs"]["finished"], 1) << status.out;
  EXPECT_EQ(s["jobs"]["running"], 1) << status.out;
  EXPECT_EQ(s["jobs"]["queued"], 1) << status.out;
  EXPECT_EQ(s["workers"]["online"], 1) << status.out;
  EXPECT_GT(s["store_bytes"].get<int64_t>(), 0) << status.out;
  EXPECT_GT(s["blob_bytes"].get<int64_t>(), 0) << status.out;
  EXPECT_EQ(s["state_dir"], c.scheduler_state()) << status.out;
  Result text = c.Cli({"admin", "status"});
  EXPECT_NE(text.out.find("jobs       3 (1 queued, 1 running, 1 finished)"),
            npos)
      << text.out;
  EXPECT_NE(text.out.find("workers    1 (1 online)"), npos) << text.out;

  ASSERT_EQ(c.Cli({"cancel", Id(running)}).code, 0);
  EXPECT_TRUE(c.WaitState(running, "JOB_STATE_CANCELLED")) << c.Logs();
}

}  // namespace
}  // namespace dlbatch::testing
