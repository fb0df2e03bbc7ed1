// The CLI against a scheduler that is down, restarts, or dies between
// committing a submit and answering it: a submit retried with its request id
// makes exactly one job.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

using std::chrono::milliseconds;

// The ids of every job the scheduler knows.
std::vector<int64_t> JobIds(Cluster& c) {
  Result r = c.Cli({"jobs", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<int64_t> ids;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (!j.is_object() || !j.contains("jobs")) return ids;
  for (const auto& job : j["jobs"]) ids.push_back(JsonInt(job, "id"));
  return ids;
}

// Runs the CLI on a thread of its own (the test restarts the scheduler
// meanwhile).
std::future<Result> CliAsync(Cluster& c, const std::vector<std::string>& args) {
  return std::async(std::launch::async,
                    [argv = c.CliArgv(args), env = c.CliEnv()] {
                      return Exec(argv, env, 60000);
                    });
}

// Sets an environment variable for the processes started while it lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    setenv(name, value, 1);
  }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(ClientFaults, SubmitWhileSchedulerIsDownMakesOneJobWhenItIsBack) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string job = c.JobFile("j.yaml", "command: [echo, hello]\n");
  c.KillScheduler(SIGKILL);
  auto submit = CliAsync(c, {"submit", "-q", job});
  std::this_thread::sleep_for(milliseconds(1500));
  c.StartScheduler();
  Result r = submit.get();
  ASSERT_EQ(r.code, 0) << r.out << r.err << c.Logs();
  EXPECT_NE(r.err.find("retrying"), std::string::npos) << r.err;
  int64_t id = std::stoll(r.out);
  EXPECT_EQ(JobIds(c), std::vector<int64_t>{id});
  Result wait = c.Cli({"wait", std::to_string(id)});
  EXPECT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();
}

// Its attachments' uploads retry too, not only the submit.
TEST(ClientFaults, SubmitWithAttachmentsWhileSchedulerIsDownMakesOneJob) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  WriteAll(c.dir() + "/data.txt", "attached bytes\n");
  std::string job =
      c.JobFile("j.yaml", "attach: [data.txt]\ncommand: [cat, data.txt]\n");
  c.KillScheduler(SIGKILL);
  auto submit = CliAsync(c, {"submit", "-q", job});
  std::this_thread::sleep_for(milliseconds(1500));
  c.StartScheduler();
  Result r = submit.get();
  ASSERT_EQ(r.code, 0) << r.out << r.err << c.Logs();
  int64_t id = std::stoll(r.out);
  EXPECT_EQ(JobIds(c), std::vector<int64_t>{id});
  Result wait = c.Cli({"wait", std::to_string(id)});
  EXPECT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();
  EXPECT_EQ(c.Cli({"diary", std::to_string(id)}).out, "attached bytes\n");
}

TEST(ClientFaults, SchedulerKilledBetweenCommitAndReplyMakesOneJob) {
  Cluster c;
  {
    ScopedEnv fault("DLBATCH_FAULT", "exit-after-submit-commit");
    c.StartScheduler();
  }
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string ledger = c.dir() + "/ledger";
  std::string job =
      c.JobFile("j.yaml", "command: [sh, -c, 'echo $DLBATCH_JOB_ID >> " +
                              ledger + "']\n");
  auto submit = CliAsync(c, {"submit", "-q", job});
  ASSERT_TRUE(c.WaitSchedulerExit(15000)) << c.Logs();
  std::this_thread::sleep_for(milliseconds(500));
  c.StartScheduler();  // without the fault
  Result r = submit.get();
  ASSERT_EQ(r.code, 0) << r.out << r.err << c.Logs();
  int64_t id = std::stoll(r.out);
  // The retry found the job its first try made; it says nothing of a
  // duplicate, since it was its own.
  EXPECT_EQ(r.err.find("no new job"), std::string::npos) << r.err;
  EXPECT_EQ(JobIds(c), std::vector<int64_t>{id});
  Result wait = c.Cli({"wait", std::to_string(id)});
  EXPECT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();
  EXPECT_EQ(ReadAll(ledger), std::to_string(id) + "\n");
}

TEST(ClientFaults, RequestIdMakesAResubmitIdempotentAcrossProcesses) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string job = c.JobFile("j.yaml", "command: [echo, hello]\n");
  Result first = c.Cli({"submit", "--request-id", "nightly-42", job});
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_EQ(first.out.rfind("Submitted job ", 0), 0u) << first.out;
  int64_t id = std::stoll(first.out.substr(first.out.rfind(' ') + 1));
  Result again = c.Cli({"submit", "--request-id", "nightly-42", job});
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_EQ(again.out, "Job " + std::to_string(id) + " (already submitted)\n");
  EXPECT_NE(again.err.find("no new job"), std::string::npos) << again.err;
  Result quiet = c.Cli({"submit", "-q", "--request-id", "nightly-42", job});
  EXPECT_EQ(quiet.out, std::to_string(id) + "\n");
  EXPECT_EQ(JobIds(c), std::vector<int64_t>{id});

  Result bad = c.Cli({"submit", "--request-id", "has space", job});
  EXPECT_EQ(bad.code, 2);  // a usage error
  EXPECT_NE(bad.err.find("without spaces"), std::string::npos) << bad.err;
}

// Every command that only reads, and cancel and fetch-outputs, waits out a
// scheduler restart as submit does, instead of failing at once.
TEST(ClientFaults, EveryCommandWaitsOutASchedulerRestart) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  const int64_t done = c.Submit(c.JobFile(
      "out.yaml",
      "command: [sh, -c, 'echo kept > $DLBATCH_OUTPUT_DIR/result.txt']\n"));
  ASSERT_TRUE(c.WaitState(done, "JOB_STATE_FINISHED")) << c.Logs();
  const int64_t running =
      c.Submit(c.JobFile("sleep.yaml", "command: [sleep, '300']\n"));
  ASSERT_TRUE(c.WaitState(running, "JOB_STATE_RUNNING")) << c.Logs();
  c.KillScheduler(SIGKILL);
  const std::string fetched = c.dir() + "/fetched";
  std::vector<std::vector<std::string>> commands = {
      {"workers"},
      {"profiles"},
      {"jobs"},
      {"show", std::to_string(done)},
      {"monitor", "--once"},
      {"fetch-outputs", std::to_string(done), "-o", fetched},
      {"cancel", std::to_string(running)},
  };
  std::vector<std::future<Result>> results;
  for (const auto& args : commands) results.push_back(CliAsync(c, args));
  std::this_thread::sleep_for(milliseconds(1500));
  c.StartScheduler();
  for (size_t i = 0; i < commands.size(); ++i) {
    Result r = results[i].get();
    EXPECT_EQ(r.code, 0) << "dlbatch " << commands[i][0] << ": " << r.out
                         << r.err;
    EXPECT_NE(r.err.find("retrying"), std::string::npos)
        << "dlbatch " << commands[i][0] << ": " << r.err;
  }
  EXPECT_EQ(ReadAll(fetched + "/result.txt"), "kept\n");
  EXPECT_TRUE(c.WaitState(running, "JOB_STATE_CANCELLED")) << c.Logs();
}

TEST(ClientFaults, GivesUpAfterRetryForNamingTheScheduler) {
  Cluster c;
  c.StartScheduler();
  c.KillScheduler(SIGKILL);
  auto start = std::chrono::steady_clock::now();
  Result r = c.Cli({"--retry-for", "2s", "jobs"});
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot reach the scheduler at " + c.address()),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--retry-for"), std::string::npos) << r.err;
  EXPECT_GE(took, milliseconds(1500));
  EXPECT_LT(took, milliseconds(10000));
}

// A job's output is bytes: `diary` shows them escaped so that they cannot
// drive the terminal, `--raw` gives them exactly, `--json` both ways.
TEST(ClientDiary, ShowsAnyBytesEscapedAndRawExactly) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile(
      "bytes.yaml",
      "command: [sh, -c, \"printf 'a\\\\377b\\\\033[2Jc\\\\000d\\\\n'\"]\n"));
  Result wait = c.Cli({"wait", std::to_string(id)});
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();

  Result shown = c.Cli({"diary", std::to_string(id)});
  EXPECT_EQ(shown.code, 0) << shown.err;
  EXPECT_EQ(shown.out, "a\\xffb\\x1b[2Jc\\x00d\n");
  Result raw = c.Cli({"diary", "--raw", std::to_string(id)});
  EXPECT_EQ(raw.out, std::string("a\xff"
                                 "b\x1b[2Jc\0d\n",
                                 11));
  Result followed = c.Cli({"diary", "-f", std::to_string(id)});
  EXPECT_EQ(followed.out, shown.out);

  Result json = c.Cli({"diary", "--json", std::to_string(id)});
  ASSERT_EQ(json.code, 0) << json.err;
  auto line = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_TRUE(line.is_object()) << json.out;
  EXPECT_EQ(line["text"].get<std::string>(), std::string("a\xEF\xBF\xBD"
                                                         "b\x1b[2Jc\0d",
                                                         12));
  EXPECT_EQ(line["text_base64"].get<std::string>(), "Yf9iG1sySmMAZA==");
  EXPECT_EQ(line["stream"].get<int>(), 1);
}

}  // namespace
}  // namespace dlbatch::testing
