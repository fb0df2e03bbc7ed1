// What the GPU backend's tests against the CPU backend (the reference it
// must match) share: a fixture that skips without a CUDA device, arrays
// mirrored on both backends, and a weighted layer's calls made on both.
// Only GPU test targets include it (it includes the CUDA runtime's header).
#ifndef DLBATCH_TESTS_TRAINER_GPU_AGAINST_CPU_H_
#define DLBATCH_TESTS_TRAINER_GPU_AGAINST_CPU_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"

namespace dlbatch::trainer::testing {

// One host array mirrored on the reference backend (the CPU) and on the
// one under test (the GPU): c() and g() are its two copies, to pass to the
// same call on each backend. REQUIRES: both backends outlive it.
class PairedArray {
 public:
  PairedArray(Backend* cpu, Backend* gpu, const std::vector<float>& host)
      : cpu_(cpu), gpu_(gpu), count_(static_cast<int64_t>(host.size())) {
    const size_t bytes = std::max<size_t>(host.size(), 1) * sizeof(float);
    c_ = *cpu->Allocate(bytes);
    g_ = *gpu->Allocate(bytes);
    cpu->CopyToDevice(c_.f32(), host.data(), host.size() * sizeof(float));
    gpu->CopyToDevice(g_.f32(), host.data(), host.size() * sizeof(float));
  }
  // `count` zeros.
  PairedArray(Backend* cpu, Backend* gpu, int64_t count)
      : PairedArray(cpu, gpu, std::vector<float>(count, 0.0f)) {}

  float* c() const { return c_.f32(); }
  float* g() const { return g_.f32(); }
  std::vector<float> cpu() const { return Get(cpu_, c_); }
  std::vector<float> gpu() const { return Get(gpu_, g_); }
  // ‖gpu − cpu‖ / ‖cpu‖.
  double error() const { return RelativeError(gpu(), cpu()); }

 private:
  std::vector<float> Get(Backend* b, const Buffer& buf) const {
    std::vector<float> host(count_);
    b->CopyToHost(host.data(), buf.f32(), count_ * sizeof(float));
    return host;
  }
  Backend* cpu_;
  Backend* gpu_;
  int64_t count_;
  Buffer c_, g_;
};

// A convolution's or fully connected layer's arrays (x, w and b in, dy
// back; y, dx, dw and db out) as PairedArrays, and the layer's three calls
// made on both backends. Kernel: ConvKernel or FcKernel.
struct WeightedLayerArrays {
  template <typename Kernel>
  void Forward(int n, Kernel& cpu, Kernel& gpu) {
    cpu.Forward(n, x.c(), w.c(), b.c(), y.c());
    gpu.Forward(n, x.g(), w.g(), b.g(), y.g());
  }
  template <typename Kernel>
  void BackwardData(int n, Kernel& cpu, Kernel& gpu) {
    cpu.BackwardData(n, dy.c(), w.c(), dx.c());
    gpu.BackwardData(n, dy.g(), w.g(), dx.g());
  }
  template <typename Kernel>
  void BackwardWeights(int n, Kernel& cpu, Kernel& gpu) {
    cpu.BackwardWeights(n, x.c(), dy.c(), dw.c(), db.c());
    gpu.BackwardWeights(n, x.g(), dy.g(), dw.g(), db.g());
  }

  PairedArray x, w, b, dy, y, dx, dw, db;
};

// A weighted layer's arrays on `cpu` and `gpu`: x and dx of `inputs`
// elements, y and dy of `outputs`, w and dw of `weights`, b and db of
// `biases`. Drawn by RandomVector from seeds ++*seed in the order x, w (in
// [-w_range, w_range)), b, dy, then y and dx where `garbage` (values a
// layer must overwrite; zeros otherwise, which draw no seed), dw and db.
inline WeightedLayerArrays RandomLayerArrays(Backend* cpu, Backend* gpu,
                                             int64_t inputs, int64_t outputs,
                                             int64_t weights, int64_t biases,
                                             double w_range, uint64_t* seed,
                                             bool garbage) {
  auto random = [&](int64_t count, double lo = -1, double hi = 1) {
    return PairedArray(cpu, gpu, RandomVector(count, ++*seed, lo, hi));
  };
  auto garbage_or_zeros = [&](int64_t count) {
    return garbage ? random(count) : PairedArray(cpu, gpu, count);
  };
  // A braced list is evaluated in order, so the seeds are drawn in order.
  return WeightedLayerArrays{random(inputs),
                             random(weights, -w_range, w_range),
                             random(biases),
                             random(outputs),
                             garbage_or_zeros(outputs),
                             garbage_or_zeros(inputs),
                             random(weights),
                             random(biases)};
}

// Convolution `d`'s RandomLayerArrays at batch `n`, w in [-0.3, 0.3).
inline WeightedLayerArrays ConvArrays(Backend* cpu, Backend* gpu,
                                      const ConvDesc& d, int n, uint64_t* seed,
                                      bool garbage) {
  return RandomLayerArrays(cpu, gpu, n * d.in.size(), n * d.out.size(),
                           int64_t{d.filters} * d.kh * d.kw * d.in.c, d.filters,
                           0.3, seed, garbage);
}

// Fully connected layer `d`'s RandomLayerArrays at batch `n`, w in
// [-0.1, 0.1).
inline WeightedLayerArrays FcArrays(Backend* cpu, Backend* gpu, const FcDesc& d,
                                    int n, uint64_t* seed, bool garbage) {
  return RandomLayerArrays(cpu, gpu, n * d.in, int64_t{n} * d.units,
                           d.units * d.in, d.units, 0.1, seed, garbage);
}

// A fixture of the GPU backend against the CPU's: skipped, saying why,
// where this process sees no CUDA device; else cpu_ is a one-thread CPU
// backend. A derived fixture's SetUp() calls this one, returns when
// IsSkipped() or HasFatalFailure(), then makes gpu_ as it needs it.
class GpuAgainstCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount says "
                   << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices")
                   << "; these tests need a GPU";
    }
    auto cpu = MakeCpuBackend(1);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = *std::move(cpu);
  }

  // `count` values drawn from [lo, hi) by RandomVector on both backends.
  PairedArray Random(int64_t count, uint64_t seed, double lo = -1,
                     double hi = 1) {
    return PairedArray(cpu_.get(), gpu_.get(),
                       RandomVector(count, seed, lo, hi));
  }

  std::unique_ptr<Backend> cpu_, gpu_;
};

}  // namespace dlbatch::trainer::testing

#endif  // DLBATCH_TESTS_TRAINER_GPU_AGAINST_CPU_H_
