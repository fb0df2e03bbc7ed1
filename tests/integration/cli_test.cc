// The CLI people use every day, through the real scheduler and worker:
// submit without a job file, jobs' filters and columns, plain --json on
// every read command, diary --tail, submit --follow's exit code, and what
// an unknown command is told.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartScheduler();
    c_.StartWorker("w1", 1);
    ASSERT_TRUE(c_.WaitWorkers(1));
  }
  // `submit -q ARGS...`; the job id, or -1 (and the test fails).
  int64_t SubmitQ(std::vector<std::string> args) {
    args.insert(args.begin(), {"submit", "-q"});
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r.code == 0 ? std::stoll(r.out) : -1;
  }
  // A command that runs until the test creates dir()/release.
  std::vector<std::string> Held() {
    return {"sh", "-c",
            "echo held; while [ ! -f " + c_.dir() +
                "/release ]; do sleep 0.05; done"};
  }
  std::vector<std::string> With(std::vector<std::string> head,
                                const std::vector<std::string>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  }
  Cluster c_;
};

TEST_F(CliTest, SubmitsACommandWithoutAJobFileAndFlagsOverrideAFile) {
  WriteAll(c_.dir() + "/data.txt", "attached bytes\n");
  // --attach is relative to where submit runs.
  std::vector<std::string> argv = c_.CliArgv(
      {"submit", "-q", "--name", "hello", "--env", "GREETING=hi there",
       "--attach", "data.txt", "--time-limit", "2m", "--priority", "3",
       "--max-nodes", "1", "--", "sh", "-c", "echo $GREETING; cat data.txt"});
  std::vector<std::string> in_dir = {"sh", "-c", "cd \"$0\" && exec \"$@\"",
                                     c_.dir()};
  in_dir.insert(in_dir.end(), argv.begin(), argv.end());
  Result r = Exec(in_dir, c_.CliEnv());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const int64_t id = std::stoll(r.out);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  EXPECT_EQ(c_.Cli({"diary", std::to_string(id)}).out,
            "hi there\nattached bytes\n");
  nlohmann::json job = c_.ShowJson(id);
  EXPECT_EQ(job["name"], "hello");
  EXPECT_EQ(job["priority"], 3);
  EXPECT_EQ(job["spec"]["time_limit_s"], 120);
  EXPECT_EQ(job["spec"]["max_nodes"], 1);
  EXPECT_EQ(job["spec"]["env"]["GREETING"], "hi there");

  // With a job file too: the command after -- and the flags win.
  const std::string file =
      c_.JobFile("file.yaml",
                 "name: from-file\npool: 1\nenv: {A: file, B: kept}\n"
                 "command: [echo, from-file]\n");
  // --env takes one value each time: the file after it is not one.
  const int64_t over = SubmitQ({"--name", "flagged", "--env", "A=flag", file,
                                "--", "sh", "-c", "echo $A $B"});
  ASSERT_TRUE(c_.WaitState(over, "JOB_STATE_FINISHED")) << c_.Logs();
  EXPECT_EQ(c_.Cli({"diary", std::to_string(over)}).out, "flag kept\n");
  EXPECT_EQ(c_.ShowJson(over)["name"], "flagged");
  // Without --name a command job is named after its program.
  const int64_t named = SubmitQ({"--", "/bin/true"});
  EXPECT_EQ(c_.ShowJson(named)["name"], "true");
}

TEST_F(CliTest, BadSubmitFlagsAreRefusedWithWhatToChange) {
  const std::string train = c_.JobFile(
      "train.yaml", LenetJob("/data", "    max_iterations: 1\n", ""));
  const struct {
    std::vector<std::string> args;
    const char* says;
  } cases[] = {
      {{"submit"}, "give a job file"},
      {{"submit", "--pool", "0", "--", "true"}, "use --pool 1 or more"},
      {{"submit", "--time-limit", "soon", "--", "true"}, "--time-limit soon"},
      {{"submit", "--env", "NOEQUALS", "--", "true"}, "write NAME=VALUE"},
      {{"submit", "--env", "=x", "--", "true"}, "write NAME=VALUE"},
      {{"submit", "--env", "CUDA_VISIBLE_DEVICES=0", "--", "true"},
       "the worker sets it"},
      {{"submit", "--max-nodes", "0", "--", "true"}, "--max-nodes 0"},
      {{"submit", "--attach", "no-such-file", "--", "true"}, "no-such-file"},
      {{"submit", "--pool", "two", "--", "true"}, "--pool"},
      {{"submit", train, "--", "true"}, "give one or the other"},
  };
  for (const auto& bad : cases) {
    Result r = c_.Cli(bad.args);
    EXPECT_NE(r.code, 0) << bad.args.back();
    EXPECT_NE(r.err.find(bad.says), std::string::npos)
        << bad.says << " not in: " << r.err;
  }
  // Nothing was queued.
  Result jobs = c_.Cli({"jobs", "--json"});
  EXPECT_EQ(nlohmann::json::parse(jobs.out)["jobs"].size(), 0u) << jobs.out;
}

TEST_F(CliTest, SubmitFollowExitsWithTheJobsOwnExitCode) {
  Result ok = c_.Cli({"submit", "-f", "--", "sh", "-c", "echo fine"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("fine"), std::string::npos) << ok.out;
  Result seven = c_.Cli({"submit", "-f", "--", "sh", "-c", "exit 7"});
  EXPECT_EQ(seven.code, 7) << seven.err;
  // Stopped at its time limit by a signal: 128 + the signal, as a shell.
  Result limit =
      c_.Cli({"submit", "-f", "--time-limit", "1s", "--", "sleep", "60"});
  EXPECT_GT(limit.code, 128) << limit.err;
  // A program that never ran has no exit code of its own.
  Result never = c_.Cli({"submit", "-f", "--", "no-such-program-xyz"});
  EXPECT_EQ(never.code, 125) << never.err;
  // --output-dir waits and fetches the outputs.
  Result out = c_.Cli({"submit", "-q", "--output-dir", c_.dir() + "/got", "--",
                       "sh", "-c", "echo out > $DLBATCH_OUTPUT_DIR/a.txt"});
  EXPECT_EQ(out.code, 0) << out.err;
  EXPECT_EQ(ReadAll(c_.dir() + "/got/a.txt"), "out\n");
}

TEST_F(CliTest, JobsFiltersNewestFirstColumnsAndWhyAJobWaits) {
  const int64_t a1 = SubmitQ(With({"--name", "a-1", "--"}, Held()));
  ASSERT_TRUE(c_.WaitState(a1, "JOB_STATE_RUNNING")) << c_.Logs();
  const int64_t a2 = SubmitQ({"--name", "a-2", "--", "true"});
  const int64_t b1 = SubmitQ({"--name", "b-1", "--", "true"});

  Result names = c_.Cli({"jobs", "--name", "a-*", "--format", "id,name"});
  EXPECT_EQ(names.code, 0) << names.err;
  EXPECT_EQ(names.out, "ID  NAME\n" + std::to_string(a1) + "   a-1\n" +
                           std::to_string(a2) + "   a-2\n")
      << names.out;
  Result newest = c_.Cli({"jobs", "--limit", "2", "--format", "id"});
  EXPECT_EQ(newest.out,
            "ID\n" + std::to_string(b1) + "\n" + std::to_string(a2) + "\n")
      << newest.out;
  EXPECT_EQ(c_.Cli({"jobs", "--mine", "--format", "id"}).out,
            "ID\n" + std::to_string(a1) + "\n" + std::to_string(a2) + "\n" +
                std::to_string(b1) + "\n");
  EXPECT_EQ(c_.Cli({"jobs", "--user", "nobody", "--format", "id"}).out, "ID\n");

  // NOTE says why a queued job waits, as show does.
  std::string waiting = c_.ShowJson(a2).value("wait_reason", "");
  ASSERT_NE(waiting.find("waiting for 1 slot on 'local'"), std::string::npos)
      << waiting;
  Result note = c_.Cli({"jobs", "--state", "queued", "--format", "id,note"});
  EXPECT_NE(note.out.find(std::to_string(a2) + "   " + waiting),
            std::string::npos)
      << note.out;

  Result bad = c_.Cli({"jobs", "--format", "id,colour"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("no column 'colour'; the columns are id,name,user"),
            std::string::npos)
      << bad.err;
  WriteAll(c_.dir() + "/release", "");
}

TEST_F(CliTest, EveryReadCommandPrintsPlainJson) {
  // Jobs in several states: finished, failed, cancelled, running, queued.
  const int64_t done = SubmitQ({"--", "sh", "-c", "echo one; echo two"});
  ASSERT_TRUE(c_.WaitState(done, "JOB_STATE_FINISHED"));
  const int64_t failed = SubmitQ({"--", "sh", "-c", "exit 3"});
  ASSERT_TRUE(c_.WaitState(failed, "JOB_STATE_FAILED"));
  const int64_t running = SubmitQ(With({"--"}, Held()));
  ASSERT_TRUE(c_.WaitState(running, "JOB_STATE_RUNNING"));
  const int64_t queued = SubmitQ({"--", "true"});
  const int64_t cancelled = SubmitQ({"--", "true"});
  ASSERT_EQ(c_.Cli({"cancel", std::to_string(cancelled)}).code, 0);
  ASSERT_EQ(c_.Cli({"admin", "limit", "set", "root", "--profile", "local",
                    "--queued", "50"})
                .code,
            0);

  const std::set<std::string> states = {"queued",   "running", "cancelling",
                                        "finished", "failed",  "cancelled"};
  const std::regex rfc3339(
      R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d))");
  auto check_job = [&](const nlohmann::json& j) {
    EXPECT_TRUE(j["id"].is_number_integer()) << j.dump();
    EXPECT_TRUE(states.count(j.value("state", ""))) << j.dump();
    EXPECT_TRUE(std::regex_match(j.value("submit_time", ""), rfc3339))
        << j.dump();
    EXPECT_TRUE(j["exit_code"].is_number_integer()) << j.dump();
    EXPECT_TRUE(j.contains("end_time") && j.contains("wait_reason"));
    for (const auto& h : j["history"]) {
      EXPECT_TRUE(states.count(h.value("state", ""))) << h.dump();
      EXPECT_TRUE(std::regex_match(h.value("time", ""), rfc3339)) << h.dump();
    }
  };
  auto parse = [&](const std::vector<std::string>& args) {
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << args[0] << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << args[0] << ": " << r.out;
    return j;
  };

  nlohmann::json jobs = parse({"jobs", "--json"});
  ASSERT_EQ(jobs["jobs"].size(), 5u) << jobs.dump();
  std::set<std::string> seen;
  for (const auto& j : jobs["jobs"]) {
    check_job(j);
    seen.insert(j["state"].get<std::string>());
  }
  EXPECT_EQ(seen, (std::set<std::string>{"finished", "failed", "running",
                                         "queued", "cancelled"}));
  for (int64_t id : {done, failed, running, queued, cancelled}) {
    check_job(parse({"show", "--json", std::to_string(id)}));
  }
  nlohmann::json f = parse({"show", "--json", std::to_string(failed)});
  EXPECT_EQ(f["exit_code"], 3);
  EXPECT_TRUE(std::regex_match(f.value("end_time", ""), rfc3339));
  nlohmann::json q = parse({"show", "--json", std::to_string(queued)});
  EXPECT_TRUE(q["start_time"].is_null());
  EXPECT_NE(q.value("wait_reason", ""), "");

  // diary --json: one object a line.
  Result diary = c_.Cli({"diary", "--json", std::to_string(done)});
  EXPECT_EQ(diary.code, 0);
  std::vector<std::string> texts;
  std::stringstream lines(diary.out);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << line;
    EXPECT_TRUE(j["n"].is_number_integer()) << line;
    EXPECT_TRUE(std::regex_match(j.value("time", ""), rfc3339)) << line;
    texts.push_back(j.value("text", ""));
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"one", "two"}));

  nlohmann::json workers = parse({"workers", "--json"});
  ASSERT_EQ(workers["workers"].size(), 1u);
  EXPECT_TRUE(workers["workers"][0]["id"].is_number_integer());
  EXPECT_EQ(workers["workers"][0]["running_jobs"],
            nlohmann::json::array({running}));
  EXPECT_TRUE(
      std::regex_match(workers["workers"][0].value("last_seen", ""), rfc3339));
  nlohmann::json profiles = parse({"profiles", "--json"});
  EXPECT_EQ(profiles["profiles"][0]["queued_jobs"], 1) << profiles.dump();
  nlohmann::json outputs =
      parse({"fetch-outputs", "--json", std::to_string(done)});
  EXPECT_EQ(outputs["job_id"], done);
  EXPECT_EQ(outputs["state"], "finished");
  EXPECT_TRUE(outputs["files"].is_array());
  nlohmann::json limits = parse({"admin", "limit", "list", "--json"});
  EXPECT_EQ(limits["limits"][0]["max_queued"], 50);
  EXPECT_EQ(limits["limits"][0]["max_slots"], 0);  // zero values present
  nlohmann::json usage = parse({"admin", "usage", "--json"});
  EXPECT_TRUE(usage["half_life_ms"].is_number_integer());
  EXPECT_TRUE(std::regex_match(usage.value("time", ""), rfc3339));
  nlohmann::json users = parse({"admin", "user", "list", "--json"});
  EXPECT_TRUE(users["credentials"].is_array());
  WriteAll(c_.dir() + "/release", "");
}

TEST_F(CliTest, DiaryTailAndUnknownCommands) {
  const int64_t id = SubmitQ({"--", "seq", "1", "10"});
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED"));
  EXPECT_EQ(c_.Cli({"diary", "--tail", "3", std::to_string(id)}).out,
            "8\n9\n10\n");
  EXPECT_EQ(c_.Cli({"diary", "-f", "--tail", "2", std::to_string(id)}).out,
            "9\n10\n");
  EXPECT_EQ(c_.Cli({"diary", "--tail", "30", std::to_string(id)}).out.size(),
            21u);

  const struct {
    std::vector<std::string> args;
    const char* typed;
    const char* says;
  } typos[] = {
      {{"logs", "1"}, "logs", "did you mean `dlbatch diary`?"},
      {{"ps"}, "ps", "did you mean `dlbatch jobs`?"},
      {{"kill", "1"}, "kill", "did you mean `dlbatch cancel`?"},
      {{"jbos"}, "jbos", "did you mean `dlbatch jobs`?"},
      {{"local", "stauts"}, "stauts", "did you mean `dlbatch local status`?"},
  };
  for (const auto& typo : typos) {
    Result r = c_.Cli(typo.args);
    EXPECT_NE(r.code, 0) << typo.typed;
    EXPECT_NE(r.err.find(std::string("unknown command '") + typo.typed + "'"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(typo.says), std::string::npos) << r.err;
  }
  Result far = c_.Cli({"frobnicate"});
  EXPECT_NE(far.code, 0);
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
}

}  // namespace
}  // namespace dlbatch::testing
