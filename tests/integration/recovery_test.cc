// Crashes: a scheduler killed with SIGKILL mid-run, a worker killed mid-job.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <sstream>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

TEST(Recovery, SchedulerKill9LosesNothingAndRunsEachJobOnce) {
  Cluster c;
  c.StartScheduler({"--heartbeat-timeout", "20s"});
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string ledger = c.dir() + "/ledger";
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    std::string tag = std::to_string(i);
    ids.push_back(c.Submit(c.JobFile(
        "j" + tag + ".yaml",
        "command: [sh, -c, 'for k in $(seq 1 40); do echo job " + tag +
            " line $k; sleep 0.02; done; echo $DLBATCH_JOB_ID >> " + ledger +
            "']\n")));
  }
  ASSERT_TRUE(c.WaitState(ids[0], "JOB_STATE_RUNNING"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c.KillScheduler(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  c.StartScheduler();
  std::vector<std::string> args = {"wait"};
  for (int64_t id : ids) args.push_back(std::to_string(id));
  Result wait = c.Cli(args, {}, 120000);
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err
                          << ReadAll(c.dir() + "/scheduler.log");
  std::map<std::string, int> runs;
  std::istringstream in(ReadAll(ledger));
  std::string id;
  while (in >> id) ++runs[id];
  for (int64_t job : ids)
    EXPECT_EQ(runs[std::to_string(job)], 1) << "job " << job;
  for (size_t i = 0; i < ids.size(); ++i) {
    Result diary = c.Cli({"diary", std::to_string(ids[i])});
    std::string expected;
    for (int k = 1; k <= 40; ++k) {
      expected +=
          "job " + std::to_string(i) + " line " + std::to_string(k) + "\n";
    }
    EXPECT_EQ(diary.out, expected) << "job " << ids[i];
    EXPECT_EQ(c.ShowJson(ids[i])["attempt"].get<int>(), 1);
  }
}

TEST(Recovery, KilledWorkersJobIsRequeuedAndCompletesOnAnother) {
  Cluster c;
  c.StartScheduler(
      {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "1500ms"});
  c.StartWorker("first", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string marker = c.dir() + "/attempt1-started";
  // Attempt 1 blocks forever; attempt 2 finishes.
  int64_t id =
      c.Submit(c.JobFile("requeue.yaml",
                         "command: [sh, -c, 'echo attempt $DLBATCH_ATTEMPT; if "
                         "[ $DLBATCH_ATTEMPT = 1 ]; then touch " +
                             marker + "; sleep 1000; fi; echo done']\n"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return !ReadAll(marker).empty() || access(marker.c_str(), F_OK) == 0;
      },
      15000));
  c.StartWorker("second", 1);
  ASSERT_TRUE(c.WaitWorkers(2));
  c.KillWorker(0, SIGKILL);
  Result wait = c.Cli({"wait", std::to_string(id)}, {}, 60000);
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err;
  auto job = c.ShowJson(id);
  EXPECT_EQ(job["attempt"].get<int>(), 2);
  EXPECT_EQ(job["placement"][0]["worker_name"].get<std::string>(), "second");
  Result diary = c.Cli({"diary", std::to_string(id)});
  EXPECT_NE(diary.out.find("attempt 1"), std::string::npos) << diary.out;
  EXPECT_NE(diary.out.find("worker 'first' lost"), std::string::npos)
      << diary.out;
  EXPECT_NE(diary.out.find("attempt 2\ndone"), std::string::npos) << diary.out;
  Result workers = c.Cli({"workers"});
  EXPECT_NE(workers.out.find("offline"), std::string::npos) << workers.out;
}

TEST(Recovery, JobFailsAfterTheRetryLimit) {
  Cluster c;
  c.StartScheduler({"--heartbeat-interval", "200ms", "--heartbeat-timeout",
                    "1s", "--max-attempts", "1"});
  c.StartWorker("only", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile("long.yaml", "command: [sleep, '1000']\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING"));
  c.KillWorker(0, SIGKILL);
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FAILED", 20000));
  auto job = c.ShowJson(id);
  EXPECT_NE(job["reason"].get<std::string>().find("lost"), std::string::npos)
      << job.dump();
  EXPECT_NE(job["reason"].get<std::string>().find("attempt 1 of 1"),
            std::string::npos);
}

}  // namespace
}  // namespace dlbatch::testing
