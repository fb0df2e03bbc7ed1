// dlbatch-train --thread-ranks, as a worker starts a CPU job: a machine's
// ranks as threads of one process, each its own rank as a process would
// be, and across machines one such process each, meeting over Gloo. They
// train to the weights of ranks that are processes, resume from their
// checkpoints, and say how they are laid out.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::ReadAll;
using dlbatch::testing::Result;
using testing::RelativeDifference;

// conv -> batchnorm -> relu -> fc: a batch norm whose statistics are each
// rank's own (not synced), which ranks on threads keep as processes do.
const char kConvBn[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 8, size: 5, stride: 2}
      - {type: batchnorm}
      - {type: relu}
      - {type: fc, units: 10}
      - {type: softmax}
)";

const char kOptions[] = R"(
    solver: sgdm
    initial_learn_rate: 0.05
    momentum: 0.9
    mini_batch_size: 32
    shuffle: every-epoch
    verbose_frequency: 1000
    checkpoint_frequency: 4
    checkpoint_frequency_unit: iteration
    seed: 5
)";

class ThreadRanksRun : public testing::TrainRunFixture {
 protected:
  std::string Job(const std::string& name, const std::string& network) {
    return WriteJob(name, testing::FashionMnistJobText(name, network, kOptions,
                                                       /*validation=*/false));
  }
  nlohmann::json Metrics(const std::string& out) {
    return nlohmann::json::parse(ReadAll(out + "/metrics.json"));
  }
};

TEST_F(ThreadRanksRun, RanksOnThreadsTrainAsRanksOfProcessesDo) {
  const std::string job = Job("bn", kConvBn);
  const std::vector<std::string> two = {"--max-iterations", "6", "--ranks", "2",
                                        "--threads",        "1"};
  Result processes = RunTrain(job, dir_ + "/processes", two);
  ASSERT_EQ(processes.code, 0) << processes.out << processes.err;
  std::vector<std::string> threads_args = two;
  threads_args.push_back("--thread-ranks");
  Result threads = RunTrain(job, dir_ + "/threads", threads_args);
  ASSERT_EQ(threads.code, 0) << threads.out << threads.err;

  // The same kernels (the test's tuning cache), the same slices and a sum
  // of two, whose order changes no bit: the same weights and statistics.
  const Checkpoint p = LastCheckpoint(dir_ + "/processes");
  const Checkpoint t = LastCheckpoint(dir_ + "/threads");
  ASSERT_FALSE(p.params.empty());
  EXPECT_EQ(t.params, p.params);
  EXPECT_EQ(t.state, p.state);

  // What each says of its layout.
  EXPECT_NE(threads.out.find(": 1 process, 2 threads, each mini-batch of 32 "
                             "split over 2 replicas;"),
            std::string::npos)
      << threads.out;
  nlohmann::json m = Metrics(dir_ + "/threads");
  EXPECT_EQ(m["processes"], 1);
  EXPECT_EQ(m["threads_per_process"], 2);
  EXPECT_EQ(m["replicas"], 2);
  EXPECT_EQ(m["ranks"], 2);
  EXPECT_EQ(m["replicas_per_process"], nlohmann::json::array({2}));
  EXPECT_EQ(m["split_batch"], false);
  EXPECT_NE(processes.out.find(": 2 processes, 1 thread each, each "
                               "mini-batch of 32 split over 2 replicas;"),
            std::string::npos)
      << processes.out;
  m = Metrics(dir_ + "/processes");
  EXPECT_EQ(m["processes"], 2);
  EXPECT_EQ(m["threads_per_process"], 1);
  EXPECT_EQ(m["replicas"], 2);

  // Stopped at its checkpoint of 4, resumed to 6: the uninterrupted run's
  // weights.
  std::vector<std::string> part = threads_args;
  part[1] = "4";
  const std::string out = dir_ + "/resumed";
  Result first = RunTrain(job, out, part);
  ASSERT_EQ(first.code, 0) << first.err;
  std::vector<std::string> rest = threads_args;
  rest.push_back("--resume");
  Result second = RunTrain(job, out, rest);
  ASSERT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("Resuming from"), std::string::npos) << second.out;
  EXPECT_EQ(FinalParams(out), t.params);
}

// Two processes of two thread ranks each, meeting in a folder as the
// processes of two machines would: one run of four ranks, within rounding
// of four ranks that are processes (their sums are added in another
// order).
TEST_F(ThreadRanksRun, TwoProcessesOfThreadRanksTrainAsFourRanks) {
  const std::string job = Job("lenet", dlbatch::testing::kLenetNetworkYaml);
  const std::string rendezvous = dir_ + "/rendezvous";
  std::vector<Result> parts(2);
  std::vector<std::thread> machines;
  for (int p = 0; p < 2; ++p) {
    machines.emplace_back([&, p] {
      parts[p] = RunTrain(job, dir_ + "/spread",
                          {"--max-iterations", "4", "--thread-ranks", "--ranks",
                           "2", "--first-rank", absl::StrCat(2 * p), "--world",
                           "4", "--threads", "1", "--rendezvous", rendezvous});
    });
  }
  for (std::thread& t : machines) t.join();
  for (const Result& r : parts) ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(parts[0].out.find(": 2 processes, 2 threads each, each "
                              "mini-batch of 32 split over 4 replicas;"),
            std::string::npos)
      << parts[0].out;
  // Rank 0's process alone writes the diary and the outputs.
  EXPECT_EQ(parts[1].out.find("Training on"), std::string::npos)
      << parts[1].out;
  nlohmann::json m = Metrics(dir_ + "/spread");
  EXPECT_EQ(m["processes"], 2);
  EXPECT_EQ(m["replicas"], 4);
  EXPECT_EQ(m["replicas_per_process"], nlohmann::json::array({2, 2}));

  Result four =
      RunTrain(job, dir_ + "/four",
               {"--max-iterations", "4", "--ranks", "4", "--threads", "1"});
  ASSERT_EQ(four.code, 0) << four.out << four.err;
  const std::vector<float> spread = FinalParams(dir_ + "/spread");
  const std::vector<float> processes = FinalParams(dir_ + "/four");
  ASSERT_EQ(spread.size(), processes.size());
  ASSERT_FALSE(spread.empty());
  // As FourRanksTrainLenetToTheWeightsOfOne compares 4 ranks with 1.
  EXPECT_LT(RelativeDifference(spread, processes), 1e-4);
}

}  // namespace
}  // namespace dlbatch::trainer
