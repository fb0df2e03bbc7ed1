// The GPU backend against the CPU backend, the reference it must match:
// every kernel forward and backward on fresh random inputs, the solvers,
// and LeNet trained a few steps on each with the same loss curve. Results
// agree as ‖gpu − cpu‖ / ‖cpu‖ within float tolerance; dropout's mask and
// the argmax counts agree exactly.
//
// Every test skips, saying why, where this process sees no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/fashion_mnist.h"
#include "tests/trainer/gpu_against_cpu.h"
#include "tests/trainer/images_from_bytes.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/data/data.h"
#include "trainer/layers.h"
#include "trainer/network.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using testing::Conv;
using testing::PadString;
using testing::RandomVector;
using testing::SameConv;
using testing::SamePool;

// Tolerance of ‖gpu − cpu‖ / ‖cpu‖ for float results computed in another
// order (cuDNN's and oneDNN's summation orders differ).
constexpr double kTolerance = 1e-5;

using Pair = testing::PairedArray;

#define EXPECT_AGREE(pair) \
  EXPECT_LT((pair).error(), kTolerance) << #pair " differs"

// Every output of a layer's calls (y, dx, dw, db) agrees.
void ExpectAgree(const testing::WeightedLayerArrays& l) {
  EXPECT_AGREE(l.y);
  EXPECT_AGREE(l.dx);
  EXPECT_AGREE(l.dw);
  EXPECT_AGREE(l.db);
}

class GpuBackendTest : public testing::GpuAgainstCpuTest {
 protected:
  void SetUp() override {
    GpuAgainstCpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto gpu = MakeCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
  }
  Pair Zeros(int64_t count) { return Pair(cpu_.get(), gpu_.get(), count); }
  // Random 0s and 1s: many ties for a max pool's windows.
  Pair Ties(int64_t count, uint64_t seed) {
    std::vector<float> host = RandomVector(count, seed, 0, 2);
    for (float& v : host) v = std::floor(v);
    return Pair(cpu_.get(), gpu_.get(), host);
  }

  // `d`'s forward, backward data and backward weights on both backends, at
  // batch 4 and 3, compared. `garbage`: y and dx start as random values
  // they must overwrite, and at batch 3 the two backward calls run in the
  // other order (an asymmetric convolution's share its padded scratch).
  // On `gpu` where given, else gpu_.
  void ExpectConvAgrees(const ConvDesc& d, uint64_t* seed, bool garbage,
                        Backend* gpu = nullptr) {
    const int max_batch = 4;
    Backend* g = gpu != nullptr ? gpu : gpu_.get();
    auto ck = cpu_->MakeConv(d, max_batch);
    auto gk = g->MakeConv(d, max_batch);
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE(gk.ok()) << gk.status();
    for (int n : {max_batch, 3}) {
      SCOPED_TRACE(n);
      // The arrays on the backend under test too: its stream orders them.
      testing::WeightedLayerArrays l =
          testing::ConvArrays(cpu_.get(), g, d, n, seed, garbage);
      l.Forward(n, **ck, **gk);
      if (garbage && n != max_batch) {
        l.BackwardWeights(n, **ck, **gk);
        l.BackwardData(n, **ck, **gk);
      } else {
        l.BackwardData(n, **ck, **gk);
        l.BackwardWeights(n, **ck, **gk);
      }
      ExpectAgree(l);
    }
  }
};

TEST_F(GpuBackendTest, DescribesItself) {
  EXPECT_TRUE(gpu_->on_gpu());
  EXPECT_EQ(gpu_->Describe().rfind("gpu 0: ", 0), 0u) << gpu_->Describe();
}

TEST_F(GpuBackendTest, ConvolutionForwardAndBackward) {
  const ConvDesc descs[] = {
      Conv({28, 28, 1}, 20, 5, 1, 0),   // LeNet's first
      Conv({12, 12, 20}, 50, 5, 1, 0),  // and second
      Conv({9, 9, 3}, 8, 3, 2, 1),      // strided, padded
      Conv({14, 14, 16}, 40, 3, 1, 1),  // over 32 channels of bias
  };
  uint64_t seed = 1;
  for (const ConvDesc& d : descs) {
    SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString());
    ExpectConvAgrees(d, &seed, /*garbage=*/false);
  }
}

TEST_F(GpuBackendTest, ConvolutionTuningRoundTrips) {
  const ConvDesc d = Conv({12, 12, 4}, 8, 3, 1, 1);
  ASSERT_TRUE(gpu_->MakeConv(d, 8).ok());
  const std::string tuning = gpu_->SaveTuning();
  EXPECT_NE(tuning.find("cuda fwd convolution"), std::string::npos) << tuning;
  auto other = MakeCudaBackend(0);
  ASSERT_TRUE(other.ok()) << other.status();
  (*other)->LoadTuning(tuning);
  ASSERT_TRUE((*other)->MakeConv(d, 8).ok());
  EXPECT_EQ((*other)->SaveTuning(), tuning);
}

// Convolutions lowered to matrix products (unfolded patches and cuBLAS,
// conv_lowering.h), forced: in one chunk, with a workspace cap of one
// sample's patches (batch 4 and 3 in as many chunks, backward weights
// adding them up), and backward weights at batch 4 in 4 groups (a strided
// batch of products, then their parts summed). gpu_elements_test checks the
// arithmetic on the host; this, the launches and the products.
TEST_F(GpuBackendTest, LoweredConvolutionsMatchTheCpu) {
  ConvDesc oblong = Conv({9, 8, 3}, 4, 3, 2, 1);  // 3x2, stride 2x1
  oblong.kw = 2;
  oblong.stride_w = 1;
  oblong.pad.left = oblong.pad.right = 0;
  oblong.out = Shape{5, 7, 4};
  const ConvDesc descs[] = {
      Conv({28, 28, 1}, 20, 5, 1, 0),   // LeNet's first
      Conv({12, 12, 20}, 50, 5, 1, 0),  // and second
      Conv({9, 9, 3}, 8, 3, 2, 1),      // strided, padded
      Conv({6, 6, 8}, 5, 1, 1, 0),      // 1x1: the patches are x
      Conv({7, 7, 4}, 6, 1, 2, 0),      // 1x1, strided
      SameConv({8, 8, 3}, 6, 4, 1),     // asymmetric: pads 1,1,2,2
      SameConv({8, 7, 3}, 4, 3, 2),     // in h only: 0,1,1,1
      oblong,
  };
  struct Setting {
    size_t cap;
    int groups;
  };
  for (const Setting setting :
       {Setting{size_t{256} << 20, 1}, Setting{size_t{1}, 1},
        Setting{size_t{256} << 20, 4}}) {
    const size_t cap = setting.cap;
    CudaBackendOptions options;
    options.lowering = CudaBackendOptions::Lowering::kAlways;
    options.lowered_bytes = cap;
    options.lowered_groups = setting.groups;
    auto lowered = MakeCudaBackend(0, options);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    uint64_t seed = 400;
    for (const ConvDesc& d : descs) {
      SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString() + " " +
                   std::to_string(d.kh) + "x" + std::to_string(d.kw) + " pad " +
                   PadString(d.pad) + ", cap " + std::to_string(cap) +
                   ", groups " + std::to_string(setting.groups));
      ExpectConvAgrees(d, &seed, /*garbage=*/true, lowered->get());
    }
  }
}

// The default: per direction, cuDNN's pick or the lowered form, whichever
// ran faster when the kernel was made; either agrees with the CPU, and the
// choices (printed: which won on this GPU) come back from the tuning.
TEST_F(GpuBackendTest, TimedConvolutionChoicesAgreeAndRoundTrip) {
  CudaBackendOptions options;
  options.lowering = CudaBackendOptions::Lowering::kTimed;
  auto timed = MakeCudaBackend(0, options);
  ASSERT_TRUE(timed.ok()) << timed.status();
  uint64_t seed = 500;
  const ConvDesc lenet2 = Conv({12, 12, 20}, 50, 5, 1, 0);
  ExpectConvAgrees(lenet2, &seed, /*garbage=*/true, timed->get());
  ASSERT_TRUE((*timed)->MakeConv(lenet2, 1024).ok());
  const std::string tuning = (*timed)->SaveTuning();
  std::printf("convolution choices (1000: lowered):\n%s", tuning.c_str());
  for (const char* what : {"cuda fwd ", "cuda bwd_data ", "cuda bwd_filter "}) {
    EXPECT_NE(tuning.find(std::string(what) + "convolution [12, 12, 20]"),
              std::string::npos)
        << what << " missing from\n"
        << tuning;
  }
  auto other = MakeCudaBackend(0, options);
  ASSERT_TRUE(other.ok()) << other.status();
  (*other)->LoadTuning(tuning);
  ASSERT_TRUE((*other)->MakeConv(lenet2, 1024).ok());
  ASSERT_TRUE((*other)->MakeConv(lenet2, 4).ok());
  EXPECT_EQ((*other)->SaveTuning(), tuning);
  ExpectConvAgrees(lenet2, &seed, /*garbage=*/true, other->get());

  // A tuning that says "lowered" (1000) for every choice is taken as it
  // is, and the lowered runs agree too.
  std::string all_lowered;
  for (size_t at = 0; at < tuning.size();) {
    const size_t end = tuning.find('\n', at);
    const std::string line = tuning.substr(at, end - at);
    all_lowered += "1000" + line.substr(line.find('\t')) + "\n";
    at = end + 1;
  }
  auto third = MakeCudaBackend(0, options);
  ASSERT_TRUE(third.ok()) << third.status();
  (*third)->LoadTuning(all_lowered);
  ExpectConvAgrees(lenet2, &seed, /*garbage=*/true, third->get());
  ASSERT_TRUE((*third)->MakeConv(lenet2, 1024).ok());
  EXPECT_EQ((*third)->SaveTuning(), all_lowered);
}

// `precision: tf32`: convolutions and matrix products may round their
// inputs to TF32 (10-bit mantissa) on tensor cores, so the results stay
// near float32's, within TF32's rounding (about 1e-3 of the norm here)
// rather than float tolerance; the backend says which precision it runs.
TEST_F(GpuBackendTest, Tf32ConvolutionsAndMatrixProductsStayNearFloat32) {
  CudaBackendOptions options;
  options.tf32 = true;
  auto made = MakeCudaBackend(0, options);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Backend> tf32 = *std::move(made);
  EXPECT_NE(tf32->Describe().find("tf32"), std::string::npos)
      << tf32->Describe();
  EXPECT_NE(gpu_->Describe().find("fp32"), std::string::npos)
      << gpu_->Describe();
  constexpr double kTf32Tolerance = 1e-2;
  Backend* cpu = cpu_.get();
  const int n = 8;
  const ConvDesc conv = Conv({12, 12, 20}, 50, 5, 1, 0);  // LeNet's second
  auto ck = cpu->MakeConv(conv, n);
  auto tk = tf32->MakeConv(conv, n);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE(tk.ok()) << tk.status();
  const int64_t weights = int64_t{conv.filters} * conv.kh * conv.kw * conv.in.c;
  Pair x(cpu, tf32.get(), RandomVector(n * conv.in.size(), 31));
  Pair w(cpu, tf32.get(), RandomVector(weights, 32, -0.3, 0.3));
  Pair b(cpu, tf32.get(), RandomVector(conv.filters, 33));
  Pair dy(cpu, tf32.get(), RandomVector(n * conv.out.size(), 34));
  Pair y(cpu, tf32.get(), n * conv.out.size()),
      dx(cpu, tf32.get(), n * conv.in.size());
  Pair dw(cpu, tf32.get(), weights), db(cpu, tf32.get(), conv.filters);
  (*ck)->Forward(n, x.c(), w.c(), b.c(), y.c());
  (*tk)->Forward(n, x.g(), w.g(), b.g(), y.g());
  (*ck)->BackwardData(n, dy.c(), w.c(), dx.c());
  (*tk)->BackwardData(n, dy.g(), w.g(), dx.g());
  (*ck)->BackwardWeights(n, x.c(), dy.c(), dw.c(), db.c());
  (*tk)->BackwardWeights(n, x.g(), dy.g(), dw.g(), db.g());
  for (const Pair* p : {&y, &dx, &dw, &db})
    EXPECT_LT(p->error(), kTf32Tolerance);

  const FcDesc fc{800, 500};
  auto cf = cpu->MakeFc(fc, n);
  auto tf = tf32->MakeFc(fc, n);
  ASSERT_TRUE(cf.ok()) << cf.status();
  ASSERT_TRUE(tf.ok()) << tf.status();
  Pair fx(cpu, tf32.get(), RandomVector(n * fc.in, 35));
  Pair fw(cpu, tf32.get(), RandomVector(fc.units * fc.in, 36, -0.1, 0.1));
  Pair fb(cpu, tf32.get(), RandomVector(fc.units, 37));
  Pair fy(cpu, tf32.get(), n * fc.units);
  (*cf)->Forward(n, fx.c(), fw.c(), fb.c(), fy.c());
  (*tf)->Forward(n, fx.g(), fw.g(), fb.g(), fy.g());
  EXPECT_LT(fy.error(), kTf32Tolerance);
}

TEST_F(GpuBackendTest, FullyConnectedForwardAndBackward) {
  const FcDesc d{800, 500};
  auto ck = cpu_->MakeFc(d, 8);
  auto gk = gpu_->MakeFc(d, 8);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE(gk.ok()) << gk.status();
  for (int n : {8, 5}) {
    uint64_t seed = 10;  // 11 to 16
    testing::WeightedLayerArrays l = testing::FcArrays(
        cpu_.get(), gpu_.get(), d, n, &seed, /*garbage=*/false);
    l.Forward(n, **ck, **gk);
    l.BackwardData(n, **ck, **gk);
    l.BackwardWeights(n, **ck, **gk);
    ExpectAgree(l);
  }
}

// Pooling `d` over n samples of `x` (gradient `dy`) on both backends:
// outputs and input gradients agree.
void ExpectPoolingAgrees(Backend* cpu, Backend* gpu, const PoolDesc& d, int n,
                         const Pair& x, const Pair& dy) {
  SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString());
  auto ck = cpu->MakePool(d, n);
  auto gk = gpu->MakePool(d, n);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE(gk.ok()) << gk.status();
  Buffer cws, gws;
  if (size_t bytes = (*ck)->WorkspaceBytes(n)) cws = *cpu->Allocate(bytes);
  if (size_t bytes = (*gk)->WorkspaceBytes(n)) gws = *gpu->Allocate(bytes);
  Pair y(cpu, gpu, n * d.out.size()), dx(cpu, gpu, n * d.in.size());
  (*ck)->Forward(n, x.c(), y.c(), cws.as<void>());
  (*gk)->Forward(n, x.g(), y.g(), gws.as<void>());
  (*ck)->Backward(n, x.c(), y.c(), dy.c(), cws.as<void>(), dx.c());
  (*gk)->Backward(n, x.g(), y.g(), dy.g(), gws.as<void>(), dx.g());
  EXPECT_AGREE(y);
  EXPECT_AGREE(dx);
}

TEST_F(GpuBackendTest, PoolingForwardAndBackward) {
  PoolDesc max2{PoolKind::kMax, {24, 24, 20}, 2, 2, 2, 2, {}, {12, 12, 20}};
  PoolDesc avg3{PoolKind::kAverage, {7, 7, 6}, 3, 3, 1, 1,
                {1, 1, 1, 1},       {7, 7, 6}};
  PoolDesc max3{PoolKind::kMax, {9, 9, 4}, 3, 3, 2, 2, {}, {4, 4, 4}};
  PoolDesc global{PoolKind::kAverage, {5, 5, 16}, 5, 5, 1, 1, {}, {1, 1, 16}};
  // Tiled windows that leave the last row and column uncovered.
  PoolDesc max2odd{PoolKind::kMax, {7, 7, 3}, 2, 2, 2, 2, {}, {3, 3, 3}};
  uint64_t seed = 20;
  for (const PoolDesc& d : {max2, avg3, max3, global, max2odd}) {
    const int n = 3;
    Pair x = Random(n * d.in.size(), ++seed),
         dy = Random(n * d.out.size(), ++seed);
    ExpectPoolingAgrees(cpu_.get(), gpu_.get(), d, n, x, dy);
  }
}

// Equal values in a window, as a convolution gives over blank background:
// both backends pass the gradient to the same element of the window.
TEST_F(GpuBackendTest, MaxPoolingTiesGoToTheSameElement) {
  for (const PoolDesc& d :
       {PoolDesc{PoolKind::kMax, {8, 8, 5}, 2, 2, 2, 2, {}, {4, 4, 5}},
        PoolDesc{PoolKind::kMax, {9, 9, 4}, 3, 3, 2, 2, {}, {4, 4, 4}}}) {
    const int n = 2;
    Pair x = Ties(n * d.in.size(), 77);
    Pair dy = Random(n * d.out.size(), 78);
    ExpectPoolingAgrees(cpu_.get(), gpu_.get(), d, n, x, dy);
  }
}

TEST_F(GpuBackendTest, BatchNormTrainingInferenceAndBackward) {
  const BatchNormDesc d{{6, 6, 40}, 1e-5f};
  const int n = 4, c = d.in.c;
  const int64_t count = n * d.in.size();
  auto ck = cpu_->MakeBatchNorm(d, n);
  auto gk = gpu_->MakeBatchNorm(d, n);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE(gk.ok()) << gk.status();
  // An offset mean, as activations have, tests the shifted sums.
  Pair x = Random(count, 31, 2, 5), dy = Random(count, 32);
  Pair gamma = Random(c, 33, 0.5, 1.5), beta = Random(c, 34);
  Pair rmean = Random(c, 35), rvar = Random(c, 36, 0.5, 2);
  Pair y = Zeros(count), mean = Zeros(c), var = Zeros(c), dx = Zeros(count);
  Pair dgamma = Zeros(c), dbeta = Zeros(c), yi = Zeros(count);
  (*ck)->ForwardTraining(n, x.c(), gamma.c(), beta.c(), y.c(), mean.c(),
                         var.c(), rmean.c(), rvar.c(), 0.1f);
  (*gk)->ForwardTraining(n, x.g(), gamma.g(), beta.g(), y.g(), mean.g(),
                         var.g(), rmean.g(), rvar.g(), 0.1f);
  (*ck)->Backward(n, x.c(), dy.c(), gamma.c(), mean.c(), var.c(), dx.c(),
                  dgamma.c(), dbeta.c());
  (*gk)->Backward(n, x.g(), dy.g(), gamma.g(), mean.g(), var.g(), dx.g(),
                  dgamma.g(), dbeta.g());
  (*ck)->ForwardInference(n, x.c(), gamma.c(), beta.c(), rmean.c(), rvar.c(),
                          yi.c());
  (*gk)->ForwardInference(n, x.g(), gamma.g(), beta.g(), rmean.g(), rvar.g(),
                          yi.g());
  EXPECT_AGREE(y);
  EXPECT_AGREE(mean);
  EXPECT_AGREE(var);
  EXPECT_AGREE(rmean);
  EXPECT_AGREE(rvar);
  EXPECT_AGREE(dx);
  EXPECT_AGREE(dgamma);
  EXPECT_AGREE(dbeta);
  EXPECT_AGREE(yi);
}

TEST_F(GpuBackendTest, SyncBatchNormPassesOfOneRank) {
  const BatchNormDesc d{{5, 5, 12}, 1e-5f};
  const int n = 3, c = d.in.c;
  const int64_t count = n * d.in.size();
  auto ck = cpu_->MakeSyncBatchNorm(d, n);
  auto gk = gpu_->MakeSyncBatchNorm(d, n);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE(gk.ok()) << gk.status();
  Pair x = Random(count, 41, 1, 3), dy = Random(count, 42);
  Pair gamma = Random(c, 43, 0.5, 1.5), beta = Random(c, 44);
  Pair rmean = Random(c, 45, 1, 3), rvar = Random(c, 46, 0.5, 2);
  Pair sums = Zeros(2 * c + 1), bsums = Zeros(2 * c + 1);
  Pair y = Zeros(count), mean = Zeros(c), var = Zeros(c), dx = Zeros(count);
  Pair dgamma = Zeros(c), dbeta = Zeros(c);
  (*ck)->ForwardSums(n, x.c(), rmean.c(), sums.c());
  (*gk)->ForwardSums(n, x.g(), rmean.g(), sums.g());
  EXPECT_AGREE(sums);
  (*ck)->ForwardNormalize(n, x.c(), gamma.c(), beta.c(), rmean.c(), sums.c(),
                          y.c(), mean.c(), var.c(), rmean.c(), rvar.c(), 0.1f);
  (*gk)->ForwardNormalize(n, x.g(), gamma.g(), beta.g(), rmean.g(), sums.g(),
                          y.g(), mean.g(), var.g(), rmean.g(), rvar.g(), 0.1f);
  (*ck)->BackwardSums(n, x.c(), dy.c(), mean.c(), var.c(), dgamma.c(),
                      dbeta.c(), bsums.c());
  (*gk)->BackwardSums(n, x.g(), dy.g(), mean.g(), var.g(), dgamma.g(),
                      dbeta.g(), bsums.g());
  (*ck)->BackwardData(n, x.c(), dy.c(), gamma.c(), mean.c(), var.c(), bsums.c(),
                      dx.c());
  (*gk)->BackwardData(n, x.g(), dy.g(), gamma.g(), mean.g(), var.g(), bsums.g(),
                      dx.g());
  EXPECT_AGREE(y);
  EXPECT_AGREE(mean);
  EXPECT_AGREE(var);
  EXPECT_AGREE(rmean);
  EXPECT_AGREE(rvar);
  EXPECT_AGREE(bsums);
  EXPECT_AGREE(dgamma);
  EXPECT_AGREE(dbeta);
  EXPECT_AGREE(dx);
  EXPECT_EQ(sums.gpu()[2 * c], static_cast<float>(n));
}

TEST_F(GpuBackendTest, ElementWise) {
  const int64_t count = 100003;  // not a multiple of any block
  Pair x = Random(count, 51), dy = Random(count, 52);
  for (float alpha : {0.0f, 0.1f}) {
    Pair y = Zeros(count), dx = Zeros(count);
    cpu_->ActivationForward({alpha}, count, x.c(), y.c());
    gpu_->ActivationForward({alpha}, count, x.g(), y.g());
    cpu_->ActivationBackward({alpha}, count, x.c(), dy.c(), dx.c());
    gpu_->ActivationBackward({alpha}, count, x.g(), dy.g(), dx.g());
    EXPECT_EQ(y.gpu(), y.cpu()) << "alpha " << alpha;
    EXPECT_EQ(dx.gpu(), dx.cpu()) << "alpha " << alpha;
  }
  Pair mask = Zeros(count), y = Zeros(count), prod = Zeros(count);
  cpu_->SetDropoutKey(77);
  gpu_->SetDropoutKey(77);
  cpu_->DropoutForward(0.3f, 5, count, x.c(), mask.c(), y.c());
  gpu_->DropoutForward(0.3f, 5, count, x.g(), mask.g(), y.g());
  EXPECT_EQ(mask.gpu(), mask.cpu());
  EXPECT_EQ(y.gpu(), y.cpu());
  cpu_->Multiply(count, dy.c(), mask.c(), prod.c());
  gpu_->Multiply(count, dy.g(), mask.g(), prod.g());
  EXPECT_EQ(prod.gpu(), prod.cpu());
  cpu_->Scale(count, 0.5f, prod.c());
  gpu_->Scale(count, 0.5f, prod.g());
  EXPECT_EQ(prod.gpu(), prod.cpu());
  EXPECT_NEAR(gpu_->SumSquares(count, x.g()), cpu_->SumSquares(count, x.c()),
              1e-9 * cpu_->SumSquares(count, x.c()));
  // Deterministic: the same bits twice.
  EXPECT_EQ(gpu_->SumSquares(count, x.g()), gpu_->SumSquares(count, x.g()));
  gpu_->Fill(prod.g(), count, 2.5f);
  EXPECT_EQ(prod.gpu(), std::vector<float>(count, 2.5f));
  std::vector<float> bad = RandomVector(1000, 53);
  bad[500] = NAN;
  Pair nan(cpu_.get(), gpu_.get(), bad);
  EXPECT_FALSE(std::isfinite(gpu_->SumSquares(1000, nan.g())));

  // Clipping to a norm, on the device: above the threshold scaled down to
  // it, below left alone, as on the CPU.
  const double norm = std::sqrt(cpu_->SumSquares(count, x.c()));
  for (double threshold : {norm / 3, norm * 2}) {
    Pair clipped(cpu_.get(), gpu_.get(), x.cpu());
    cpu_->ClipToNorm(count, threshold, clipped.c());
    gpu_->ClipToNorm(count, threshold, clipped.g());
    EXPECT_AGREE(clipped);
    EXPECT_NEAR(std::sqrt(gpu_->SumSquares(count, clipped.g())),
                std::min(norm, threshold), 1e-5 * norm);
  }
}

TEST_F(GpuBackendTest, SoftmaxCrossEntropyForwardAndBackward) {
  for (int classes : {10, 257}) {
    SCOPED_TRACE(classes);
    const int n = 300;  // more rows than a block has threads
    Pair logits = Random(int64_t{n} * classes, 61, -8, 8);
    std::vector<int32_t> labels(n);
    Rng rng(Key(62, classes));
    for (int32_t& l : labels) l = static_cast<int32_t>(rng.Below(classes));
    Buffer cl = *cpu_->Allocate(n * 4), gl = *gpu_->Allocate(n * 4);
    cpu_->CopyToDevice(cl.as<void>(), labels.data(), n * 4);
    gpu_->CopyToDevice(gl.as<void>(), labels.data(), n * 4);
    Pair probs = Zeros(int64_t{n} * classes),
         stats(cpu_.get(), gpu_.get(), std::vector<float>{1, 2});
    Pair dlogits = Zeros(int64_t{n} * classes);
    // Label smoothing on every other size.
    const float smoothing = classes % 2 == 0 ? 0.1f : 0.0f;
    cpu_->SoftmaxCrossEntropy(n, classes, logits.c(), cl.as<int32_t>(),
                              smoothing, probs.c(), stats.c());
    gpu_->SoftmaxCrossEntropy(n, classes, logits.g(), gl.as<int32_t>(),
                              smoothing, probs.g(), stats.g());
    cpu_->SoftmaxCrossEntropyBackward(n, classes, probs.c(), cl.as<int32_t>(),
                                      smoothing, 0.25f, dlogits.c());
    gpu_->SoftmaxCrossEntropyBackward(n, classes, probs.g(), gl.as<int32_t>(),
                                      smoothing, 0.25f, dlogits.g());
    EXPECT_AGREE(probs);
    EXPECT_AGREE(dlogits);
    EXPECT_NEAR(stats.gpu()[0], stats.cpu()[0], 1e-5 * stats.cpu()[0]);
    EXPECT_EQ(stats.gpu()[1], stats.cpu()[1]);  // counts agree exactly
  }
}

TEST_F(GpuBackendTest, SolverUpdates) {
  const int64_t count = 70001, decayed = 50000;
  Pair grads = Random(count, 71);
  for (const char* solver : {"sgdm", "adam", "rmsprop"}) {
    SCOPED_TRACE(solver);
    Pair params = Random(count, 72), m = Zeros(count), v = Zeros(count);
    for (int t = 1; t <= 3; ++t) {
      const std::string s = solver;
      if (s == "sgdm") {
        cpu_->SgdmUpdate(count, decayed, 0.01f, 0.9f, 5e-4f, params.c(),
                         grads.c(), v.c());
        gpu_->SgdmUpdate(count, decayed, 0.01f, 0.9f, 5e-4f, params.g(),
                         grads.g(), v.g());
      } else if (s == "adam") {
        cpu_->AdamUpdate(count, decayed, 1e-3f, 0.9f, 0.999f, 1e-8f, t, 1e-4f,
                         params.c(), grads.c(), m.c(), v.c());
        gpu_->AdamUpdate(count, decayed, 1e-3f, 0.9f, 0.999f, 1e-8f, t, 1e-4f,
                         params.g(), grads.g(), m.g(), v.g());
      } else {
        cpu_->RmspropUpdate(count, decayed, 1e-3f, 0.9f, 1e-8f, 1e-4f,
                            params.c(), grads.c(), v.c());
        gpu_->RmspropUpdate(count, decayed, 1e-3f, 0.9f, 1e-8f, 1e-4f,
                            params.g(), grads.g(), v.g());
      }
    }
    EXPECT_LT(params.error(), 1e-6);
    EXPECT_LT(v.error(), 1e-6);
    if (std::string(solver) == "adam") {
      EXPECT_LT(m.error(), 1e-6);
    }
  }
}

// LeNet through Network on each backend, from the same initial weights and
// batches: the loss curves agree within a tolerance that allows float
// rounding to grow over the steps.
//
// Trains LeNet for `steps` steps of n consecutive images of `data` (scaled
// to [0, 1]) with SGDM; the loss of each step.
std::vector<double> TrainLeNet(Backend* backend, const Dataset& data, int steps,
                               int n) {
  auto net = Network::Build(testing::LeNetSpec(), backend, n);
  EXPECT_TRUE(net.ok()) << net.status();
  if (!net.ok()) return {};
  (*net)->Initialize(3);
  const int64_t params = (*net)->num_params();
  Buffer velocity = *backend->Allocate(params * sizeof(float));
  Buffer images = *backend->Allocate(int64_t{n} * 784 * sizeof(float));
  Buffer labels = *backend->Allocate(n * sizeof(int32_t));
  Buffer stats = *backend->Allocate(2 * sizeof(float));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const int64_t first = int64_t{step} * n;
    std::vector<float> x(int64_t{n} * 784);
    for (int64_t j = 0; j < n * 784; ++j) {
      x[j] = data.pixels[first * 784 + j] / 255.0f;
    }
    const std::vector<int32_t> y(data.labels.begin() + first,
                                 data.labels.begin() + first + n);
    backend->CopyToDevice(images.as<void>(), x.data(), x.size() * 4);
    backend->CopyToDevice(labels.as<void>(), y.data(), y.size() * 4);
    backend->Fill(stats.f32(), 2, 0);
    backend->SetDropoutKey(step);
    (*net)->Forward(n, images.f32(), /*training=*/true);
    (*net)->Loss(n, labels.as<int32_t>(), stats.f32());
    (*net)->Backward(n, labels.as<int32_t>(), 1.0f / n);
    backend->SgdmUpdate(params, (*net)->num_decayed(), 0.01f, 0.9f, 5e-4f,
                        (*net)->params(), (*net)->grads(), velocity.f32());
    float host[2];
    backend->CopyToHost(host, stats.f32(), sizeof(host));
    losses.push_back(host[0] / n);
  }
  return losses;
}

// 200 steps of Fashion-MNIST's first 6,400 training images: a loss curve
// well past where rounding compounds. Training is chaotic: a difference in
// the last bit of one sum grows over the steps until single steps' losses
// differ by 10% or more,
// whichever device computes them. Measured on the CPU alone (1 thread
// against 4, which sum some reductions in another order): losses agree to
// 1e-7 for 15 steps, pass 1e-3 by step 21, then drift apart by a few
// percent on a step (about 1.1% on average over the 200). So the GPU is
// held to the CPU tightly while rounding has not compounded (the steps
// before the 4-thread CPU moves 1e-5 away, at least 10), and after that to
// the spread that rounding alone gives, measured in the same run.
TEST_F(GpuBackendTest, LeNetLossCurveOf200StepsMatchesTheCpu) {
  const int steps = 200, n = 32, window = 20;
  v1::DataSource source;
  source.set_format("idx");
  source.set_images("train-images-idx3-ubyte.gz");
  source.set_labels("train-labels-idx1-ubyte.gz");
  absl::StatusOr<Dataset> data =
      LoadDataset(source, dlbatch::testing::FashionMnistDir());
  ASSERT_TRUE(data.ok()) << data.status()
                         << " (DLBATCH_TEST_DATA_DIR names the folder of "
                            "Fashion-MNIST's IDX files)";
  ASSERT_GE(data->count, int64_t{steps} * n);
  auto cpu4_backend = MakeCpuBackend(4);
  ASSERT_TRUE(cpu4_backend.ok()) << cpu4_backend.status();
  const std::vector<double> cpu = TrainLeNet(cpu_.get(), *data, steps, n);
  const std::vector<double> ref =
      TrainLeNet(cpu4_backend->get(), *data, steps, n);
  const std::vector<double> gpu = TrainLeNet(gpu_.get(), *data, steps, n);
  ASSERT_EQ(cpu.size(), static_cast<size_t>(steps));
  ASSERT_EQ(ref.size(), static_cast<size_t>(steps));
  ASSERT_EQ(gpu.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; i += 10) {
    std::printf("step %3d: cpu %.6f, cpu (4 threads) %.6f, gpu %.6f\n", i,
                cpu[i], ref[i], gpu[i]);
  }
  int tight = 0;
  while (tight < steps &&
         std::fabs(ref[tight] - cpu[tight]) <= 1e-5 * std::fabs(cpu[tight])) {
    ++tight;
  }
  tight = std::max(tight, 10);
  std::printf("held within 1e-3 of the CPU for the first %d steps\n", tight);
  for (int i = 0; i < tight; ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 1e-3 * std::fabs(cpu[i])) << "step " << i;
  }
  // Each 20-step mean: within 3 times the rounding spread plus 5%.
  double gpu_spread = 0, ref_spread = 0;
  for (int w = 0; w < steps; w += window) {
    double c = 0, r = 0, g = 0;
    for (int i = w; i < w + window; ++i) {
      c += cpu[i] / window;
      r += ref[i] / window;
      g += gpu[i] / window;
    }
    EXPECT_NEAR(g, c, 3 * std::fabs(r - c) + 0.05 * c)
        << "steps " << w << ".." << w + window - 1 << ": rounding alone "
        << "moves this mean by " << std::fabs(r - c);
  }
  // Over the whole curve: the GPU strays from the CPU about as far as the
  // CPU strays from itself.
  for (int i = 0; i < steps; ++i) {
    gpu_spread += std::fabs(gpu[i] - cpu[i]) / steps;
    ref_spread += std::fabs(ref[i] - cpu[i]) / steps;
  }
  std::printf("mean |gpu - cpu| %.5f, mean |cpu (4 threads) - cpu| %.5f\n",
              gpu_spread, ref_spread);
  EXPECT_LT(gpu_spread, 3 * ref_spread + 1e-3);
  double cpu_tail = 0;
  for (int i = steps - window; i < steps; ++i) cpu_tail += cpu[i] / window;
  EXPECT_LT(cpu_tail, 0.5 * cpu.front());  // it learned
}

// --- asymmetric padding: `same` with an even window or a stride over an
// even size (cuDNN pads symmetrically; the GPU pads a copy or runs its own
// pooling kernels) ---

TEST_F(GpuBackendTest, ConvolutionWithAsymmetricPaddingMatchesTheCpu) {
  const ConvDesc descs[] = {
      SameConv({8, 8, 3}, 6, 4, 1),    // even window: pads 1,1,2,2
      SameConv({8, 8, 5}, 7, 3, 2),    // stride 2 on an even size: 0,0,1,1
      SameConv({8, 7, 3}, 4, 3, 2),    // asymmetric in h only: 0,1,1,1
      SameConv({7, 6, 34}, 40, 2, 1),  // 2x2 over many channels: 0,0,1,1
  };
  uint64_t seed = 200;
  for (const ConvDesc& d : descs) {
    SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString() + " pad " +
                 PadString(d.pad));
    ASSERT_FALSE(d.pad.symmetric());
    ExpectConvAgrees(d, &seed, /*garbage=*/true);
  }
}

TEST_F(GpuBackendTest, PoolingWithAsymmetricPaddingMatchesTheCpu) {
  struct Case {
    Shape in;
    int k, stride;
  };
  const Case cases[] = {
      {{7, 6, 5}, 2, 1},  // 0,0,1,1
      {{8, 8, 4}, 3, 2},  // 0,0,1,1
      {{8, 7, 3}, 3, 2},  // 0,1,1,1: asymmetric in h only
      {{6, 6, 2}, 4, 1},  // 1,1,2,2
      {{7, 7, 3}, 2, 2},  // 0,0,1,1: tiles but for the padding
  };
  uint64_t seed = 300;
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (const Case& c : cases) {
      const PoolDesc d = SamePool(kind, c.in, c.k, c.stride);
      SCOPED_TRACE(std::string(kind == PoolKind::kMax ? "max" : "average") +
                   " " + std::to_string(d.kh) + "x" + std::to_string(d.kw) +
                   " stride " + std::to_string(d.stride_h) + " pad " +
                   PadString(d.pad));
      ASSERT_FALSE(d.pad.symmetric());
      const int n = 3;
      Pair x = Random(n * d.in.size(), ++seed);
      Pair dy = Random(n * d.out.size(), ++seed);
      ExpectPoolingAgrees(cpu_.get(), gpu_.get(), d, n, x, dy);
    }
  }
}

// Ties, as in MaxPoolingTiesGoToTheSameElement, with windows that the
// padding clips; and inference (no workspace) gives training's output.
TEST_F(GpuBackendTest, MaxPoolingWithAsymmetricPaddingTiesAndInference) {
  for (const PoolDesc& d : {SamePool(PoolKind::kMax, {8, 8, 5}, 2, 1),
                            SamePool(PoolKind::kMax, {8, 8, 4}, 3, 2),
                            SamePool(PoolKind::kMax, {6, 6, 3}, 4, 1)}) {
    SCOPED_TRACE(std::to_string(d.kh) + " pad " + PadString(d.pad));
    ASSERT_FALSE(d.pad.symmetric());
    const int n = 2;
    Pair x = Ties(n * d.in.size(), 79);
    Pair dy = Random(n * d.out.size(), 80);
    ExpectPoolingAgrees(cpu_.get(), gpu_.get(), d, n, x, dy);

    auto gk = gpu_->MakePool(d, n);
    ASSERT_TRUE(gk.ok()) << gk.status();
    EXPECT_GE((*gk)->WorkspaceBytes(n),
              static_cast<size_t>(n * d.out.size()) * sizeof(int32_t));
    Buffer ws = *gpu_->Allocate((*gk)->WorkspaceBytes(n));
    Pair trained = Zeros(n * d.out.size()), inferred = Zeros(n * d.out.size());
    (*gk)->Forward(n, x.g(), trained.g(), ws.as<void>());
    (*gk)->Forward(n, x.g(), inferred.g(), nullptr);
    EXPECT_EQ(inferred.gpu(), trained.gpu());
  }
}

// Batches reach the GPU as the data set's bytes and where augmentation puts
// each sample; the device makes the images (scaled, normalised, placed)
// that the host's loader makes, bit for bit.
TEST_F(GpuBackendTest, ImagesFromBytesAreTheLoadersBitForBit) {
  EXPECT_EQ(testing::CompareImagesFromBytes(gpu_.get()), "");
}

}  // namespace
}  // namespace dlbatch::trainer
