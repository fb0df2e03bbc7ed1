// Progress from any program, end to end: a Python command job reports
// through the `dlbatch` module the worker puts on its PYTHONPATH (and
// writes garbage to $DLBATCH_PROGRESS by hand); the real scheduler shows
// the reports in `show --json` promptly, the job's outputs get the history
// CSV and plot, the metrics endpoint has its numbers, and the bad lines are
// counted in the diary without hurting anything.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <cmath>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

// The wall clock in seconds, as Python's time.time() gives it.
double Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

constexpr char kReporter[] = R"(import os, sys, time
import dlbatch
shared = sys.argv[1]
for i in range(1, 6):
    assert dlbatch.report(iteration=i, iterations=10, epoch=1, epochs=2,
                          loss=1.0 / i, accuracy=10.0 * i, learn_rate=0.1,
                          tokens_per_s=100 + i)
dlbatch.report(iteration=5, validation_loss=0.9, validation_accuracy=55.0)
# What a careless program might write: not JSON, a NaN token, a huge line.
with open(os.environ["DLBATCH_PROGRESS"], "w") as f:
    f.write("epoch 1 done\n")
    f.write('{"loss": NaN}\n')
    f.write('{"x": "' + "y" * 200000 + '"}\n')
time.sleep(0.5)
dlbatch.report(iteration=6, loss=0.123, grad_norm=float("nan"))
with open(os.path.join(shared, "reported.tmp"), "w") as f:
    f.write(repr(time.time()))
os.rename(os.path.join(shared, "reported.tmp"), os.path.join(shared, "reported"))
while not os.path.exists(os.path.join(shared, "go")):
    time.sleep(0.02)
print("stop file:", os.path.exists(os.environ["DLBATCH_STOP_FILE"]))
)";

TEST(CommandProgress, ReportsReachShowTheOutputsAndTheMetrics) {
  Cluster c;
  const int port = FreePort();
  c.StartScheduler({"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string shared = c.dir() + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0777), 0);
  WriteAll(c.dir() + "/report.py", kReporter);
  const int64_t id =
      c.Submit(c.JobFile("job.yaml",
                         "name: reporter\n"
                         "attach: [report.py]\n"
                         "command: [/usr/bin/python3, report.py, " +
                             shared + "]\n"));
  ASSERT_TRUE(
      WaitFor([&] { return ReadAll(shared + "/reported") != ""; }, 60000))
      << c.Cli({"diary", std::to_string(id)}).out;
  const double reported = std::stod(ReadAll(shared + "/reported"));
  // The report reaches `show --json` within a second.
  nlohmann::json seen;
  double seen_at = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        seen = c.ShowJson(id);
        seen_at = Now();
        return seen["progress"]["loss"].is_number() &&
               seen["progress"]["loss"].get<double>() == 0.123;
      },
      10000))
      << seen.dump(2);
  EXPECT_LT(seen_at - reported, 1.0)
      << "the report took " << seen_at - reported << " s to reach show";
  const nlohmann::json& p = seen["progress"];
  EXPECT_EQ(p["iteration"], 6);
  EXPECT_EQ(p["iterations"], 10);
  EXPECT_EQ(p["epochs"], 2);
  EXPECT_DOUBLE_EQ(p["accuracy"].get<double>(), 50.0);
  EXPECT_TRUE(p["has_validation"].get<bool>());
  EXPECT_DOUBLE_EQ(p["validation_accuracy"].get<double>(), 55.0);
  EXPECT_DOUBLE_EQ(p["metrics"]["tokens_per_s"].get<double>(), 105);
  EXPECT_TRUE(p["metrics"]["grad_norm"].is_null()) << "NaN shows as null";
  EXPECT_GT(p["eta_s"].get<double>(), 0);

  // `show` and `jobs` show it as a train job's.
  Result show = c.Cli({"show", std::to_string(id)});
  EXPECT_NE(show.out.find("iteration 6 of 10 (60%)"), std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find("Metrics:    grad_norm nan, tokens_per_s 105"),
            std::string::npos)
      << show.out;
  Result jobs = c.Cli({"jobs"});
  EXPECT_NE(jobs.out.find("60% 6/10 loss 0.123"), std::string::npos)
      << jobs.out;

  // Prometheus: the running job's numbers.
  const Http scrape = Get(port, "/metrics");
  ASSERT_EQ(scrape.status, 200);
  const std::string job = std::to_string(id);
  EXPECT_DOUBLE_EQ(
      Sample(scrape.body, "dlbatch_job_progress{field=\"iteration\",job=\"" +
                              job + "\",profile=\"local\",user=\"root\"}"),
      6)
      << scrape.body;
  EXPECT_DOUBLE_EQ(
      Sample(scrape.body, "dlbatch_job_metric{job=\"" + job +
                              "\",name=\"tokens_per_s\",profile=\"local\","
                              "user=\"root\"}"),
      105);

  WriteAll(shared + "/go", "");
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED", 60000))
      << c.Cli({"diary", std::to_string(id)}).out;
  const std::string diary = c.Cli({"diary", std::to_string(id)}).out;
  EXPECT_NE(diary.find("$DLBATCH_PROGRESS line 7 ignored: not JSON"),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("line 8 ignored: not JSON (NaN and Infinity"),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("line 9 ignored: longer than"), std::string::npos)
      << diary;
  EXPECT_NE(diary.find("$DLBATCH_PROGRESS: 10 line(s) read, 3 ignored"),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("stop file: False"), std::string::npos) << diary;
  // Gone from the metrics once it ended.
  const Http after = Get(port, "/metrics");
  EXPECT_EQ(after.body.find("job=\"" + job + "\""), std::string::npos);

  const std::string out = c.dir() + "/fetched";
  Result fetch = c.Cli({"fetch-outputs", std::to_string(id), "-o", out});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  const std::string csv = ReadAll(out + "/training_history.csv");
  EXPECT_EQ(
      csv.rfind("kind,iteration,epoch,time_s,loss,accuracy,learn_rate\n", 0),
      0u)
      << csv;
  int train_rows = 0, validation_rows = 0;
  for (size_t at = 0; (at = csv.find('\n', at)) != std::string::npos; ++at) {
    if (csv.compare(at + 1, 6, "train,") == 0) ++train_rows;
    if (csv.compare(at + 1, 11, "validation,") == 0) ++validation_rows;
  }
  EXPECT_EQ(train_rows, 6) << csv;
  EXPECT_EQ(validation_rows, 1) << csv;
  const std::string svg = ReadAll(out + "/training_progress.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("reporter"), std::string::npos);
}

// A job's own training_history.csv is kept; and should_stop() sees a
// cancel (the stop file) so the job can exit cleanly within the grace.
TEST(CommandProgress, TheJobsOwnHistoryWinsAndShouldStopSeesACancel) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  WriteAll(c.dir() + "/loop.py",
           "import os, time\n"
           "import dlbatch\n"
           "out = os.environ['DLBATCH_OUTPUT_DIR']\n"
           "open(os.path.join(out, 'training_history.csv'), 'w')"
           ".write('mine\\n')\n"
           "step = 0\n"
           "while not dlbatch.should_stop():\n"
           "    step += 1\n"
           "    dlbatch.report(iteration=step, loss=1.0)\n"
           "    time.sleep(0.05)\n"
           "open(os.path.join(out, 'why.txt'), 'w')"
           ".write(open(os.environ['DLBATCH_STOP_FILE']).read())\n");
  const int64_t id = c.Submit(c.JobFile(
      "job.yaml", "attach: [loop.py]\ncommand: [/usr/bin/python3, loop.py]\n"));
  ASSERT_TRUE(WaitFor(
      [&] {
        nlohmann::json j = c.ShowJson(id);
        return j["progress"]["iteration"].is_number() &&
               j["progress"]["iteration"].get<int>() >= 3;
      },
      60000))
      << c.Cli({"diary", std::to_string(id)}).out;
  ASSERT_EQ(c.Cli({"cancel", std::to_string(id)}).code, 0);
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_CANCELLED", 60000));
  const std::string out = c.dir() + "/fetched";
  ASSERT_EQ(c.Cli({"fetch-outputs", std::to_string(id), "-o", out}).code, 0);
  EXPECT_EQ(ReadAll(out + "/training_history.csv"), "mine\n");
  EXPECT_EQ(ReadAll(out + "/why.txt"), "cancelled\n")
      << "the job did not exit through should_stop() within the grace: "
      << c.Cli({"diary", std::to_string(id)}).out;
  EXPECT_NE(ReadAll(out + "/training_progress.svg").find("<svg"),
            std::string::npos);
}

}  // namespace
}  // namespace dlbatch::testing

namespace dlbatch::testing {
namespace {

bool HaveTorch() {
  return Exec({"/usr/bin/python3", "-c", "import torch"}).code == 0;
}

// A PyTorch command job checkpointing every 20 steps through the module;
// its worker is killed (-9) mid-run; attempt 2, on the other worker, finds
// the stored checkpoint laid out again in $DLBATCH_CHECKPOINT_DIR and ends
// with exactly the weights of a run never interrupted.
TEST(CommandCheckpoints, AResumedRunEndsWithTheUninterruptedRunsWeights) {
  if (!HaveTorch()) {
    GTEST_SKIP() << "Debian's python3-torch is not installed for "
                    "/usr/bin/python3";
  }
  const std::string script = std::string(DLBATCH_SOURCE_DIR) +
                             "/tests/integration/data/checkpointed_train.py";
  Cluster c;
  c.StartScheduler();
  const int a = c.StartWorker("a", 1);
  const int b = c.StartWorker("b", 1);
  ASSERT_TRUE(c.WaitWorkers(2));
  WriteAll(c.dir() + "/train.py", ReadAll(script));
  // The reference: the same script, never interrupted.
  const int64_t whole = c.Submit(
      c.JobFile("whole.yaml",
                "name: whole\nattach: [train.py]\n"
                "command: [/usr/bin/python3, train.py, '100', '0']\n"));
  Result wait = c.Cli({"wait", std::to_string(whole)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << c.Cli({"diary", std::to_string(whole)}).out;
  ASSERT_EQ(
      c.Cli({"fetch-outputs", std::to_string(whole), "-o", c.dir() + "/whole"})
          .code,
      0);
  const std::string reference = ReadAll(c.dir() + "/whole/weights.txt");
  ASSERT_FALSE(reference.empty());

  const int64_t id = c.Submit(
      c.JobFile("job.yaml",
                "name: resumed\nattach: [train.py]\n"
                "command: [/usr/bin/python3, train.py, '100', '0.1']\n"));
  nlohmann::json show;
  ASSERT_TRUE(WaitFor(
      [&] {
        show = c.ShowJson(id);
        return JsonInt(show["progress"], "checkpoint_iteration") >= 40;
      },
      120000))
      << c.Cli({"diary", std::to_string(id)}).out;
  ASSERT_EQ(show["placement"].size(), 1u);
  const std::string first = show["placement"][0].value("worker_name", "");
  const int64_t stored = JsonInt(show["progress"], "checkpoint_iteration");
  ASSERT_LT(stored, 100) << "the job ended before its worker was killed";
  c.KillWorker(first == "a" ? a : b, SIGKILL);

  wait = c.Cli({"wait", std::to_string(id)}, {}, 180000);
  const std::string diary = c.Cli({"diary", std::to_string(id)}).out;
  ASSERT_EQ(wait.code, 0) << diary << c.Logs();
  show = c.ShowJson(id);
  EXPECT_EQ(show.value("attempt", 0), 2);
  EXPECT_NE(show["placement"][0].value("worker_name", ""), first);
  EXPECT_NE(diary.find("resuming from the stored checkpoint of step "),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("resumed at step "), std::string::npos) << diary;
  ASSERT_EQ(
      c.Cli({"fetch-outputs", std::to_string(id), "-o", c.dir() + "/resumed"})
          .code,
      0);
  EXPECT_EQ(ReadAll(c.dir() + "/resumed/weights.txt"), reference);
}

}  // namespace
}  // namespace dlbatch::testing
