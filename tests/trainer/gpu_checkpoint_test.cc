// Checkpoints move between the GPU and the CPU: a run stopped on one and
// resumed on the other ends where a run on one device would, up to the
// rounding of the steps each took. Through the real dlbatch-train, on
// Fashion-MNIST. Label gpu: skips, saying why, without a CUDA device.
//
// On a machine without Debian's dataset package, DLBATCH_TEST_DATA_DIR names
// the folder of the four IDX files; DLBATCH_BIN_DIR the one of dlbatch-train.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/output/checkpoint.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::BinDir;
using dlbatch::testing::Exec;
using dlbatch::testing::Result;

class GpuCheckpoint : public testing::TrainRunFixture {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: this test resumes GPU checkpoints on "
                      "the CPU and back";
    }
    TrainRunFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    job_ = WriteJob("lenet", testing::FashionMnistJobText(
                                 "lenet", dlbatch::testing::kLenetNetworkYaml,
                                 "    mini_batch_size: 64\n    seed: 5\n",
                                 /*validation=*/false));
  }

  // Trains to `iterations` on `env` in `out`, resuming what is there.
  void Train(const std::string& env, int iterations, const std::string& out,
             const std::string& threads = "1") {
    Result r =
        RunTrain(job_, out,
                 {"--execution-environment", env, "--max-iterations",
                  std::to_string(iterations), "--resume", "--threads", threads},
                 {}, 300000);
    ASSERT_EQ(r.code, 0) << env << " to " << iterations << ":\n"
                         << r.out << r.err;
  }

  std::vector<float> Weights(const std::string& out) {
    absl::StatusOr<Checkpoint> c = ReadCheckpoint(out + "/checkpoint.dlbc");
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    EXPECT_EQ(c->iteration, kSteps);
    return c->params;
  }

  static double RelativeDifference(const std::vector<float>& a,
                                   const std::vector<float>& b) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      diff += std::pow(double{a[i]} - b[i], 2);
      norm += std::pow(double{b[i]}, 2);
    }
    return a.size() == b.size() && norm > 0 ? std::sqrt(diff / norm) : 1e9;
  }

  std::string job_;
  static constexpr int kSteps = 10;
};

// `dlbatch-train --list-devices` names every GPU as the CUDA runtime
// describes it: index, name, memory and compute capability (gpuDevice's).
TEST_F(GpuCheckpoint, ListDevicesDescribesEveryGpu) {
  Result r = Exec({BinDir() + "/dlbatch-train", "--list-devices"}, {}, 60000);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::vector<CudaDeviceInfo> devices = ListCudaDevices();
  ASSERT_FALSE(devices.empty());
  for (const CudaDeviceInfo& d : devices) {
    const std::string line = absl::StrCat(
        "GPU ", d.index, ": ", d.name, ", ",
        absl::StrFormat("%.1f",
                        static_cast<double>(d.memory_bytes) / (1 << 30)),
        " GiB, compute capability ", d.compute_capability);
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " not in:\n"
                                                   << r.out;
  }
  EXPECT_EQ(r.out.find("No CUDA device"), std::string::npos) << r.out;
}

// Ten steps, resumed after five: LeNet's training is chaotic, and over
// more steps rounding alone moves the weights as far as a lost state would
// (the CPU with 1 thread against 2: 4e-6 apart after 10 steps, 2e-4 after
// 20, 2e-3 after 40; the weights move 1e-2 from step 1 to step 10).
TEST_F(GpuCheckpoint, AGpuCheckpointResumesOnTheCpuAndACpuOneOnTheGpu) {
  const int half = kSteps / 2;
  Train("cpu", kSteps, dir_ + "/cpu");
  Train("cpu", kSteps, dir_ + "/cpu-2-threads", "2");
  Train("gpu", kSteps, dir_ + "/gpu");
  Train("gpu", half, dir_ + "/gpu-then-cpu");
  Train("cpu", kSteps, dir_ + "/gpu-then-cpu");
  Train("cpu", half, dir_ + "/cpu-then-gpu");
  Train("gpu", kSteps, dir_ + "/cpu-then-gpu");
  const std::vector<float> cpu = Weights(dir_ + "/cpu");
  const std::vector<float> gpu = Weights(dir_ + "/gpu");
  const double rounding =
      RelativeDifference(Weights(dir_ + "/cpu-2-threads"), cpu);
  const double devices = RelativeDifference(gpu, cpu);
  const double gpu_then_cpu =
      RelativeDifference(Weights(dir_ + "/gpu-then-cpu"), cpu);
  const double cpu_then_gpu =
      RelativeDifference(Weights(dir_ + "/cpu-then-gpu"), gpu);
  std::printf(
      "after %d steps: cpu 1 vs 2 threads %.3g, gpu vs cpu %.3g, "
      "gpu-then-cpu vs cpu %.3g, cpu-then-gpu vs gpu %.3g\n",
      kSteps, rounding, devices, gpu_then_cpu, cpu_then_gpu);
  // Steps on two devices differ by rounding only.
  EXPECT_LT(devices, 1e-3);
  EXPECT_LT(gpu_then_cpu, 1e-3);
  EXPECT_LT(cpu_then_gpu, 1e-3);
  // A resume that lost the state would be far off: the weights moved.
  const std::vector<float> start = [&] {
    Train("cpu", 1, dir_ + "/one");
    absl::StatusOr<Checkpoint> c =
        ReadCheckpoint(dir_ + "/one/checkpoint.dlbc");
    return c.ok() ? c->params : std::vector<float>();
  }();
  const double moved = RelativeDifference(start, cpu);
  EXPECT_GT(moved, 10 * std::max({devices, gpu_then_cpu, cpu_then_gpu, 1e-7}));
}

}  // namespace
}  // namespace dlbatch::trainer
