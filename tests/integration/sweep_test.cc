// A sweep end to end: three small train jobs on Fashion-MNIST through the
// real scheduler, worker and trainer, submitted, followed and compared with
// the real CLI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

// A tiny network and 40 iterations each, validated every 20: seconds per
// job on one CPU slot. Three learn rates, one job each.
std::string SweepJob() {
  const std::string data = kData;
  return "name: tiny\n"
         "pool: 1\n"
         "train:\n"
         "  network:\n"
         "    input: [28, 28, 1]\n"
         "    layers:\n"
         "      - {type: conv, filters: 4, size: 5, stride: 2}\n"
         "      - relu\n"
         "      - {type: fc, units: 10}\n"
         "      - softmax\n"
         "  data:\n"
         "    train: {format: idx, images: " +
         data + "/train-images-idx3-ubyte.gz, labels: " + data +
         "/train-labels-idx1-ubyte.gz}\n"
         "    validation: {format: idx, images: " +
         data + "/t10k-images-idx3-ubyte.gz, labels: " + data +
         "/t10k-labels-idx1-ubyte.gz}\n"
         "  options:\n"
         "    solver: sgdm\n"
         "    momentum: 0.9\n"
         "    mini_batch_size: 32\n"
         "    max_iterations: 40\n"
         "    validation_frequency: 20\n"
         "    execution_environment: cpu\n"
         "    seed: 1\n"
         "sweep:\n"
         "  initial_learn_rate: [0.00001, 0.05, 0.01]\n";
}

TEST(Sweep, ThreeJobsCompleteAndTheComparisonListsAllBestFirst) {
  if (access((std::string(kData) + "/train-images-idx3-ubyte.gz").c_str(),
             R_OK) != 0) {
    GTEST_SKIP() << "Fashion-MNIST is not in " << kData
                 << " (Debian's dataset-fashion-mnist)";
  }
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string job_file = c.JobFile("sweep.yaml", SweepJob());

  // --follow waits for every job of the sweep, then prints the comparison.
  Result submit = c.Cli({"submit", "--follow", job_file}, {}, 600000);
  ASSERT_EQ(submit.code, 0) << submit.out << submit.err;
  EXPECT_NE(submit.out.find("Submitted sweep 1: 3 jobs (1, 2, 3)"),
            std::string::npos)
      << submit.out;
  EXPECT_NE(submit.out.find("Sweep 1: 3 jobs, 3 finished"), std::string::npos)
      << submit.out;

  Result listed = c.Cli({"jobs", "--sweep", "1", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  auto jobs = nlohmann::json::parse(listed.out)["jobs"];
  ASSERT_EQ(jobs.size(), 3u) << listed.out;
  for (const auto& job : jobs) {
    EXPECT_EQ(job["state"], "finished") << job.dump();
    EXPECT_EQ(job["sweep_id"], 1) << job.dump();
  }

  Result shown = c.Cli({"show", "--sweep", "1"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  // Header, then one row per job, each with its learn rate and metrics.
  EXPECT_NE(shown.out.find("initial_learn_rate"), std::string::npos)
      << shown.out;
  for (const char* rate : {"0.00001", "0.05", "0.01"}) {
    EXPECT_NE(shown.out.find(rate), std::string::npos) << shown.out;
  }
  int rows = 0;
  for (size_t at = 0;
       (at = shown.out.find("validation", at)) != std::string::npos; ++at) {
    ++rows;
  }
  EXPECT_EQ(rows, 3) << shown.out;
  EXPECT_NE(shown.out.find("40/40"), std::string::npos) << shown.out;

  // Best first: validation accuracy never rises down the list.
  Result ranked = c.Cli({"show", "--sweep", "1", "--json"});
  ASSERT_EQ(ranked.code, 0) << ranked.err;
  auto order = nlohmann::json::parse(ranked.out)["jobs"];
  ASSERT_EQ(order.size(), 3u);
  double previous = 101;
  for (const auto& job : order) {
    ASSERT_TRUE(job["progress"].value("has_validation", false)) << job.dump();
    const double accuracy = job["progress"].value("validation_accuracy", 0.0);
    EXPECT_LE(accuracy, previous) << ranked.out;
    previous = accuracy;
  }
  // A learn rate of 1e-5 barely moves the weights in 40 steps: last.
  EXPECT_EQ(order[2]["spec"]["sweep_point"]["initial_learn_rate"], "0.00001")
      << ranked.out;

  // Each job names its sweep.
  Result one = c.Cli({"show", "2"});
  EXPECT_NE(one.out.find("Sweep:      1 (initial_learn_rate=0.05"),
            std::string::npos)
      << one.out;

  Result unknown = c.Cli({"show", "--sweep", "99"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("no sweep 99"), std::string::npos) << unknown.err;
  Result unknown_jobs = c.Cli({"jobs", "--sweep", "99"});
  EXPECT_EQ(unknown_jobs.code, 1);
}

TEST(Sweep, QuietSubmitPrintsTheJobIdsAndABadSweepIsRefusedBeforeUpload) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  // Only the ids matter here: the jobs are cancelled at once.
  const std::string file = c.JobFile("q.yaml", SweepJob());
  Result quiet = c.Cli({"submit", "-q", file});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.out, "1\n2\n3\n");
  c.Cli({"cancel", "1", "2", "3"});

  const std::string bad = c.JobFile(
      "bad.yaml", "command: [echo]\nsweep:\n  initial_learn_rate: [0.1]\n");
  Result refused = c.Cli({"submit", bad});
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.err.find("bad.yaml:3:3: sweep.initial_learn_rate: a "
                             "command: job has no train.options"),
            std::string::npos)
      << refused.err;
}

}  // namespace
}  // namespace dlbatch::testing
