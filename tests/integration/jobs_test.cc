// Jobs end to end through the real scheduler, worker and CLI.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <set>
#include <sstream>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

// A command job that runs until the test creates RELEASE/<tag>.
std::string HoldJob(const std::string& dir, const std::string& tag) {
  return "command: [sh, -c, 'echo started " + tag + "; while [ ! -f " + dir +
         "/release-" + tag + " ]; do sleep 0.05; done; echo done " + tag +
         "']\n";
}

TEST(Jobs, GangPlacementQueuesInOrder) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 4);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t a =
      c.Submit(c.JobFile("a.yaml", HoldJob(c.dir(), "a")), {"--pool", "4"});
  int64_t b =
      c.Submit(c.JobFile("b.yaml", HoldJob(c.dir(), "b")), {"--pool", "2"});
  int64_t d =
      c.Submit(c.JobFile("c.yaml", HoldJob(c.dir(), "c")), {"--pool", "2"});
  ASSERT_TRUE(c.WaitState(a, "JOB_STATE_RUNNING"));
  EXPECT_EQ(c.State(b), "JOB_STATE_QUEUED");
  EXPECT_EQ(c.State(d), "JOB_STATE_QUEUED");
  Result show = c.Cli({"show", std::to_string(b)});
  EXPECT_NE(show.out.find("waiting for 2 slots on 'local': 0 free"),
            std::string::npos)
      << show.out;
  Result show_c = c.Cli({"show", std::to_string(d)});
  EXPECT_NE(show_c.out.find("1 job ahead (#" + std::to_string(b)),
            std::string::npos)
      << show_c.out;

  WriteAll(c.dir() + "/release-a", "");
  ASSERT_TRUE(c.WaitState(a, "JOB_STATE_FINISHED"));
  // Both 2-slot jobs fit in the 4 freed slots at once.
  ASSERT_TRUE(c.WaitState(b, "JOB_STATE_RUNNING"));
  ASSERT_TRUE(c.WaitState(d, "JOB_STATE_RUNNING"));
  auto jb = c.ShowJson(b);
  auto jd = c.ShowJson(d);
  std::set<int> devices;
  for (auto& j : {jb, jd}) {
    for (auto& dev : j["placement"][0]["devices"])
      devices.insert(dev.get<int>());
  }
  EXPECT_EQ(devices, (std::set<int>{0, 1, 2, 3}));
  WriteAll(c.dir() + "/release-b", "");
  WriteAll(c.dir() + "/release-c", "");
  Result wait =
      c.Cli({"wait", std::to_string(a), std::to_string(b), std::to_string(d)});
  EXPECT_EQ(wait.code, 0) << wait.out << wait.err;
}

TEST(Jobs, DiaryFollowGetsEveryLineOfAJobThatExitsAtOnce) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t quick = c.Submit(
      c.JobFile("q.yaml", "command: \"printf 'one\\ntwo\\nlast line'\"\n"));
  Result follow = c.Cli({"diary", "-f", std::to_string(quick)});
  EXPECT_EQ(follow.code, 0) << follow.err;
  EXPECT_EQ(follow.out, "one\ntwo\nlast line\n");

  // Many lines, stdout and stderr, exiting with an error at once.
  int64_t many = c.Submit(c.JobFile(
      "m.yaml",
      "command: [sh, -c, 'seq 1 20000; echo to-stderr >&2; exit 3']\n"));
  Result lines = c.Cli({"diary", "-f", std::to_string(many)});
  EXPECT_EQ(lines.code, 0);
  std::istringstream in(lines.out);
  std::string line;
  int count = 0;
  bool saw_stderr = false;
  while (std::getline(in, line)) {
    if (line == "to-stderr") {
      saw_stderr = true;
    } else {
      ++count;
      EXPECT_EQ(line, std::to_string(count));
      if (line != std::to_string(count)) break;
    }
  }
  EXPECT_EQ(count, 20000);
  EXPECT_TRUE(saw_stderr);
  EXPECT_EQ(c.State(many), "JOB_STATE_FAILED");
  EXPECT_EQ(c.ShowJson(many)["exit_code"].get<int>(), 3);
  Result wait = c.Cli({"wait", std::to_string(many)});
  EXPECT_EQ(wait.code, 1);
  EXPECT_NE(wait.out.find("exit code 3"), std::string::npos) << wait.out;
}

TEST(Jobs, FetchedOutputsAreByteIdentical) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string ref = c.dir() + "/reference";
  mkdir(ref.c_str(), 0755);
  WriteAll(c.dir() + "/input.txt", "attached input\n");
  std::string job = c.JobFile(
      "out.yaml",
      "name: outputs\n"
      "attach: [input.txt]\n"
      "command: [sh, -c, 'head -c 3000000 /dev/urandom > "
      "$DLBATCH_OUTPUT_DIR/model.bin && "
      "mkdir -p $DLBATCH_OUTPUT_DIR/sub && cp input.txt "
      "$DLBATCH_OUTPUT_DIR/sub/copy.txt && "
      "echo $DLBATCH_JOB_ID $DLBATCH_POOL > $DLBATCH_OUTPUT_DIR/env.txt && "
      "cp -r $DLBATCH_OUTPUT_DIR/. " +
          ref + "/']\n");
  int64_t id = c.Submit(job);
  Result wait = c.Cli({"wait", std::to_string(id)});
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err
                          << c.Cli({"diary", std::to_string(id)}).out;
  std::string target = c.dir() + "/fetched";
  Result fetch = c.Cli({"fetch-outputs", std::to_string(id), "-o", target});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  for (const char* f : {"model.bin", "sub/copy.txt", "env.txt"}) {
    std::string got = ReadAll(target + "/" + f);
    EXPECT_FALSE(got.empty()) << f;
    EXPECT_EQ(got, ReadAll(ref + "/" + f)) << f;
  }
  EXPECT_EQ(ReadAll(target + "/sub/copy.txt"), "attached input\n");
  EXPECT_EQ(ReadAll(target + "/env.txt"), std::to_string(id) + " 1\n");
  EXPECT_EQ(ReadAll(target + "/model.bin").size(), 3000000u);
  Result list = c.Cli({"fetch-outputs", "--list", std::to_string(id)});
  EXPECT_NE(list.out.find("model.bin"), std::string::npos);
  EXPECT_NE(list.out.find("3.0 MB"), std::string::npos) << list.out;
}

TEST(Jobs, CancelLeavesNoProcessOfTheJobAlive) {
  Cluster c;
  c.StartScheduler({"--cancel-grace", "1s"});
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string pids = c.dir() + "/pids";
  // The job ignores SIGTERM and leaves children that ignore it too.
  int64_t id = c.Submit(c.JobFile("stubborn.yaml",
                                  "command: [sh, -c, \"trap '' TERM; (trap '' "
                                  "TERM; sleep 1000) & echo $! >> " +
                                      pids + "; sleep 1000 & echo $! >> " +
                                      pids + "; echo $$ >> " + pids +
                                      "; echo ready; wait\"]\n"));
  ASSERT_TRUE(WaitFor(
      [&] {
        // One read: begin() and end() of two reads would span two strings.
        const std::string text = ReadAll(pids);
        return std::count(text.begin(), text.end(), '\n') >= 3;
      },
      15000));
  Result cancel = c.Cli({"cancel", std::to_string(id)});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_CANCELLED", 20000));
  std::istringstream in(ReadAll(pids));
  int pid;
  int checked = 0;
  while (in >> pid) {
    EXPECT_NE(kill(pid, 0), 0)
        << "process " << pid << " of the cancelled job is alive";
    ++checked;
  }
  EXPECT_EQ(checked, 3);
  // Its slots are free again.
  int64_t next =
      c.Submit(c.JobFile("next.yaml", "command: [true]\n"), {"--pool", "2"});
  EXPECT_EQ(c.Cli({"wait", std::to_string(next)}).code, 0);
  Result again = c.Cli({"cancel", std::to_string(id)});
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("already cancelled"), std::string::npos)
      << again.err;
}

TEST(Jobs, QueuedJobCancelsAtOnceAndTablesList) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t hold = c.Submit(c.JobFile("h.yaml", HoldJob(c.dir(), "h")));
  int64_t queued =
      c.Submit(c.JobFile("q.yaml", "name: waiter\ncommand: [true]\n"));
  ASSERT_TRUE(c.WaitState(hold, "JOB_STATE_RUNNING"));
  Result jobs = c.Cli({"jobs"});
  EXPECT_NE(jobs.out.find("waiter"), std::string::npos) << jobs.out;
  EXPECT_NE(jobs.out.find("queued"), std::string::npos);
  Result only = c.Cli({"jobs", "--state", "running"});
  EXPECT_EQ(only.out.find("waiter"), std::string::npos) << only.out;
  EXPECT_EQ(c.Cli({"cancel", std::to_string(queued)}).code, 0);
  EXPECT_EQ(c.State(queued), "JOB_STATE_CANCELLED");
  Result profiles = c.Cli({"profiles"});
  EXPECT_NE(profiles.out.find("local"), std::string::npos);
  Result workers = c.Cli({"workers"});
  EXPECT_NE(workers.out.find("w1"), std::string::npos);
  EXPECT_NE(workers.out.find("1 CPU slots"), std::string::npos) << workers.out;
  WriteAll(c.dir() + "/release-h", "");
  EXPECT_EQ(c.Cli({"wait", std::to_string(hold)}).code, 0);
}

}  // namespace
}  // namespace dlbatch::testing
