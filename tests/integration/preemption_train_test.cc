// Preemption of train jobs through the real binaries: the victims checkpoint
// at the signal, are queued again and end with the model an uninterrupted
// run gives; of two equal victims the one that loses less work is taken.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;
constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

class PreemptTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kDataDir) +
                                 "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << kDataDir
                   << " (Debian's dataset-fashion-mnist)";
    }
    setenv("XDG_CACHE_HOME", (c_.dir() + "/cache").c_str(), 1);
    const std::string yaml = c_.dir() + "/scheduler.yaml";
    WriteAll(yaml,
             "profiles:\n"
             "  t: {preemption: {mode: priority, grace: 30s, min_run: 0}}\n");
    c_.StartScheduler({"--config", yaml});
    c_.StartWorker("w", 2, "t");
    ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
  }
  void TearDown() override { unsetenv("XDG_CACHE_HOME"); }

  // Every job is named "lenet": the model's graph carries the name.
  int64_t Lenet(const std::string& file, const std::string& options) {
    return c_.Submit(c_.JobFile(
        file + ".yaml",
        LenetJob(kDataDir, options, "name: lenet\npool: 1\nprofile: t\n")));
  }
  int64_t Iteration(int64_t id, const char* key = "iteration") {
    return JsonInt(c_.ShowJson(id).value("progress", nlohmann::json()), key);
  }
  std::string ModelSha(int64_t id) {
    const std::string out = c_.dir() + "/out-" + std::to_string(id);
    Result fetch =
        c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
    EXPECT_EQ(fetch.code, 0) << fetch.err;
    Result sha = Exec({"sha256sum", out + "/model.onnx"});
    return sha.out.substr(0, 64);
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }

  Cluster c_;
};

constexpr char kOptions[] = R"(    mini_batch_size: 64
    max_iterations: 400
    verbose_frequency: 50
    checkpoint_frequency: 150
    checkpoint_frequency_unit: iteration
)";

TEST_F(PreemptTrain,
       VictimsCheckpointAtTheSignalAndEndWithTheUninterruptedModel) {
  const int64_t reference = Lenet("reference", kOptions);
  ASSERT_EQ(c_.Cli({"wait", std::to_string(reference)}, {}, 180000).code, 0)
      << Diary(reference) << c_.Logs();
  const std::string want = ModelSha(reference);
  ASSERT_EQ(want.size(), 64u);

  const int64_t a = Lenet("a", kOptions);
  const int64_t b = Lenet("b", kOptions);
  ASSERT_TRUE(
      WaitFor([&] { return Iteration(a) >= 20 && Iteration(b) >= 20; }, 120000))
      << Diary(a) << Diary(b) << c_.Logs();
  const std::string high =
      c_.JobFile("high.yaml", "profile: t\ncommand: [echo, high]\n");
  const int64_t h = c_.Submit(high, {"--pool", "2", "--priority", "10"});
  ASSERT_TRUE(c_.WaitState(h, "JOB_STATE_FINISHED", 60000)) << c_.Logs();
  const nlohmann::json hj = c_.ShowJson(h);
  // Submit to start: the victims' stop (a step and a checkpoint), well
  // within the grace + 1 s the issue allows.
  const int64_t wait_ms =
      JsonTimeMs(hj["start_time"]) - JsonTimeMs(hj["submit_time"]);
  EXPECT_LT(wait_ms, 31000) << hj.dump();
  std::cout << "[ measured ] submit to start of the preempting job: " << wait_ms
            << " ms\n";

  for (int64_t id : {a, b}) {
    ASSERT_EQ(c_.Cli({"wait", std::to_string(id)}, {}, 180000).code, 0)
        << Diary(id) << c_.Logs();
    const nlohmann::json j = c_.ShowJson(id);
    ASSERT_EQ(j["preemptions"].size(), 1u) << j.dump();
    const nlohmann::json& p = j["preemptions"][0];
    EXPECT_EQ(JsonInt(p, "by_job"), h);
    EXPECT_TRUE(p.value("done", false));
    const int64_t resumed = JsonInt(p, "resume_iteration");
    EXPECT_GT(resumed, 0) << p.dump();
    EXPECT_LT(resumed, 400) << "it ended before it was preempted";
    // The checkpoint written at the signal holds every step: none lost.
    EXPECT_EQ(p.value("lost_s", -1.0), 0.0) << p.dump();
    EXPECT_EQ(j.value("attempt", 0), 2);
    const std::string diary = Diary(id);
    EXPECT_NE(diary.find("Stopping at iteration " + std::to_string(resumed) +
                         " on request (preempted): checkpoint written"),
              npos)
        << diary;
    EXPECT_NE(diary.find("resumes from iteration " + std::to_string(resumed)),
              npos)
        << diary;
    EXPECT_EQ(ModelSha(id), want) << "job " << id << " ended with another "
                                  << "model than an uninterrupted run";
  }
}

TEST_F(PreemptTrain, OfTwoVictimsTheOneThatLosesLessWorkIsTaken) {
  // b never checkpoints: preempted, it would lose everything since its
  // start; a stores one every 20 iterations, after b started.
  const int64_t b = Lenet("b", "    max_iterations: 100000\n");
  ASSERT_TRUE(WaitFor([&] { return Iteration(b) >= 1; }, 120000))
      << Diary(b) << c_.Logs();
  const int64_t a = Lenet("a", R"(    max_iterations: 100000
    checkpoint_frequency: 20
    checkpoint_frequency_unit: iteration
)");
  ASSERT_TRUE(WaitFor(
      [&] { return Iteration(a, "checkpoint_iteration") >= 20; }, 120000))
      << Diary(a) << c_.Logs();
  const int64_t h =
      c_.Submit(c_.JobFile("high.yaml", "profile: t\ncommand: [echo, high]\n"),
                {"--priority", "10"});
  ASSERT_TRUE(c_.WaitState(h, "JOB_STATE_FINISHED", 60000)) << c_.Logs();
  EXPECT_EQ(c_.ShowJson(a)["preemptions"].size(), 1u) << c_.ShowJson(a).dump();
  EXPECT_TRUE(c_.ShowJson(b)["preemptions"].empty()) << c_.ShowJson(b).dump();
  EXPECT_EQ(c_.ShowJson(b).value("attempt", 0), 1);
  c_.Cli({"cancel", std::to_string(a), std::to_string(b)});
}

// The worker killed while its victim checkpoints: the job resumes from
// whichever checkpoint was stored last and still ends with the model of an
// uninterrupted run; nothing counts against its attempts.
TEST_F(PreemptTrain, AWorkerKilledWhileItsVictimCheckpointsLosesNothing) {
  const int64_t reference = Lenet("reference", kOptions);
  ASSERT_EQ(c_.Cli({"wait", std::to_string(reference)}, {}, 180000).code, 0)
      << Diary(reference) << c_.Logs();
  const std::string want = ModelSha(reference);
  const int64_t a = Lenet("a", kOptions);
  ASSERT_TRUE(WaitFor([&] { return Iteration(a) >= 20; }, 120000))
      << Diary(a) << c_.Logs();
  const int64_t h =
      c_.Submit(c_.JobFile("high.yaml", "profile: t\ncommand: [echo, high]\n"),
                {"--pool", "2", "--priority", "10"});
  ASSERT_TRUE(
      WaitFor([&] { return Diary(a).find("preempted by job") != npos; }, 30000))
      << c_.Logs();
  c_.KillWorker(0, SIGKILL);
  c_.RestartWorker(0);
  ASSERT_TRUE(c_.WaitState(h, "JOB_STATE_FINISHED", 60000)) << c_.Logs();
  ASSERT_EQ(c_.Cli({"wait", std::to_string(a)}, {}, 180000).code, 0)
      << Diary(a) << c_.Logs();
  const nlohmann::json j = c_.ShowJson(a);
  ASSERT_EQ(j["preemptions"].size(), 1u) << j.dump();
  EXPECT_TRUE(j["preemptions"][0].value("done", false));
  EXPECT_EQ(ModelSha(a), want);
}

}  // namespace
}  // namespace dlbatch::testing
