// Recorded training steps (CUDA graphs, Backend::StartRecording): a
// recording runs nothing until it replays, a replay reads what device
// memory holds at that time (the batch, the dropout key), and a run whose
// steps replay (DLBATCH_CUDA_GRAPHS=1) trains to exactly the weights of one
// whose steps are launched call by call, through the real dlbatch-train on
// Fashion-MNIST. So does a run whose batches reach the GPU as the host
// loader's floats against one (the default) where the GPU makes them from
// the data set's bytes (Backend::PrepareImages), augmented and normalised.
//
// Label gpu: every test skips, saying why, without a CUDA device. On a
// machine without Debian's dataset package, DLBATCH_TEST_DATA_DIR names the
// folder of the four IDX files; DLBATCH_BIN_DIR the one of dlbatch-train.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::ReadAll;
using dlbatch::testing::Result;

std::vector<float> Ramp(int64_t count, float start) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = start + 0.001f * i;
  return v;
}

class GpuRecording : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: this test records and replays CUDA "
                      "graphs";
    }
    absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(0, {});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
  }

  std::vector<float> Get(const Buffer& b, int64_t count) {
    std::vector<float> host(count);
    gpu_->CopyToHost(host.data(), b.f32(), count * sizeof(float));
    return host;
  }

  std::unique_ptr<Backend> gpu_;
};

TEST_F(GpuRecording, ARecordingRunsOnReplayWithTheKeyAndInputsOfThatTime) {
  constexpr int64_t kCount = 50000;
  constexpr float kP = 0.4f;
  Buffer x = *gpu_->Allocate(kCount * sizeof(float));
  Buffer mask = *gpu_->Allocate(kCount * sizeof(float));
  Buffer y = *gpu_->Allocate(kCount * sizeof(float));
  Buffer doubled = *gpu_->Allocate(kCount * sizeof(float));
  const std::vector<float> first = Ramp(kCount, 1), second = Ramp(kCount, -7);
  gpu_->CopyToDevice(x.f32(), first.data(), kCount * sizeof(float));
  gpu_->Fill(y.f32(), kCount, 123);
  // Warm up (recording needs kernels that ran once).
  gpu_->SetDropoutKey(1);
  gpu_->DropoutForward(kP, 9, kCount, x.f32(), mask.f32(), doubled.f32());
  gpu_->Scale(kCount, 2, doubled.f32());
  gpu_->Fill(y.f32(), kCount, 123);
  gpu_->Synchronize();

  ASSERT_TRUE(gpu_->can_record());
  ASSERT_TRUE(gpu_->StartRecording().ok());
  gpu_->DropoutForward(kP, 9, kCount, x.f32(), mask.f32(), y.f32());
  gpu_->CopyOnDevice(doubled.f32(), y.f32(), kCount * sizeof(float));
  gpu_->Scale(kCount, 2, doubled.f32());
  absl::StatusOr<std::unique_ptr<Recording>> recording =
      gpu_->FinishRecording();
  ASSERT_TRUE(recording.ok()) << recording.status();
  // Nothing ran while recording.
  EXPECT_EQ(Get(y, kCount), std::vector<float>(kCount, 123));

  for (const auto& [key, input] :
       {std::pair<uint64_t, const std::vector<float>*>{11, &first},
        {12, &second}}) {
    gpu_->CopyToDevice(x.f32(), input->data(), kCount * sizeof(float));
    gpu_->SetDropoutKey(key);
    (*recording)->Replay();
    const std::vector<float> got = Get(y, kCount), twice = Get(doubled, kCount);
    int64_t dropped = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      const float keep = UniformAt(Key(key, 9), static_cast<uint64_t>(i)) >= kP
                             ? 1 / (1 - kP)
                             : 0;
      ASSERT_EQ(got[i], (*input)[i] * keep) << "key " << key << ", " << i;
      ASSERT_EQ(twice[i], 2 * got[i]) << "key " << key << ", " << i;
      dropped += keep == 0;
    }
    EXPECT_NEAR(static_cast<double>(dropped) / kCount, kP, 0.02);
  }
  // And the backend runs calls as issued again.
  gpu_->Fill(y.f32(), kCount, 5);
  EXPECT_EQ(Get(y, kCount), std::vector<float>(kCount, 5));
}

TEST_F(GpuRecording, AFailedRecordingSaysWhyAndLeavesTheBackendWorking) {
  Buffer y = *gpu_->Allocate(64 * sizeof(float));
  EXPECT_FALSE(gpu_->FinishRecording().ok());  // none started
  ASSERT_TRUE(gpu_->StartRecording().ok());
  EXPECT_FALSE(gpu_->StartRecording().ok());  // one at a time
  absl::StatusOr<std::unique_ptr<Recording>> empty = gpu_->FinishRecording();
  // An empty graph may or may not instantiate; either way the backend runs
  // calls as issued afterwards.
  (void)empty;
  gpu_->Fill(y.f32(), 64, 3);
  EXPECT_EQ(Get(y, 64), std::vector<float>(64, 3));
}

// A LeNet with batchnorm and dropout: state that changes every step (the
// running statistics) and draws that must differ every step (the key).
constexpr char kNetwork[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 20, size: 5}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, size: 2, stride: 2}
      - {type: conv, filters: 50, size: 5}
      - {type: maxpool, size: 2, stride: 2}
      - {type: fc, units: 500}
      - {type: relu}
      - {type: dropout, probability: 0.3}
      - {type: fc, units: 10}
      - {type: softmax}
)";

class GpuRecordedRun : public testing::TrainRunFixture {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: this test trains on the GPU with and "
                      "without CUDA graphs";
    }
    TrainRunFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    job_ = WriteJob("lenet",
                    testing::FashionMnistJobText(
                        "lenet", kNetwork,
                        "    mini_batch_size: 64\n    seed: 5\n"
                        "    verbose_frequency: 10\n"
                        // Evaluations between replays, of other batch sizes
                        // (the last validation batch: 10000 % 64).
                        "    validation_frequency: 15\n",
                        /*validation=*/true,
                        "    normalize: true\n"
                        "    augmentation: {random_x_reflection: true, "
                        "random_y_translation: 2, random_crop_padding: 3}\n"));
  }

  // Trains `iterations` on the GPU into `out`, with recorded steps or not
  // and batches as bytes or floats; the output (diary).
  std::string Train(const std::string& out, int iterations, bool graphs,
                    bool bytes = true) {
    Result r = RunTrain(job_, out,
                        {"--execution-environment", "gpu", "--max-iterations",
                         std::to_string(iterations)},
                        // Deterministic cuDNN algorithms, and the same ones
                        // for both runs (the tuning cache the first run
                        // writes).
                        {{"DLBATCH_CUDNN_DETERMINISTIC", "1"},
                         {"DLBATCH_CUDA_GRAPHS", graphs ? "1" : "0"},
                         {"DLBATCH_BYTES_BATCHES", bytes ? "1" : "0"}},
                        300000);
    EXPECT_EQ(r.code, 0) << out << ":\n" << r.out << r.err;
    return r.out;
  }

  std::string job_;
};

// Runs `a` and `b` (their output folders) of `steps` steps ended with the
// same weights, state and momentum, bit for bit, after the same losses and
// accuracies step by step, and validated alike.
void ExpectSameTraining(const std::string& a_dir, const std::string& b_dir,
                        int steps) {
  absl::StatusOr<Checkpoint> a = ReadCheckpoint(a_dir + "/checkpoint.dlbc");
  absl::StatusOr<Checkpoint> b = ReadCheckpoint(b_dir + "/checkpoint.dlbc");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->iteration, steps);
  EXPECT_EQ(b->iteration, steps);
  EXPECT_TRUE(a->params == b->params) << "weights differ";
  EXPECT_TRUE(a->state == b->state) << "batchnorm's running statistics differ";
  EXPECT_TRUE(a->solver_state == b->solver_state) << "momentum differs";

  // The same losses and accuracies, step by step.
  absl::StatusOr<TrainingHistory> ha =
      ParseHistoryCsv(ReadAll(a_dir + "/training_history.csv"));
  absl::StatusOr<TrainingHistory> hb =
      ParseHistoryCsv(ReadAll(b_dir + "/training_history.csv"));
  ASSERT_TRUE(ha.ok()) << ha.status();
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_EQ(ha->iterations.size(), static_cast<size_t>(steps));
  ASSERT_EQ(hb->iterations.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(ha->iterations[i].loss, hb->iterations[i].loss) << i;
    EXPECT_EQ(ha->iterations[i].accuracy, hb->iterations[i].accuracy) << i;
  }
  ASSERT_EQ(ha->validations.size(), 3u);  // at 15, 30 and 40
  ASSERT_EQ(hb->validations.size(), 3u);
  // Same weights, so the same loss up to the algorithms: the last
  // validation batch (10000 % 64 = 16 images) is a size the tuning cache
  // has not seen, timed anew by each run, which may pick another one.
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(ha->validations[i].loss, hb->validations[i].loss,
                1e-5 * std::abs(ha->validations[i].loss))
        << i;
  }
}

TEST_F(GpuRecordedRun, ReplayedStepsTrainToTheWeightsOfLaunchedOnes) {
  constexpr int kSteps = 40;
  const std::string launched = Train(dir_ + "/launched", kSteps, false);
  const std::string replayed = Train(dir_ + "/replayed", kSteps, true);
  EXPECT_EQ(launched.find("CUDA graph"), std::string::npos) << launched;
  EXPECT_NE(replayed.find("recorded once as a CUDA graph"), std::string::npos)
      << replayed;
  EXPECT_EQ(replayed.find("failed"), std::string::npos) << replayed;

  ExpectSameTraining(dir_ + "/launched", dir_ + "/replayed", kSteps);
}

TEST_F(GpuRecordedRun, BatchesAsBytesTrainToTheWeightsOfFloats) {
  constexpr int kSteps = 40;
  Train(dir_ + "/floats", kSteps, false, false);
  Train(dir_ + "/bytes", kSteps, false, true);
  const std::string replayed = Train(dir_ + "/bytes-replayed", kSteps, true);
  EXPECT_EQ(replayed.find("failed"), std::string::npos) << replayed;
  EXPECT_NE(ReadAll(dir_ + "/floats/metrics.json").find("\"floats\""),
            std::string::npos);
  EXPECT_NE(ReadAll(dir_ + "/bytes/metrics.json").find("\"bytes\""),
            std::string::npos);
  {
    SCOPED_TRACE("bytes against floats");
    ExpectSameTraining(dir_ + "/floats", dir_ + "/bytes", kSteps);
  }
  {
    SCOPED_TRACE("bytes with recorded steps against floats");
    ExpectSameTraining(dir_ + "/floats", dir_ + "/bytes-replayed", kSteps);
  }
}

}  // namespace
}  // namespace dlbatch::trainer
