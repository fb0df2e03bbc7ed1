// Train jobs through the real scheduler and workers on CPU slots: the
// embedded trainer's ranks meet at the scheduler's rendezvous, progress and
// checkpoints flow back, outputs are fetched, and a lost worker's job
// resumes from its stored checkpoint elsewhere.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"
#include "tests/integration/train_weights.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"

namespace dlbatch::testing {
namespace {

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

bool HaveData() {
  return std::filesystem::exists(std::string(kDataDir) +
                                 "/train-images-idx3-ubyte.gz");
}

class TrainJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveData())
      GTEST_SKIP() << "Fashion-MNIST is not in " << kDataDir
                   << " (Debian's dataset-fashion-mnist)";
    // The workers' trainers inherit it: their kernel choices stay in this test.
    setenv("XDG_CACHE_HOME", (c_.dir() + "/cache").c_str(), 1);
  }
  void TearDown() override { unsetenv("XDG_CACHE_HOME"); }

  nlohmann::json Progress(int64_t id) {
    return c_.ShowJson(id).value("progress", nlohmann::json());
  }

  std::vector<float> FetchWeights(int64_t id, const std::string& into) {
    return FetchTrainedWeights(c_, id, into);
  }

  std::string Logs() { return c_.Logs(); }

  Cluster c_;
};

TEST_F(TrainJobs, PoolTwoOnCpuSlotsReachesAccuracyAndDeliversItsOutputs) {
  c_.StartScheduler();
  c_.StartWorker("w1", 2);
  ASSERT_TRUE(c_.WaitWorkers(1));
  std::filesystem::create_directories(c_.dir() + "/data");
  for (const char* f :
       {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    std::filesystem::copy_file(std::string(kDataDir) + "/" + f,
                               c_.dir() + "/data/" + f);
  }
  const int64_t id = c_.Submit(c_.JobFile(
      "lenet.yaml", LenetJob("data", R"(    mini_batch_size: 64
    max_iterations: 300
    validation_frequency: 100
    verbose_frequency: 50
    checkpoint_frequency: 100
    checkpoint_frequency_unit: iteration
)",
                             "name: lenet\npool: 2\nattach: [data/]\n")));

  // Progress reaches the scheduler while the job runs.
  bool seen_running = WaitFor(
      [&] {
        nlohmann::json p = Progress(id);
        return JsonInt(p, "iteration") > 0 && !p.value("done", false);
      },
      60000);
  EXPECT_TRUE(seen_running) << Logs();
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err
                          << c_.Cli({"diary", std::to_string(id)}).out
                          << Logs();

  nlohmann::json show = c_.ShowJson(id);
  ASSERT_EQ(show["placement"].size(), 1u);
  EXPECT_EQ(show["placement"][0]["devices"].size(), 2u);
  nlohmann::json p = show["progress"];
  EXPECT_EQ(JsonInt(p, "iteration"), 300);
  EXPECT_EQ(JsonInt(p, "iterations"), 300);
  EXPECT_TRUE(p.value("done", false));
  EXPECT_EQ(JsonInt(p, "checkpoint_iteration"), 300);
  EXPECT_GE(p.value("validation_accuracy", 0.0), 75.0) << p.dump();
  EXPECT_EQ(show["checkpoint"].size(), 2u);

  Result human = c_.Cli({"show", std::to_string(id)});
  EXPECT_NE(human.out.find("iteration 300 of 300"), std::string::npos)
      << human.out;
  Result jobs = c_.Cli({"jobs"});
  EXPECT_NE(jobs.out.find("PROGRESS"), std::string::npos) << jobs.out;
  EXPECT_NE(jobs.out.find("100% 300/300"), std::string::npos) << jobs.out;
  Result diary = c_.Cli({"diary", std::to_string(id)});
  EXPECT_NE(diary.out.find("Mini-batch"), std::string::npos) << diary.out;
  EXPECT_NE(diary.out.find("Training finished: 300 iterations"),
            std::string::npos)
      << diary.out;

  Result list = c_.Cli({"fetch-outputs", std::to_string(id), "--list"});
  ASSERT_EQ(list.code, 0) << list.err;
  for (const char* f : {"model.onnx", "checkpoint.dlbc", "training_history.csv",
                        "metrics.json", "training_progress.svg"}) {
    EXPECT_NE(list.out.find(f), std::string::npos) << f << " missing:\n"
                                                   << list.out;
  }
  const std::string out = c_.dir() + "/fetched";
  Result fetch = c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
  ASSERT_EQ(fetch.code, 0) << fetch.out << fetch.err;
  nlohmann::json metrics =
      nlohmann::json::parse(ReadAll(out + "/metrics.json"));
  EXPECT_EQ(metrics.value("ranks", 0), 2);
  // The worker's two CPU slots: one trainer process, a rank on each of its
  // two threads.
  EXPECT_EQ(metrics.value("processes", 0), 1);
  EXPECT_EQ(metrics.value("threads_per_process", 0), 2);
  EXPECT_EQ(metrics.value("replicas", 0), 2);
  EXPECT_NE(diary.out.find(": 1 process, 2 threads, each mini-batch of 64 "
                           "split over 2 replicas;"),
            std::string::npos)
      << diary.out;
  EXPECT_GE(metrics.value("validation_accuracy", 0.0), 75.0) << metrics.dump();
  EXPECT_GT(std::filesystem::file_size(out + "/model.onnx"), 100000u);
}

TEST_F(TrainJobs, AJobSpanningTwoWorkersTrainsAsOneWorkerDoes) {
  c_.StartScheduler();
  const int a = c_.StartWorker("a", 1, "local", {"--host", "127.0.0.1"});
  const int b = c_.StartWorker("b", 1, "local", {"--host", "127.0.0.1"});
  ASSERT_TRUE(c_.WaitWorkers(2));
  const std::string options = R"(    mini_batch_size: 32
    max_iterations: 12
    verbose_frequency: 4
)";
  const std::string data = kDataDir;
  const int64_t spread = c_.Submit(c_.JobFile(
      "spread.yaml",
      LenetJob(data, options, "name: spread\npool: 2\nmax_nodes: 2\n")));
  Result wait = c_.Cli({"wait", std::to_string(spread)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(spread)}).out
                          << Logs();
  EXPECT_EQ(c_.ShowJson(spread)["placement"].size(), 2u);
  std::vector<float> two_workers = FetchWeights(spread, c_.dir() + "/spread");

  // The same job on one worker of two slots.
  c_.KillWorker(a, SIGTERM);
  c_.KillWorker(b, SIGTERM);
  c_.StartWorker("pair", 2, "pair");
  ASSERT_TRUE(WaitFor(
      [&] { return c_.Cli({"workers"}).out.find("pair") != std::string::npos; },
      15000));
  const int64_t single = c_.Submit(c_.JobFile(
      "single.yaml",
      LenetJob(data, options, "name: single\nprofile: pair\npool: 2\n")));
  wait = c_.Cli({"wait", std::to_string(single)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(single)}).out
                          << Logs();
  EXPECT_EQ(c_.ShowJson(single)["placement"].size(), 1u);
  std::vector<float> one_worker = FetchWeights(single, c_.dir() + "/single");

  ASSERT_EQ(two_workers.size(), one_worker.size());
  ASSERT_FALSE(one_worker.empty());
  EXPECT_LT(RelativeDifference(two_workers, one_worker), 1e-5);
}

// The dlbatch-train processes running now whose command line names
// `within` (a test's folder).
int TrainersRunning(const std::string& within) {
  int n = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string cmdline = ReadAll(it->path().string() + "/cmdline");
    const std::string program = cmdline.substr(0, cmdline.find('\0'));
    if (program.size() >= 13 &&
        program.compare(program.size() - 13, 13, "dlbatch-train") == 0 &&
        cmdline.find(within) != std::string::npos) {
      ++n;
    }
  }
  return n;
}

// Two workers of two CPU slots each: one trainer process on each, its two
// ranks on its threads, the processes meeting over Gloo; the four ranks
// train to one rank's weights (within the rounding that four ranks' sums
// and max pooling's ties make, as train_run_test's four ranks against
// one).
TEST_F(TrainJobs, TwoWorkersOfTwoSlotsAreTwoProcessesOfTwoThreadRanks) {
  c_.StartScheduler();
  const int a = c_.StartWorker("a", 2, "local", {"--host", "127.0.0.1"});
  const int b = c_.StartWorker("b", 2, "local", {"--host", "127.0.0.1"});
  ASSERT_TRUE(c_.WaitWorkers(2));
  const std::string options = R"(    mini_batch_size: 32
    max_iterations: 12
    verbose_frequency: 4
)";
  const std::string data = kDataDir;
  const int64_t spread = c_.Submit(c_.JobFile(
      "spread.yaml",
      LenetJob(data, options, "name: spread\npool: 4\nmax_nodes: 2\n")));
  // How many trainer processes the job has at once, at most.
  int most = 0;
  WaitFor(
      [&] {
        most = std::max(most, TrainersRunning(c_.dir()));
        const std::string state = c_.State(spread);
        return state != "JOB_STATE_QUEUED" && state != "JOB_STATE_RUNNING";
      },
      180000);
  Result wait = c_.Cli({"wait", std::to_string(spread)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(spread)}).out
                          << Logs();
  EXPECT_EQ(c_.ShowJson(spread)["placement"].size(), 2u);
  EXPECT_EQ(most, 2);
  const std::string diary = c_.Cli({"diary", std::to_string(spread)}).out;
  EXPECT_NE(diary.find(": 2 processes, 2 threads each, each mini-batch of 32 "
                       "split over 4 replicas;"),
            std::string::npos)
      << diary;
  std::vector<float> four = FetchWeights(spread, c_.dir() + "/spread");
  nlohmann::json metrics =
      nlohmann::json::parse(ReadAll(c_.dir() + "/spread/metrics.json"));
  EXPECT_EQ(metrics.value("processes", 0), 2);
  EXPECT_EQ(metrics.value("replicas", 0), 4);
  EXPECT_EQ(metrics.value("threads_per_process", 0), 2);

  // The same job as one rank, on a worker of one slot.
  c_.KillWorker(a, SIGTERM);
  c_.KillWorker(b, SIGTERM);
  c_.StartWorker("one", 1, "one");
  ASSERT_TRUE(WaitFor(
      [&] { return c_.Cli({"workers"}).out.find("one") != std::string::npos; },
      15000));
  const int64_t single = c_.Submit(c_.JobFile(
      "single.yaml",
      LenetJob(data, options, "name: single\nprofile: one\npool: 1\n")));
  wait = c_.Cli({"wait", std::to_string(single)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(single)}).out
                          << Logs();
  std::vector<float> one = FetchWeights(single, c_.dir() + "/single");
  ASSERT_EQ(four.size(), one.size());
  ASSERT_FALSE(one.empty());
  EXPECT_LT(RelativeDifference(four, one), 1e-4);
}

// A cancelled pool-2 job on CPU slots: its one trainer process (both ranks
// on its threads) is gone when the job is cancelled.
TEST_F(TrainJobs, CancellingACpuJobEndsItsOneTrainerProcess) {
  c_.StartScheduler();
  c_.StartWorker("w1", 2);
  ASSERT_TRUE(c_.WaitWorkers(1));
  const int64_t id =
      c_.Submit(c_.JobFile("long.yaml", LenetJob(kDataDir,
                                                 "    mini_batch_size: 64\n"
                                                 "    max_iterations: 100000\n",
                                                 "name: long\npool: 2\n")));
  ASSERT_TRUE(
      WaitFor([&] { return JsonInt(Progress(id), "iteration") > 0; }, 120000))
      << c_.Cli({"diary", std::to_string(id)}).out << Logs();
  EXPECT_EQ(TrainersRunning(c_.dir()), 1);
  Result cancel = c_.Cli({"cancel", std::to_string(id)});
  ASSERT_EQ(cancel.code, 0) << cancel.out << cancel.err;
  EXPECT_TRUE(c_.WaitState(id, "JOB_STATE_CANCELLED", 60000)) << c_.State(id);
  EXPECT_TRUE(WaitFor([&] { return TrainersRunning(c_.dir()) == 0; }, 15000));
}

// TCP is always TLS: the ranks of a job spread over workers meet at the
// scheduler over TLS too, trusting the CA their worker does (handed to them
// as PEM: a job may not be able to read the worker's CA file).
TEST_F(TrainJobs, AJobSpanningTwoWorkersMeetsAtATlsScheduler) {
  c_.StartScheduler({}, "127.0.0.1:0");
  // The CLI and the workers take the token from the environment.
  struct TokenEnv {
    explicit TokenEnv(const std::string& token) {
      setenv("DLBATCH_TOKEN", token.c_str(), 1);
    }
    ~TokenEnv() { unsetenv("DLBATCH_TOKEN"); }
  } token(ReadAll(c_.scheduler_state() + "/token").substr(0, 64));
  c_.StartWorker("a", 1, "local", {"--host", "127.0.0.1"});
  c_.StartWorker("b", 1, "local", {"--host", "127.0.0.1"});
  ASSERT_TRUE(c_.WaitWorkers(2)) << Logs();
  const int64_t spread = c_.Submit(c_.JobFile(
      "spread.yaml", LenetJob(kDataDir,
                              "    mini_batch_size: 32\n"
                              "    max_iterations: 4\n",
                              "name: spread\npool: 2\nmax_nodes: 2\n")));
  Result wait = c_.Cli({"wait", std::to_string(spread)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(spread)}).out
                          << Logs();
  EXPECT_EQ(c_.ShowJson(spread)["placement"].size(), 2u);
}

TEST_F(TrainJobs, AJobOfALostWorkerResumesFromItsCheckpointOnAnother) {
  c_.StartScheduler(
      {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "1500ms"});
  const int a = c_.StartWorker("a", 1);
  const int b = c_.StartWorker("b", 1);
  ASSERT_TRUE(c_.WaitWorkers(2));
  const int64_t id = c_.Submit(
      c_.JobFile("resume.yaml", LenetJob(kDataDir, R"(    mini_batch_size: 64
    max_iterations: 500
    verbose_frequency: 100
    checkpoint_frequency: 100
    checkpoint_frequency_unit: iteration
)",
                                         "name: resume\npool: 1\n")));
  ASSERT_TRUE(WaitFor(
      [&] { return JsonInt(Progress(id), "checkpoint_iteration") >= 100; },
      90000))
      << c_.Cli({"diary", std::to_string(id)}).out << Logs();
  nlohmann::json show = c_.ShowJson(id);
  ASSERT_EQ(show["placement"].size(), 1u);
  const std::string first = show["placement"][0].value("worker_name", "");
  const int64_t stored = JsonInt(show["progress"], "checkpoint_iteration");
  ASSERT_LT(stored, 500) << "the job ended before its worker could be killed";
  c_.KillWorker(first == "a" ? a : b, SIGKILL);

  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(id)}).out
                          << Logs();
  show = c_.ShowJson(id);
  EXPECT_EQ(show.value("attempt", 0), 2);
  EXPECT_NE(show["placement"][0].value("worker_name", ""), first);
  EXPECT_EQ(JsonInt(show["progress"], "iteration"), 500);

  const std::string diary = c_.Cli({"diary", std::to_string(id)}).out;
  EXPECT_NE(diary.find("resumes from the checkpoint stored at iteration"),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("Resuming from"), std::string::npos) << diary;

  // The history runs from 1 to 500 with no gap and no repeat.
  const std::string out = c_.dir() + "/fetched";
  Result fetch = c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  absl::StatusOr<trainer::TrainingHistory> history =
      trainer::ParseHistoryCsv(ReadAll(out + "/training_history.csv"));
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->iterations.size(), 500u);
  for (size_t i = 0; i < history->iterations.size(); ++i) {
    ASSERT_EQ(history->iterations[i].iteration, static_cast<int64_t>(i + 1));
  }
  nlohmann::json metrics =
      nlohmann::json::parse(ReadAll(out + "/metrics.json"));
  EXPECT_TRUE(metrics.value("resumed", false));
}

// `dlbatch requeue` of a running train job: stopped, queued again as
// attempt 2, and resumed from its last stored checkpoint.
TEST_F(TrainJobs, ARequeuedTrainJobResumesFromItsCheckpoint) {
  c_.StartScheduler();
  c_.StartWorker("a", 1);
  ASSERT_TRUE(c_.WaitWorkers(1));
  const int64_t id = c_.Submit(
      c_.JobFile("requeue.yaml", LenetJob(kDataDir, R"(    mini_batch_size: 64
    max_iterations: 400
    verbose_frequency: 100
    checkpoint_frequency: 100
    checkpoint_frequency_unit: iteration
)",
                                          "name: requeue\npool: 1\n")));
  ASSERT_TRUE(WaitFor(
      [&] { return JsonInt(Progress(id), "checkpoint_iteration") >= 100; },
      90000))
      << c_.Cli({"diary", std::to_string(id)}).out << Logs();
  const int64_t stored = JsonInt(Progress(id), "checkpoint_iteration");
  ASSERT_LT(stored, 400) << "the job ended before it could be requeued";
  Result requeue = c_.Cli({"requeue", std::to_string(id)});
  ASSERT_EQ(requeue.code, 0) << requeue.err;

  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out
                          << c_.Cli({"diary", std::to_string(id)}).out
                          << Logs();
  nlohmann::json show = c_.ShowJson(id);
  EXPECT_EQ(show.value("attempt", 0), 2);
  EXPECT_EQ(JsonInt(show["progress"], "iteration"), 400);
  const std::string diary = c_.Cli({"diary", std::to_string(id)}).out;
  EXPECT_NE(diary.find("resumes from the checkpoint stored at iteration"),
            std::string::npos)
      << diary;
  // No iteration twice, none missing.
  const std::string out = c_.dir() + "/fetched";
  Result fetch = c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  absl::StatusOr<trainer::TrainingHistory> history =
      trainer::ParseHistoryCsv(ReadAll(out + "/training_history.csv"));
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->iterations.size(), 400u);
  for (size_t i = 0; i < history->iterations.size(); ++i) {
    ASSERT_EQ(history->iterations[i].iteration, static_cast<int64_t>(i + 1));
  }
}

// Submit refuses a data path missing here (bad_input_test); one said to be
// on the workers' own filesystem (--data-on-workers) and missing there too
// fails the job with the trainer's reason.
TEST_F(TrainJobs, AMissingDataFileFailsTheJobWithTheTrainersReason) {
  c_.StartScheduler();
  c_.StartWorker("w1", 2);
  ASSERT_TRUE(c_.WaitWorkers(1));
  const int64_t id = c_.Submit(
      c_.JobFile("missing.yaml",
                 LenetJob("/nonexistent/fashion", "    max_iterations: 5\n",
                          "name: missing\npool: 2\n")),
      {"--data-on-workers"});
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 60000);
  EXPECT_NE(wait.code, 0);
  nlohmann::json show = c_.ShowJson(id);
  EXPECT_EQ(show.value("state", ""), "failed");
  // The reason names the file, not just an exit code; the diary has it too.
  const std::string reason = show.value("reason", "");
  EXPECT_NE(reason.find("/nonexistent/fashion/train-images-idx3-ubyte.gz"),
            std::string::npos)
      << reason;
  EXPECT_NE(
      c_.Cli({"diary", std::to_string(id)}).out.find("/nonexistent/fashion"),
      std::string::npos);
  // A failed job is not retried as if its worker had been lost.
  EXPECT_EQ(show.value("attempt", 0), 1);
}

}  // namespace
}  // namespace dlbatch::testing
