// precision: bf16 and fp16 on the GPU against float32 on the CPU (the
// reference every backend must match): convolutions and fully connected
// layers forward and backward, and a whole LeNet step (forward, loss, backward,
// the solver's update), within what rounding inputs to bf16 (8 significant
// bits) or fp16 (11) allows; a recorded low-precision step replays as
// launched; and fp16's overflow reaches the gradients as the loss scaler
// looks for it (non-finite), where bf16's range keeps them finite.
//
// Every test skips, saying why, where this process sees no CUDA device (and
// bf16's where the GPU has no bf16 tensor cores).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trainer/gpu_against_cpu.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/network.h"

namespace dlbatch::trainer {
namespace {

using testing::Conv;
using testing::RandomVector;
using testing::RelativeError;
using testing::SameConv;

using Pair = testing::PairedArray;

struct Precision {
  const char* name;
  CudaBackendOptions::LowPrecision low;
  // ‖low − fp32‖ / ‖fp32‖ of a layer's results on inputs in [-1, 1]:
  // inputs rounded to 8 (bf16) or 11 (fp16) significant bits, products
  // summed in float32, leave about 2^-9 and 2^-12 of relative error; these
  // allow several times that. A whole step's gradients pass through every
  // layer's rounding: twice that.
  double layer_tolerance;
  double step_tolerance;
};

void PrintTo(const Precision& p, std::ostream* os) { *os << p.name; }

constexpr Precision kBf16 = {"bf16", CudaBackendOptions::LowPrecision::kBf16,
                             1e-2, 2e-2};
constexpr Precision kFp16 = {"fp16", CudaBackendOptions::LowPrecision::kFp16,
                             2e-3, 4e-3};

class GpuMixedPrecisionTest : public testing::GpuAgainstCpuTest,
                              public ::testing::WithParamInterface<Precision> {
 protected:
  void SetUp() override {
    GpuAgainstCpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    CudaBackendOptions options;
    options.low_precision = GetParam().low;
    auto gpu = MakeCudaBackend(0, options);
    if (gpu.status().code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << gpu.status().message();
    }
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
  }
  double tolerance() const { return GetParam().layer_tolerance; }

  // `d` forward and backward at batch 4 and 3, against the CPU; at batch 3
  // the backward calls come in the other order (BackwardData first).
  void ExpectConvNear(const ConvDesc& d, uint64_t seed) {
    SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString());
    const int max_batch = 4;
    auto ck = cpu_->MakeConv(d, max_batch);
    auto gk = gpu_->MakeConv(d, max_batch);
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE(gk.ok()) << gk.status();
    for (int n : {max_batch, 3}) {
      SCOPED_TRACE(n);
      // y and dx are garbage to overwrite.
      testing::WeightedLayerArrays l = testing::ConvArrays(
          cpu_.get(), gpu_.get(), d, n, &seed, /*garbage=*/true);
      l.Forward(n, **ck, **gk);
      if (n == max_batch) {
        l.BackwardWeights(n, **ck, **gk);  // the network's order
        l.BackwardData(n, **ck, **gk);
      } else {
        l.BackwardData(n, **ck, **gk);
        l.BackwardWeights(n, **ck, **gk);
      }
      EXPECT_LT(l.y.error(), tolerance());
      EXPECT_GT(l.y.error(), 1e-7)
          << "y is float32's: not computed in " << GetParam().name;
      EXPECT_LT(l.dx.error(), tolerance());
      EXPECT_LT(l.dw.error(), tolerance());
      EXPECT_LT(l.db.error(), 1e-5);  // summed from float32 dy
    }
  }
};

TEST_P(GpuMixedPrecisionTest, DescribesItsPrecision) {
  EXPECT_NE(gpu_->Describe().find(GetParam().name), std::string::npos)
      << gpu_->Describe();
  EXPECT_EQ(gpu_->scales_loss(), GetParam().low == kFp16.low);
}

// Channel counts that are and are not multiples of 8 (the kernel pads
// them), cuDNN's symmetric padding and the casts' asymmetric one.
TEST_P(GpuMixedPrecisionTest, ConvolutionsAgreeWithFloat32) {
  uint64_t seed = 100;
  ExpectConvNear(Conv({28, 28, 1}, 20, 5, 1, 0), seed += 20);   // LeNet's 1st
  ExpectConvNear(Conv({12, 12, 20}, 50, 5, 1, 0), seed += 20);  // and 2nd
  ExpectConvNear(Conv({10, 10, 16}, 32, 3, 1, 1), seed += 20);
  ExpectConvNear(SameConv({8, 8, 3}, 6, 4, 1), seed += 20);    // pads 1,1,2,2
  ExpectConvNear(SameConv({8, 8, 16}, 24, 3, 2), seed += 20);  // pads 0,0,1,1
}

TEST_P(GpuMixedPrecisionTest, FullyConnectedLayersAgreeWithFloat32) {
  for (const FcDesc d : {FcDesc{800, 500}, FcDesc{50, 10}, FcDesc{64, 16}}) {
    SCOPED_TRACE(d.in);
    auto ck = cpu_->MakeFc(d, 8);
    auto gk = gpu_->MakeFc(d, 8);
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE(gk.ok()) << gk.status();
    for (int n : {8, 5}) {
      uint64_t seed = 10;  // 11 to 18
      testing::WeightedLayerArrays l = testing::FcArrays(
          cpu_.get(), gpu_.get(), d, n, &seed, /*garbage=*/true);
      l.Forward(n, **ck, **gk);
      l.BackwardWeights(n, **ck, **gk);
      l.BackwardData(n, **ck, **gk);
      EXPECT_LT(l.y.error(), tolerance());
      EXPECT_GT(l.y.error(), 1e-7) << "not computed in " << GetParam().name;
      EXPECT_LT(l.dx.error(), tolerance());
      EXPECT_LT(l.dw.error(), tolerance());
      EXPECT_LT(l.db.error(), 1e-5);
    }
  }
}

// What a scaled loss's gradient does when the scale is too large: fp16
// (largest finite 65504) overflows into infinities that SumSquares reports
// (the loss scaler's check); bf16 keeps float32's range.
TEST_P(GpuMixedPrecisionTest, OverflowReachesTheGradientsOnlyInFp16) {
  const FcDesc d{64, 16};
  const int n = 8;
  auto gk = gpu_->MakeFc(d, n);
  ASSERT_TRUE(gk.ok()) << gk.status();
  Pair x = Random(n * d.in, 21), w = Random(d.units * d.in, 22, -0.1, 0.1);
  Pair b = Random(d.units, 23);
  Pair dy = Random(n * d.units, 24, 1e5, 2e5);  // beyond fp16's range
  Pair y = Random(n * d.units, 25), dx = Random(n * d.in, 26);
  Pair dw = Random(d.units * d.in, 27), db = Random(d.units, 28);
  (*gk)->Forward(n, x.g(), w.g(), b.g(), y.g());
  (*gk)->BackwardWeights(n, x.g(), dy.g(), dw.g(), db.g());
  (*gk)->BackwardData(n, dy.g(), w.g(), dx.g());
  const double sum = gpu_->SumSquares(d.units * d.in, dw.g()) +
                     gpu_->SumSquares(n * d.in, dx.g());
  EXPECT_EQ(std::isfinite(sum), GetParam().low == kBf16.low) << sum;
}

// LeNet on one backend, a batch of random images and labels.
struct LeNetStep {
  LeNetStep(Backend* backend, int n) : backend(backend), n(n) {
    auto built = Network::Build(testing::LeNetSpec(), backend, n);
    EXPECT_TRUE(built.ok()) << built.status();
    if (!built.ok()) return;
    net = *std::move(built);
    net->Initialize(3);
    params = net->num_params();
    velocity = *backend->Allocate(params * sizeof(float));
    images = *backend->Allocate(int64_t{n} * 784 * sizeof(float));
    labels = *backend->Allocate(n * sizeof(int32_t));
    stats = *backend->Allocate(2 * sizeof(float));
    const std::vector<float> x = RandomVector(int64_t{n} * 784, 77, 0, 1);
    std::vector<int32_t> y(n);
    for (int i = 0; i < n; ++i) y[i] = (i * 7) % 10;
    backend->CopyToDevice(images.as<void>(), x.data(), x.size() * 4);
    backend->CopyToDevice(labels.as<void>(), y.data(), y.size() * 4);
  }
  // Forward, loss and backward (what a training step records), the loss
  // scaled by 2^10 as dlbatch-train scales fp16's (without it, fp16 loses
  // LeNet's smallest gradients below its normal range).
  static constexpr float kLossScale = 1024;
  void Compute() {
    backend->Fill(stats.f32(), 2, 0);
    net->Forward(n, images.f32(), /*training=*/true);
    net->Loss(n, labels.as<int32_t>(), stats.f32());
    net->Backward(n, labels.as<int32_t>(), kLossScale / n);
  }
  // Unscales the gradients and applies them.
  void Update() {
    backend->Scale(params, 1 / kLossScale, net->grads());
    backend->SgdmUpdate(params, net->num_decayed(), 0.01f, 0.9f, 5e-4f,
                        net->params(), net->grads(), velocity.f32());
  }
  std::vector<float> Get(const float* device, int64_t count) {
    std::vector<float> host(count);
    backend->CopyToHost(host.data(), device, count * sizeof(float));
    return host;
  }
  double Loss() { return Get(stats.f32(), 1)[0] / n; }

  Backend* backend;
  int n;
  std::unique_ptr<Network> net;
  int64_t params = 0;
  Buffer velocity, images, labels, stats;
};

TEST_P(GpuMixedPrecisionTest, ALeNetStepAgreesWithFloat32) {
  const int n = 64;
  LeNetStep cpu(cpu_.get(), n), gpu(gpu_.get(), n);
  ASSERT_NE(cpu.net, nullptr);
  ASSERT_NE(gpu.net, nullptr);
  const std::vector<float> initial = cpu.Get(cpu.net->params(), cpu.params);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    cpu.Compute();
    gpu.Compute();
    const double cpu_loss = cpu.Loss(), gpu_loss = gpu.Loss();
    EXPECT_NEAR(gpu_loss, cpu_loss, GetParam().step_tolerance * cpu_loss);
    EXPECT_LT(RelativeError(gpu.Get(gpu.net->grads(), gpu.params),
                            cpu.Get(cpu.net->grads(), cpu.params)),
              GetParam().step_tolerance);
    cpu.Update();
    gpu.Update();
    // The float32 masters move by float32 updates of gradients within the
    // tolerance: they stay within that fraction of how far they moved.
    const std::vector<float> moved = cpu.Get(cpu.net->params(), cpu.params);
    EXPECT_LT(RelativeError(gpu.Get(gpu.net->params(), gpu.params), moved),
              GetParam().step_tolerance * RelativeError(moved, initial) + 1e-7);
  }
}

// A step recorded as a CUDA graph (what dlbatch-train replays) computes
// what the launched step computes: the casts are recorded with it, and the
// weights' copies follow the weights' updates between replays.
// Deterministic convolution algorithms (read when a kernel is made), so
// that every kernel of the step adds in a fixed order and the two agree to
// the last bits; a replay that computed with stale copies (the weights
// before the last update, the last batch's x) would differ by a whole
// step's change instead.
TEST_P(GpuMixedPrecisionTest, ARecordedStepReplaysAsLaunched) {
  setenv("DLBATCH_CUDNN_DETERMINISTIC", "1", 1);
  const int n = 32;
  LeNetStep launched(gpu_.get(), n), recorded(gpu_.get(), n);
  unsetenv("DLBATCH_CUDNN_DETERMINISTIC");
  ASSERT_NE(launched.net, nullptr);
  ASSERT_NE(recorded.net, nullptr);
  launched.Compute();  // kernels set themselves up before recording
  recorded.Compute();
  launched.Update();
  recorded.Update();
  ASSERT_TRUE(gpu_->StartRecording().ok());
  recorded.Compute();
  absl::StatusOr<std::unique_ptr<Recording>> graph = gpu_->FinishRecording();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    launched.Compute();
    (*graph)->Replay();
    EXPECT_NEAR(recorded.Loss(), launched.Loss(), 1e-6 * launched.Loss());
    EXPECT_LT(
        RelativeError(recorded.Get(recorded.net->grads(), recorded.params),
                      launched.Get(launched.net->grads(), launched.params)),
        1e-5);
    launched.Update();
    recorded.Update();
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuMixedPrecisionTest,
                         ::testing::Values(kBf16, kFp16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace dlbatch::trainer
