// A train job that Slurm itself preempts, on a real Slurm
// (tests/slurm/slurm-cluster.sh: partition low is preempted for high's
// jobs, PreemptMode=CANCEL with a GraceTime of 15 s), through the real
// scheduler, ephemeral worker, trainer and CLI. Slurm sends SIGTERM to
// every process of the job: its worker, and the trainer's launcher and
// ranks, which the worker starts with --stop-on-term. The ranks agree on a
// step, write its checkpoint and leave before the grace; the job is queued
// again as preempted and resumes from that checkpoint to the model an
// uninterrupted run gives, bit for bit.
//
// Label slurm: the test skips, saying why, where Slurm cannot start.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

namespace fs = std::filesystem;

class SlurmPreemptTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/dlbatch-slurm-preempt-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      skip_ = "cannot make a temp folder";
      return;
    }
    rig_ = tmpl;
    chmod(tmpl, 0711);  // Slurm runs other users' jobs from inside it
    const int rc =
        system(absl::StrCat(DLBATCH_SLURM_CLUSTER_SCRIPT, " start ", rig_,
                            "/slurm 2 >", rig_, "/start.log 2>&1")
                   .c_str());
    started_ = true;
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
      skip_ =
          absl::StrCat("Slurm cannot run here: ", ReadAll(rig_ + "/start.log"));
      return;
    }
    setenv("SLURM_CONF", (rig_ + "/slurm/slurm.conf").c_str(), 1);
  }
  static void TearDownTestSuite() {
    if (started_) {
      (void)system(
          absl::StrCat(DLBATCH_SLURM_CLUSTER_SCRIPT, " stop ", rig_, "/slurm")
              .c_str());
    }
    if (!rig_.empty()) fs::remove_all(rig_);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    if (!fs::exists(BinDir() + "/dlbatch-train")) {
      GTEST_SKIP() << BinDir()
                   << "/dlbatch-train is not built (cmake --build build "
                      "--target dlbatch-train)";
    }
    if (!fs::exists(FashionMnistDir() + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << FashionMnistDir();
    }
    node_dir_ = c_.dir() + "/nodes";
    fs::create_directories(node_dir_);
    // `low` runs in the partition Slurm preempts for high's jobs.
    const std::string config = c_.dir() + "/scheduler.yaml";
    WriteAll(config,
             absl::StrCat("profiles:\n"
                          "  low:\n"
                          "    type: slurm\n"
                          "    partition: low\n"
                          "    gpus_per_node: 2\n"
                          "    bin_dir: ",
                          BinDir(), "\n    node_dir: ", node_dir_, "\n"));
    c_.StartScheduler({"--config", config, "--heartbeat-timeout", "5s"},
                      "127.0.0.1:0");
    std::string token = ReadAll(c_.scheduler_state() + "/token");
    while (!token.empty() && token.back() == '\n') token.pop_back();
    setenv("DLBATCH_TOKEN", token.c_str(), 1);
  }
  void TearDown() override {
    if (HasFailure() && skip_.empty()) {
      std::cerr << Exec({"squeue", "-h", "--states=all"}).out << c_.Logs();
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(node_dir_, ec)) {
        if (e.path().extension() == ".out") {
          std::cerr << "--- " << e.path() << "\n" << ReadAll(e.path());
        }
      }
    }
    // Nothing of this test is left in Slurm for the next.
    Exec({"scancel", "--partition=low"});
    Exec({"scancel", "--partition=high"});
  }

  // A pool-2 LeNet on the CPU (two rank processes under the launcher, a
  // fake GPU each) with no checkpoint before its end unless asked for, long
  // enough (1,200 iterations) that Slurm preempts it before it ends on a quiet
  // machine too.
  int64_t Lenet(const std::string& file) {
    return c_.Submit(c_.JobFile(
        file + ".yaml", LenetJob(FashionMnistDir(), R"(    mini_batch_size: 64
    max_iterations: 1200
    verbose_frequency: 50
    execution_environment: cpu
)",
                                 "name: lenet\nprofile: low\npool: 2\n")));
  }
  std::string ModelSha(int64_t id) {
    const std::string out = c_.dir() + "/out-" + std::to_string(id);
    Result fetch =
        c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
    EXPECT_EQ(fetch.code, 0) << fetch.err;
    return Exec({"sha256sum", out + "/model.onnx"}).out.substr(0, 64);
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }

  static inline std::string rig_;
  static inline std::string skip_;
  static inline bool started_ = false;
  Cluster c_;
  std::string node_dir_;
};

TEST_F(SlurmPreemptTrain,
       ATrainJobSlurmPreemptsResumesFromTheSignalsCheckpoint) {
  const int64_t reference = Lenet("reference");
  Result wait = c_.Cli({"wait", std::to_string(reference)}, {}, 300000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(reference);
  const std::string want = ModelSha(reference);
  ASSERT_EQ(want.size(), 64u);

  const int64_t id = Lenet("preempted");
  ASSERT_TRUE(WaitFor(
      [&] {
        return JsonInt(c_.ShowJson(id).value("progress", nlohmann::json()),
                       "iteration") >= 20;
      },
      180000))
      << Diary(id);
  // Both nodes for a job of partition high: Slurm preempts the low job.
  Result high = Exec({"sbatch", "--parsable", "--partition=high", "--nodes=2",
                      "--gres=gpu:2", "--job-name=high-preemptor",
                      absl::StrCat("--output=", node_dir_, "/high-%j.out"),
                      "--wrap", "sleep 8"});
  ASSERT_EQ(high.code, 0) << high.out << high.err;
  wait = c_.Cli({"wait", std::to_string(id)}, {}, 300000);
  const nlohmann::json show = c_.ShowJson(id);
  ASSERT_EQ(wait.code, 0) << wait.out << show.dump(2) << Diary(id);
  EXPECT_EQ(show.value("attempt", 0), 2) << show.dump(2);
  ASSERT_EQ(show["preemptions"].size(), 1u) << show.dump(2);
  const nlohmann::json& p = show["preemptions"][0];
  EXPECT_EQ(p.value("kind", ""), "slurm") << p.dump();
  EXPECT_TRUE(p.value("done", false)) << p.dump();
  // The checkpoint written at Slurm's SIGTERM: without it the job would
  // start again from the beginning (it writes none before its end).
  const int64_t resumed = JsonInt(p, "resume_iteration");
  EXPECT_GT(resumed, 0) << p.dump();
  EXPECT_LT(resumed, 1200) << "it ended before it was preempted";
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "was preempted by Slurm")) << diary;
  EXPECT_TRUE(absl::StrContains(
      diary, absl::StrCat("Stopping at iteration ", resumed,
                          " on request (preempted): checkpoint written")))
      << diary;
  EXPECT_EQ(ModelSha(id), want)
      << "the resumed job ended with another model than an uninterrupted run";
}

}  // namespace
}  // namespace dlbatch::testing
