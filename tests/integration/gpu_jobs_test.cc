// Train jobs on GPUs through the real scheduler, worker and CLI: a worker
// started without --cpu-slots offers the GPUs it finds, `dlbatch workers`
// shows each one's name, memory and compute capability (as the CUDA runtime
// reports them), a job's pool counts GPUs, and the trainer the worker starts
// trains on the GPU it was given.
//
// Label gpu: every test skips, saying why, without a CUDA device or without
// the GPU backend. DLBATCH_TEST_DATA_DIR names the folder of Fashion-MNIST's
// four IDX files where Debian's dataset package is not installed;
// DLBATCH_BIN_DIR the folder of dlbatch, dlbatch-scheduler, dlbatch-worker
// and dlbatch-train.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/integration/harness.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/output/checkpoint.h"

namespace dlbatch::testing {
namespace {

class GpuJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = trainer::ListCudaDevices();
    if (gpus_.empty()) {
      GTEST_SKIP() << "no CUDA device (or a build without the GPU backend): "
                      "these tests train on GPUs through the scheduler";
    }
    data_ = FashionMnistDir();
    if (!std::filesystem::exists(data_ + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << data_
                   << " (Debian's dataset-fashion-mnist, or set "
                      "DLBATCH_TEST_DATA_DIR)";
    }
    // The trainers inherit it: their kernel choices stay in this test.
    setenv("XDG_CACHE_HOME", (c_.dir() + "/cache").c_str(), 1);
    c_.StartScheduler();
    // 0: no --cpu-slots, so the worker offers the GPUs it finds.
    c_.StartWorker("gpus", 0);
    ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
  }
  void TearDown() override { unsetenv("XDG_CACHE_HOME"); }

  // A LeNet job of `pool` GPUs on the test's data; `options` are extra
  // option lines, indented by four; `submit` extra arguments of submit.
  int64_t SubmitLenet(const std::string& name, int pool,
                      const std::string& options,
                      std::vector<std::string> submit = {}) {
    return c_.Submit(c_.JobFile(name + ".yaml",
                                LenetJob(data_, options,
                                         absl::StrCat("name: ", name,
                                                      "\npool: ", pool, "\n"))),
                     std::move(submit));
  }

  // Waits until the one worker is online with every GPU free again.
  bool WaitAllGpusFree() {
    return WaitFor(
        [&] {
          nlohmann::json j = nlohmann::json::parse(
              c_.Cli({"workers", "--json"}).out, nullptr, false);
          return j.is_object() && j["workers"].size() == 1 &&
                 j["workers"][0].value("online", false) &&
                 JsonInt(j["workers"][0], "free_slots") ==
                     static_cast<int64_t>(gpus_.size());
        },
        30000);
  }

  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }

  // What the trainer says it trains on, for the GPU the worker gave it
  // (CUDA_VISIBLE_DEVICES holds that one, so it is the trainer's gpu 0).
  std::string TrainsOn(int device) {
    return absl::StrCat("Training on gpu 0: ", gpus_[device].name);
  }

  std::vector<trainer::CudaDeviceInfo> gpus_;
  std::string data_;
  Cluster c_;
};

TEST_F(GpuJobs, AWorkerListsItsGpusAsTheCudaRuntimeDescribesThem) {
  Result json = c_.Cli({"workers", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  nlohmann::json j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << json.out;
  ASSERT_EQ(j["workers"].size(), 1u) << json.out;
  const nlohmann::json& devices = j["workers"][0]["devices"];
  ASSERT_EQ(devices.size(), gpus_.size()) << json.out;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("device ", i));
    EXPECT_EQ(JsonInt(devices[i], "index"), gpus_[i].index);
    EXPECT_EQ(devices[i].value("kind", ""), "gpu");
    EXPECT_EQ(devices[i].value("name", ""), gpus_[i].name);
    EXPECT_EQ(JsonInt(devices[i], "memory_bytes"), gpus_[i].memory_bytes);
    EXPECT_EQ(devices[i].value("compute_capability", ""),
              gpus_[i].compute_capability);
  }
  EXPECT_EQ(JsonInt(j["workers"][0], "free_slots"),
            static_cast<int64_t>(gpus_.size()));

  // The table names each GPU, as gpuDevice would.
  Result table = c_.Cli({"workers"});
  ASSERT_EQ(table.code, 0) << table.err;
  for (const trainer::CudaDeviceInfo& g : gpus_) {
    EXPECT_NE(table.out.find(absl::StrCat(g.index, ": ", g.name)),
              std::string::npos)
        << table.out;
    EXPECT_NE(table.out.find(absl::StrCat("cc ", g.compute_capability)),
              std::string::npos)
        << table.out;
  }
  Result profiles = c_.Cli({"profiles", "--json"});
  ASSERT_EQ(profiles.code, 0) << profiles.err;
  nlohmann::json p = nlohmann::json::parse(profiles.out, nullptr, false);
  ASSERT_TRUE(p.is_object()) << profiles.out;
  ASSERT_EQ(p["profiles"].size(), 1u) << profiles.out;
  EXPECT_EQ(p["profiles"][0].value("slot_kind", ""), "gpu");
  EXPECT_EQ(JsonInt(p["profiles"][0], "max_pool"),
            static_cast<int64_t>(gpus_.size()));
}

TEST_F(GpuJobs, AGpuJobTrainsOnItsGpuAndDeliversItsOutputs) {
  const int64_t id =
      SubmitLenet("lenet-gpu", 1, R"(    execution_environment: gpu
    mini_batch_size: 64
    max_iterations: 400
    validation_frequency: 200
    verbose_frequency: 100
    checkpoint_frequency: 200
    checkpoint_frequency_unit: iteration
)");
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(id) << c_.Logs();

  nlohmann::json show = c_.ShowJson(id);
  ASSERT_EQ(show["placement"].size(), 1u) << show.dump();
  ASSERT_EQ(show["placement"][0]["devices"].size(), 1u) << show.dump();
  const int device = show["placement"][0]["devices"][0].get<int>();
  ASSERT_GE(device, 0);
  ASSERT_LT(device, static_cast<int>(gpus_.size()));
  const std::string diary = Diary(id);
  EXPECT_NE(diary.find(TrainsOn(device)), std::string::npos) << diary;
  EXPECT_NE(diary.find("Training finished: 400 iterations"), std::string::npos)
      << diary;
  nlohmann::json progress = show["progress"];
  EXPECT_EQ(JsonInt(progress, "iteration"), 400);
  EXPECT_EQ(JsonInt(progress, "checkpoint_iteration"), 400);
  EXPECT_GE(progress.value("validation_accuracy", 0.0), 75.0)
      << progress.dump();

  const std::string out = c_.dir() + "/fetched";
  Result fetch = c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
  ASSERT_EQ(fetch.code, 0) << fetch.out << fetch.err;
  absl::StatusOr<trainer::Checkpoint> ckpt =
      trainer::ReadCheckpoint(out + "/checkpoint.dlbc");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->iteration, 400);
  ASSERT_FALSE(ckpt->params.empty());
  for (float w : ckpt->params) ASSERT_TRUE(std::isfinite(w));
  nlohmann::json metrics =
      nlohmann::json::parse(ReadAll(out + "/metrics.json"), nullptr, false);
  ASSERT_TRUE(metrics.is_object());
  EXPECT_EQ(metrics.value("ranks", 0), 1);
  EXPECT_GE(metrics.value("validation_accuracy", 0.0), 75.0) << metrics.dump();
  EXPECT_GT(std::filesystem::file_size(out + "/model.onnx"), 100000u);
}

TEST_F(GpuJobs, AutoTrainsOnTheGpuAndAPoolBeyondTheGpusIsRefused) {
  const int64_t id = SubmitLenet("lenet-auto", 1, R"(    mini_batch_size: 64
    max_iterations: 30
    verbose_frequency: 10
)");
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 120000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(id) << c_.Logs();
  const int device = c_.ShowJson(id)["placement"][0]["devices"][0].get<int>();
  EXPECT_NE(Diary(id).find(TrainsOn(device)), std::string::npos) << Diary(id);

  // One GPU more than the worker has: refused at submission, nothing queued.
  const int too_many = static_cast<int>(gpus_.size()) + 1;
  Result refused = c_.Cli(
      {"submit", "-q",
       c_.JobFile(
           "too-many.yaml",
           LenetJob(data_, "    execution_environment: multi-gpu\n",
                    absl::StrCat("name: too-many\npool: ", too_many, "\n")))});
  EXPECT_NE(refused.code, 0) << refused.out;
  EXPECT_NE(refused.err.find(
                absl::StrCat("pool ", too_many, " exceeds profile 'local'")),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find(absl::StrCat("use --pool ", gpus_.size())),
            std::string::npos)
      << refused.err;
  Result jobs = c_.Cli({"jobs", "--json"});
  EXPECT_EQ(jobs.out.find("too-many"), std::string::npos) << jobs.out;
}

TEST_F(GpuJobs, ACancelledGpuJobFreesItsGpuForTheNextJob) {
  // Long enough to be cancelled while it trains.
  const int64_t long_job =
      SubmitLenet("long", 1, R"(    execution_environment: gpu
    mini_batch_size: 64
    max_epochs: 100
    verbose_frequency: 20
)");
  ASSERT_TRUE(WaitFor(
      [&] {
        return JsonInt(
                   c_.ShowJson(long_job).value("progress", nlohmann::json()),
                   "iteration") > 0;
      },
      90000))
      << Diary(long_job) << c_.Logs();
  Result cancel = c_.Cli({"cancel", std::to_string(long_job)});
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  ASSERT_TRUE(c_.WaitState(long_job, "JOB_STATE_CANCELLED", 60000))
      << c_.ShowJson(long_job).dump() << c_.Logs();

  // Every GPU of the worker is free again, and the next job trains on one.
  ASSERT_TRUE(WaitAllGpusFree()) << c_.Cli({"workers"}).out;
  const int64_t next = SubmitLenet("next", static_cast<int>(gpus_.size()),
                                   R"(    execution_environment: multi-gpu
    mini_batch_size: 64
    max_iterations: 30
    verbose_frequency: 10
)");
  Result wait = c_.Cli({"wait", std::to_string(next)}, {}, 120000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(next) << c_.Logs();
  EXPECT_NE(Diary(next).find("Training on gpu 0: "), std::string::npos)
      << Diary(next);
}

// A worker given some of a machine's GPUs by CUDA_VISIBLE_DEVICES, as a
// node's GPUs are shared out between workers, numbers those from 0. Its
// jobs must get those GPUs, not the machine's GPUs of the same numbers.
// Here the worker is given the machine's last GPU by its UUID: its GPU 0,
// which a job sees only if CUDA_VISIBLE_DEVICES names it by that UUID too.
TEST_F(GpuJobs, AWorkerGivenSomeOfTheGpusHandsItsJobsThoseGpus) {
  const trainer::CudaDeviceInfo& last = gpus_.back();
  ASSERT_EQ(last.uuid.rfind("GPU-", 0), 0u) << last.uuid;
  // Only the worker inherits it: this process's CUDA runtime has started.
  setenv("CUDA_VISIBLE_DEVICES", last.uuid.c_str(), 1);
  c_.StartWorker("last", 0, "last-gpu");
  unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_TRUE(c_.WaitWorkers(2)) << c_.Logs();

  nlohmann::json j =
      nlohmann::json::parse(c_.Cli({"workers", "--json"}).out, nullptr, false);
  ASSERT_TRUE(j.is_object());
  const nlohmann::json* worker = nullptr;
  for (const nlohmann::json& w : j["workers"]) {
    if (w.value("name", "") == "last") worker = &w;
  }
  ASSERT_NE(worker, nullptr) << j.dump();
  ASSERT_EQ((*worker)["devices"].size(), 1u) << worker->dump();
  EXPECT_EQ(JsonInt((*worker)["devices"][0], "index"), 0);
  EXPECT_EQ((*worker)["devices"][0].value("name", ""), last.name);

  // A command job sees its GPU by the name the worker was given it by.
  const int64_t env =
      c_.Submit(c_.JobFile("visible.yaml",
                           "name: visible\ncommand: [sh, -c, 'echo "
                           "visible=$CUDA_VISIBLE_DEVICES.']\n"),
                {"--profile", "last-gpu"});
  Result waited = c_.Cli({"wait", std::to_string(env)}, {}, 60000);
  ASSERT_EQ(waited.code, 0) << waited.out << Diary(env) << c_.Logs();
  EXPECT_NE(Diary(env).find(absl::StrCat("visible=", last.uuid, ".")),
            std::string::npos)
      << Diary(env);

  // And a train job trains on it.
  const int64_t id =
      SubmitLenet("lenet-last", 1, R"(    execution_environment: gpu
    mini_batch_size: 64
    max_iterations: 30
    verbose_frequency: 10
)",
                  {"--profile", "last-gpu"});
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 120000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(id) << c_.Logs();
  EXPECT_NE(Diary(id).find(absl::StrCat("Training on gpu 0: ", last.name)),
            std::string::npos)
      << Diary(id);
}

// A mini-batch whose activations cannot fit in the GPU's memory (one
// convolution's output alone is 60000 x 1024 x 28 x 28 floats, 193 GB,
// beyond an H100's 80 and an H200's 141) fails the job, saying what to
// change, and leaves the GPU free.
TEST_F(GpuJobs, AMiniBatchTooLargeForTheGpuFailsTheJobSayingWhatToChange) {
  const std::string yaml = absl::StrReplaceAll(R"(name: too-large
train:
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 1024, size: 3, padding: same}
      - {type: relu}
      - {type: fc, units: 10}
      - {type: softmax}
  data:
    train: {format: idx, images: DATA/train-images-idx3-ubyte.gz, labels: DATA/train-labels-idx1-ubyte.gz}
  options:
    execution_environment: gpu
    mini_batch_size: 60000
    max_iterations: 2
)",
                                               {{"DATA", data_}});
  const int64_t id = c_.Submit(c_.JobFile("too-large.yaml", yaml));
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  EXPECT_NE(wait.code, 0) << wait.out;
  nlohmann::json show = c_.ShowJson(id);
  EXPECT_EQ(show.value("state", ""), "failed") << show.dump();
  const std::string reason = show.value("reason", "");
  EXPECT_NE(reason.find("use a smaller mini_batch_size"), std::string::npos)
      << reason << "\n"
      << Diary(id) << c_.Logs();
  // The trainer's failure, not a lost worker: not retried.
  EXPECT_EQ(JsonInt(show, "attempt"), 1);
  ASSERT_TRUE(WaitAllGpusFree()) << c_.Cli({"workers"}).out;
}

// NCCL through the scheduler: the ranks of one job on the worker's GPUs
// meet at the scheduler's rendezvous. Needs two GPUs (NCCL refuses two
// ranks on one).
TEST_F(GpuJobs, PoolTwoTrainsOnTwoGpusWithNccl) {
  if (gpus_.size() < 2) {
    GTEST_SKIP() << "one CUDA device: a pool of 2 GPUs needs two";
  }
  const int64_t id =
      SubmitLenet("lenet-two", 2, R"(    execution_environment: multi-gpu
    mini_batch_size: 128
    max_iterations: 300
    validation_frequency: 300
    verbose_frequency: 100
)");
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(id) << c_.Logs();
  nlohmann::json show = c_.ShowJson(id);
  EXPECT_EQ(show["placement"][0]["devices"].size(), 2u) << show.dump();
  const std::string diary = Diary(id);
  EXPECT_NE(diary.find("Training on gpu 0: "), std::string::npos) << diary;
  EXPECT_NE(diary.find(": 2 processes, each mini-batch of"), std::string::npos)
      << diary;
  EXPECT_GE(show["progress"].value("validation_accuracy", 0.0), 75.0)
      << show["progress"].dump();
}

}  // namespace
}  // namespace dlbatch::testing
