// What a submit counts as the profile's capacity, and what makes two
// submits one, through the real binaries: a draining worker counts (the
// job queues, saying what it waits for, and starts once the worker is
// resumed); a worker killed a moment ago does not, though it is not lost
// yet; a request id used again with another job is refused, naming the
// job it made, and is a user's own.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;

std::string WaitReason(Cluster& c, int64_t id) {
  return c.ShowJson(id).value("wait_reason", "");
}

int64_t SubmittedId(const Result& r) {
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return r.code == 0 ? std::stoll(r.out) : 0;
}

TEST(SubmitCapacity, ADrainingWorkerQueuesSubmitsUntilItIsResumed) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  Result drain = c.Cli({"admin", "drain", "w1", "--reason", "new fans"});
  ASSERT_EQ(drain.code, 0) << drain.err;

  const int64_t id =
      SubmittedId(c.Cli({"submit", "-q", "--pool", "1", "--", "echo", "hi"}));
  ASSERT_NE(id, 0);
  const std::string ids = std::to_string(id);
  EXPECT_EQ(c.State(id), "JOB_STATE_QUEUED");
  const std::string why = "waiting: worker 'w1' is draining (\"new fans\")";
  EXPECT_EQ(WaitReason(c, id), why);
  Result show = c.Cli({"show", ids});
  EXPECT_NE(show.out.find("Waiting:    " + why), npos) << show.out;
  Result jobs = c.Cli({"jobs"});
  EXPECT_NE(jobs.out.find("worker 'w1' is draining"), npos) << jobs.out;

  // More than the whole profile, the draining worker included: refused.
  Result big = c.Cli({"submit", "--pool", "2", "--", "echo", "big"});
  EXPECT_NE(big.code, 0);
  EXPECT_NE(big.err.find("pool 2 exceeds profile 'local' (1 slot on 1 "
                         "worker); use --pool 1"),
            npos)
      << big.err;

  Result resume = c.Cli({"admin", "resume", "w1"});
  ASSERT_EQ(resume.code, 0) << resume.err;
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED")) << c.Logs();
  EXPECT_EQ(c.Cli({"diary", ids}).out, "hi\n");
}

TEST(SubmitCapacity, AKilledWorkersSlotsAreNotCapacity) {
  Cluster c;
  // Long enough that the killed worker is offline, not lost, throughout.
  c.StartScheduler({"--heartbeat-timeout", "60s"});
  c.StartWorker("w1", 2);
  c.StartWorker("w2", 1);
  ASSERT_TRUE(c.WaitWorkers(2));
  const std::string sleep =
      c.JobFile("sleep.yaml", "command: [sleep, '300']\n");
  const int64_t blocker = c.Submit(sleep, {"--pool", "2"});
  ASSERT_TRUE(c.WaitState(blocker, "JOB_STATE_RUNNING")) << c.Logs();
  // Queued while it fits: w1's two slots and w2's one.
  const int64_t queued = c.Submit(sleep, {"--pool", "3", "--max-nodes", "2"});
  EXPECT_EQ(c.State(queued), "JOB_STATE_QUEUED");

  c.KillWorker(1, SIGKILL);
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string out = c.Cli({"workers"}).out;
        const size_t w2 = out.find("w2");
        return w2 != npos && out.find("offline", w2) != npos;
      },
      15000))
      << c.Cli({"workers"}).out;
  Result refused =
      c.Cli({"submit", "--pool", "3", "--max-nodes", "2", "--", "true"});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("pool 3 exceeds profile 'local' (2 slots on 1 "
                             "online worker; 'w2' is offline since "),
            npos)
      << refused.err;
  EXPECT_NE(refused.err.find("); use --pool 2, or wait for w2 to return"), npos)
      << refused.err;
  // The job queued before waits for w2, and says so.
  EXPECT_EQ(WaitReason(c, queued).rfind("waiting: worker 'w2' is offline "
                                        "since ",
                                        0),
            0u)
      << WaitReason(c, queued);
  // What the online worker holds is still taken.
  const int64_t fits =
      SubmittedId(c.Cli({"submit", "-q", "--pool", "2", "--", "true"}));
  EXPECT_NE(fits, 0);

  // Back: counted again.
  c.RestartWorker(1);
  ASSERT_TRUE(c.WaitWorkers(2)) << c.Logs();
  EXPECT_NE(SubmittedId(c.Cli({"submit", "-q", "--pool", "3", "--max-nodes",
                               "2", "--", "true"})),
            0);
}

TEST(SubmitCapacity, ARequestIdIsOneJobOfOneUser) {
  Cluster c;
  ASSERT_EQ(chmod(c.dir().c_str(), 0711), 0);
  c.StartScheduler({"--socket-mode", "0666"});
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::vector<std::string> one = {
      "submit", "-q", "--request-id", "abc", "--", "sh", "-c", "echo one"};
  const int64_t id = SubmittedId(c.Cli(one));
  ASSERT_NE(id, 0);
  // The same job again (a retry from another process): the same job.
  EXPECT_EQ(SubmittedId(c.Cli(one)), id);

  Result different = c.Cli(
      {"submit", "--request-id", "abc", "--", "sh", "-c", "echo different"});
  EXPECT_EQ(different.code, 1) << different.out;
  EXPECT_EQ(different.out, "");
  EXPECT_NE(different.err.find("request id 'abc' was used for job " +
                               std::to_string(id) +
                               " with a different job spec; use a new "
                               "--request-id, or resubmit the same job"),
            npos)
      << different.err;
  // Nor does another pool make it the same job.
  Result wider = c.Cli({"submit", "--pool", "2", "--request-id", "abc", "--",
                        "sh", "-c", "echo one"});
  EXPECT_NE(wider.err.find("with a different job spec"), npos) << wider.err;

  // Another user's "abc" is another request: a job of their own.
  std::vector<std::string> argv = {"setpriv", "--reuid=65534", "--regid=65534",
                                   "--clear-groups"};
  for (const std::string& a : c.CliArgv(one)) argv.push_back(a);
  Result other =
      Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
  const int64_t theirs = SubmittedId(other);
  EXPECT_NE(theirs, 0);
  EXPECT_NE(theirs, id);
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED")) << c.Logs();
  EXPECT_EQ(c.Cli({"diary", std::to_string(id)}).out, "one\n");
}

}  // namespace
}  // namespace dlbatch::testing
