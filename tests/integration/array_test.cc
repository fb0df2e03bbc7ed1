// Job arrays and sweeps of command jobs end to end: the real scheduler,
// worker and CLI. An array of 20 with %3 never runs more than 3 at once
// (each job records when it ran, on the one clock of this machine) and
// runs every index once; a whole array is held, released and cancelled by
// its id; a sweep over env.LR (and args) runs one job per value with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

namespace fs = std::filesystem;

nlohmann::json ArrayJobs(Cluster& c, const std::string& array,
                         std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"jobs", "--array", array, "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  Result listed = c.Cli(args);
  EXPECT_EQ(listed.code, 0) << listed.err;
  if (listed.code != 0) return nlohmann::json::array();
  return nlohmann::json::parse(listed.out)["jobs"];
}

TEST(Arrays, TwentyWithPercentThreeNeverRunMoreThanThreeAndEachIndexOnce) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 8);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string marks = c.dir() + "/marks";
  fs::create_directories(marks);
  // Each job appends "start end array-id" (ns on this machine's clock) to
  // the file of its index: one line per run.
  const std::string job =
      c.JobFile("array.yaml",
                "name: sim\n"
                "array: 0-19%3\n"
                "command: [sh, -c, 's=$(date +%s%N); sleep 0.3; "
                "echo \"$s $(date +%s%N) $DLBATCH_ARRAY_ID\" >> " +
                    marks + "/$DLBATCH_ARRAY_INDEX']\n");
  Result submit = c.Cli({"submit", job});
  ASSERT_EQ(submit.code, 0) << submit.out << submit.err;
  EXPECT_NE(submit.out.find("Submitted array 1: 20 jobs (1-20)"),
            std::string::npos)
      << submit.out;

  // The last index waits for the array, and says so.
  std::string reason;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto shown = c.ShowJson(20);
        reason = shown.value("wait_reason", "");
        return reason == "array 1 has 3 of 3 running (%3)";
      },
      10000))
      << reason;
  // While it runs, never more than 3 of it are running.
  int most_running = 0;
  bool done = false;
  while (!done) {
    auto jobs = ArrayJobs(c, "1");
    ASSERT_EQ(jobs.size(), 20u);
    int running = 0, ended = 0;
    for (const auto& j : jobs) {
      running += j["state"] == "running";
      ended += j["state"] == "finished" || j["state"] == "failed";
    }
    most_running = std::max(most_running, running);
    ASSERT_LE(running, 3);
    done = ended == 20;
  }
  EXPECT_EQ(most_running, 3);

  // Every index ran exactly once, told its array; the recorded runs never
  // overlap more than 3 deep.
  std::vector<std::pair<int64_t, int>> edges;  // (time, +1 start / -1 end)
  for (int i = 0; i < 20; ++i) {
    std::vector<std::string> lines = absl::StrSplit(
        absl::StripSuffix(ReadAll(marks + "/" + std::to_string(i)), "\n"),
        '\n');
    ASSERT_EQ(lines.size(), 1u)
        << "index " << i << " ran " << lines.size() << " times";
    std::vector<std::string> f = absl::StrSplit(lines[0], ' ');
    ASSERT_EQ(f.size(), 3u) << lines[0];
    int64_t start = 0, end = 0;
    ASSERT_TRUE(absl::SimpleAtoi(f[0], &start) && absl::SimpleAtoi(f[1], &end));
    EXPECT_EQ(f[2], "1") << "DLBATCH_ARRAY_ID of index " << i;
    edges.emplace_back(start, 1);
    edges.emplace_back(end, -1);
  }
  std::sort(edges.begin(), edges.end());  // an end before a start at a tie
  int depth = 0, deepest = 0;
  for (const auto& [t, d] : edges) deepest = std::max(deepest, depth += d);
  EXPECT_LE(deepest, 3);
  EXPECT_GE(deepest, 2) << "the array never ran in parallel";

  // Each job knows its place; show --array sums them up by index.
  auto jobs = ArrayJobs(c, "1");
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(jobs[i]["array_index"], i) << jobs[i].dump();
    EXPECT_EQ(jobs[i]["array_id"], 1) << jobs[i].dump();
    EXPECT_EQ(jobs[i]["name"], "sim[" + std::to_string(i) + "]");
  }
  Result shown = c.Cli({"show", "--array", "1"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_NE(shown.out.find("Array 1: 20 jobs, at most 3 at once: 20 finished"),
            std::string::npos)
      << shown.out;
  Result one = c.Cli({"show", "5"});
  EXPECT_NE(one.out.find("Array:      1 (index 4, at most 3 at once"),
            std::string::npos)
      << one.out;
}

TEST(Arrays, AWholeArrayIsHeldReleasedAndCancelledByItsId) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 4);
  ASSERT_TRUE(c.WaitWorkers(1));
  Result submit =
      c.Cli({"submit", "-q", "--array", "0-5%1", "--", "sleep", "60"});
  ASSERT_EQ(submit.code, 0) << submit.err;
  EXPECT_EQ(submit.out, "1\n2\n3\n4\n5\n6\n");
  ASSERT_TRUE(c.WaitState(1, "JOB_STATE_RUNNING"));

  Result hold = c.Cli({"hold", "--array", "1"});
  ASSERT_EQ(hold.code, 0) << hold.err;
  EXPECT_EQ(hold.out,
            "job 2 held\njob 3 held\njob 4 held\njob 5 held\njob 6 held\n");
  EXPECT_EQ(ArrayJobs(c, "1", {"--state", "held"}).size(), 5u);
  Result again = c.Cli({"hold", "--array", "1"});
  EXPECT_EQ(again.out, "array 1: no queued job to hold\n");
  Result release = c.Cli({"release", "--array", "1"});
  ASSERT_EQ(release.code, 0) << release.err;
  EXPECT_EQ(ArrayJobs(c, "1", {"--state", "held"}).size(), 0u);

  Result cancel = c.Cli({"cancel", "--array", "1"});
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  for (int id = 1; id <= 6; ++id) {
    EXPECT_TRUE(c.WaitState(id, "JOB_STATE_CANCELLED")) << "job " << id;
  }
  Result shown = c.Cli({"show", "--array", "1", "--json"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  auto summary = nlohmann::json::parse(shown.out);
  EXPECT_EQ(summary["states"], nlohmann::json({{"cancelled", 6}})) << shown.out;
  EXPECT_EQ(summary["limit"], 1);
  EXPECT_EQ(c.Cli({"cancel", "--array", "1"}).out,
            "array 1: no queued or running job to cancel\n");

  Result unknown = c.Cli({"jobs", "--array", "7"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("no array 7"), std::string::npos) << unknown.err;
}

TEST(Arrays, BadArraysAreRefusedSayingWhatToWrite) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  Result backwards = c.Cli({"submit", "--array", "5-1", "--", "true"});
  EXPECT_NE(backwards.code, 0);
  EXPECT_NE(backwards.err.find("--array: '5-1' ends before it starts; write "
                               "the smaller index first (1-5)"),
            std::string::npos)
      << backwards.err;
  Result none = c.Cli({"submit", "--array", "0-9%0", "--", "true"});
  EXPECT_NE(none.err.find("--array: %0 would run none of its jobs"),
            std::string::npos)
      << none.err;
  Result many = c.Cli({"submit", "--array", "0-10000", "--", "true"});
  EXPECT_NE(many.err.find("makes 10001 jobs; an array makes at most 10000"),
            std::string::npos)
      << many.err;
  Result in_file = c.Cli({"submit", c.JobFile("bad.yaml",
                                              "command: [true]\n"
                                              "array: 3-9:0\n")});
  EXPECT_NE(in_file.err.find("bad.yaml:2:8: array: '3-9:0' has step 0"),
            std::string::npos)
      << in_file.err;
  Result listed = c.Cli({"jobs", "--json"});
  EXPECT_EQ(nlohmann::json::parse(listed.out)["jobs"].size(), 0u);
}

TEST(Sweeps, ASweepOverEnvAndArgsRunsOneCommandJobPerValueWithIt) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 4);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string job =
      c.JobFile("lr.yaml",
                "name: lr\n"
                "command: [sh, -c, 'echo \"LR=$LR args=$*\"', sh]\n"
                "sweep:\n"
                "  env.LR: ['0.1', '0.01', '0.001']\n"
                "  args: [[--fast], []]\n");
  Result submit = c.Cli({"submit", "--follow", job}, {}, 120000);
  ASSERT_EQ(submit.code, 0) << submit.out << submit.err;
  EXPECT_NE(submit.out.find("Submitted sweep 1: 6 jobs"), std::string::npos)
      << submit.out;
  Result listed = c.Cli({"jobs", "--sweep", "1", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  auto jobs = nlohmann::json::parse(listed.out)["jobs"];
  ASSERT_EQ(jobs.size(), 6u);
  std::map<std::string, int> seen;
  for (const auto& j : jobs) {
    const std::string id = std::to_string(JsonInt(j, "id"));
    EXPECT_EQ(j["state"], "finished") << j.dump();
    const std::string lr = j["spec"]["sweep_point"]["env.LR"];
    const std::string args = j["spec"]["sweep_point"]["args"];
    Result diary = c.Cli({"diary", id});
    const std::string want =
        "LR=" + lr + " args=" + (args == "(none)" ? "" : args) + "\n";
    EXPECT_NE(diary.out.find(want), std::string::npos)
        << "job " << id << ": " << diary.out;
    ++seen[lr];
  }
  EXPECT_EQ(seen, (std::map<std::string, int>{
                      {"0.1", 2}, {"0.01", 2}, {"0.001", 2}}));
}

}  // namespace
}  // namespace dlbatch::testing
