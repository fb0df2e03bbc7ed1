// The GPU layer kernels' per-element arithmetic (gpu_elements.h, what each
// thread of gpu_layer_kernels.cu computes) run on the host, at int32 and
// int64 indices, against the CPU backend: tiled and padded pooling forward
// and backward, the zero-padded copy and crop that let a symmetric
// convolution run an asymmetric one, convolutions lowered to matrix
// products (conv_lowering.h, with a reference of cuBLAS's product), and a
// batch's images from bytes. Needs
// no GPU, so CI runs it; the launches themselves are gpu_backend_test's.
#include "trainer/cuda/gpu_elements.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trainer/images_from_bytes.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/cuda/conv_lowering.h"
#include "trainer/cuda/fc_low_products.h"
#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

using gpu::PadGeometry;
using gpu::Pooled;
using gpu::PoolGeometry;
using testing::Conv;
using testing::PadString;
using testing::RandomVector;
using testing::SameConv;
using testing::SamePool;

// ‖got − want‖ / ‖want‖.
double Relative(const std::vector<float>& got, const std::vector<float>& want) {
  std::vector<double> wide(want.begin(), want.end());
  return testing::RelativeError(got, wide);
}

// Random 0s and 1s: many ties in a max pool's windows.
std::vector<float> Ties(int64_t count, uint64_t seed) {
  std::vector<float> v = RandomVector(count, seed, 0, 2);
  for (float& x : v) x = std::floor(x);
  return v;
}

PoolGeometry Geometry(const PoolDesc& d) {
  return gpu::MakePoolGeometry(d.in.h, d.in.w, d.in.c, d.kh, d.kw, d.stride_h,
                               d.stride_w, d.pad.top, d.pad.left, d.out.h,
                               d.out.w);
}

std::string Describe(const PoolDesc& d) {
  return std::string(d.kind == PoolKind::kMax ? "max " : "average ") +
         d.in.ToString() + " -> " + d.out.ToString() + ", " +
         std::to_string(d.kh) + "x" + std::to_string(d.kw) + " stride " +
         std::to_string(d.stride_h) + " pad " + PadString(d.pad);
}

// Host memory through the CPU backend (whose memory is the host's).
class HostArray {
 public:
  HostArray(Backend* cpu, const std::vector<float>& values)
      : count_(static_cast<int64_t>(values.size())) {
    buffer_ =
        *cpu->Allocate(std::max<size_t>(values.size(), 1) * sizeof(float));
    cpu->CopyToDevice(buffer_.f32(), values.data(),
                      values.size() * sizeof(float));
  }
  HostArray(Backend* cpu, int64_t count)
      : HostArray(cpu, std::vector<float>(count, 0.0f)) {}
  float* data() const { return buffer_.f32(); }
  std::vector<float> values() const {
    return std::vector<float>(buffer_.f32(), buffer_.f32() + count_);
  }

 private:
  int64_t count_;
  Buffer buffer_;
};

template <typename Index>
class GpuElementsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cpu = MakeCpuBackend(1);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = *std::move(cpu);
  }

  // f(i) for every element i < count, as the kernel's threads compute them.
  template <typename Value, typename F>
  static std::vector<Value> Elements(int64_t count, F f) {
    std::vector<Value> out(count);
    for (int64_t i = 0; i < count; ++i) out[i] = f(static_cast<Index>(i));
    return out;
  }

  // The CPU backend's pooling of n samples of x (gradient dy): y and dx.
  void CpuPooling(const PoolDesc& d, int n, const std::vector<float>& x,
                  const std::vector<float>& dy, std::vector<float>* y,
                  std::vector<float>* dx) {
    auto k = cpu_->MakePool(d, n);
    ASSERT_TRUE(k.ok()) << k.status();
    Buffer ws;
    if (size_t bytes = (*k)->WorkspaceBytes(n)) ws = *cpu_->Allocate(bytes);
    HostArray hx(cpu_.get(), x), hdy(cpu_.get(), dy);
    HostArray hy(cpu_.get(), n * d.out.size()),
        hdx(cpu_.get(), n * d.in.size());
    (*k)->Forward(n, hx.data(), hy.data(), ws.as<void>());
    (*k)->Backward(n, hx.data(), hy.data(), hdy.data(), ws.as<void>(),
                   hdx.data());
    *y = hy.values();
    *dx = hdx.values();
  }

  // Three samples of random inputs (0s and 1s with `ties`) and gradients
  // for `d`, and the CPU backend's pooling of them.
  struct PoolingCase {
    int n = 3;
    std::vector<float> x, dy, want_y, want_dx;
  };
  PoolingCase Pooling(const PoolDesc& d, bool ties, uint64_t* seed) {
    PoolingCase p;
    p.x = ties ? Ties(p.n * d.in.size(), ++*seed)
               : RandomVector(p.n * d.in.size(), ++*seed);
    p.dy = RandomVector(p.n * d.out.size(), ++*seed);
    CpuPooling(d, p.n, p.x, p.dy, &p.want_y, &p.want_dx);
    return p;
  }

  std::unique_ptr<Backend> cpu_;
};

using IndexTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(GpuElementsTest, IndexTypes);

// LeNet's 2x2/2, windows that leave the last row and column uncovered, and
// 3x3/3; random values and ties. Max pooling picks the same element as the
// CPU, so forward and backward agree exactly.
TYPED_TEST(GpuElementsTest, TiledMaxPoolingIsTheCpusBitForBit) {
  const PoolDesc descs[] = {
      {PoolKind::kMax, {24, 24, 20}, 2, 2, 2, 2, {}, {12, 12, 20}},
      {PoolKind::kMax, {7, 7, 3}, 2, 2, 2, 2, {}, {3, 3, 3}},
      {PoolKind::kMax, {9, 9, 4}, 3, 3, 3, 3, {}, {3, 3, 4}},
  };
  uint64_t seed = 10;
  for (const PoolDesc& d : descs) {
    for (const bool ties : {false, true}) {
      SCOPED_TRACE(Describe(d) + (ties ? ", ties" : ""));
      const auto [n, x, dy, want_y, want_dx] = this->Pooling(d, ties, &seed);
      // Pointers for the lambdas: clang 14 cannot capture a structured
      // binding.
      const float* const xs = x.data();
      const float* const dys = dy.data();

      const PoolGeometry g = Geometry(d);
      const std::vector<Pooled> pooled = this->template Elements<Pooled>(
          n * d.out.size(),
          [&](auto i) { return gpu::MaxPoolTiledAt(i, g, xs); });
      std::vector<float> y;
      std::vector<uint8_t> argmax;
      for (const Pooled& p : pooled) {
        y.push_back(p.value);
        ASSERT_GE(p.where, 0);
        ASSERT_LT(p.where, d.kh * d.kw);
        argmax.push_back(static_cast<uint8_t>(p.where));
      }
      const std::vector<float> dx =
          this->template Elements<float>(n * d.in.size(), [&](auto i) {
            return gpu::MaxPoolTiledGradAt(i, g, argmax.data(), dys);
          });
      EXPECT_EQ(y, want_y);
      EXPECT_EQ(dx, want_dx);
    }
  }
}

// `same` pooling with asymmetric padding (the windows the GPU's own kernels
// run because cuDNN pads symmetrically), and a symmetric one: max forward
// exactly, average and the gradients (summed in another order) within
// float tolerance; max with ties, the same elements.
TYPED_TEST(GpuElementsTest, PaddedPoolingAgreesWithTheCpu) {
  struct Case {
    Shape in;
    int k, stride;
  };
  const Case cases[] = {
      {{7, 6, 5}, 2, 1},  // pads 0,0,1,1
      {{8, 8, 4}, 3, 2},  // 0,0,1,1
      {{8, 7, 3}, 3, 2},  // 0,1,1,1: asymmetric in h only
      {{6, 6, 2}, 4, 1},  // 1,1,2,2
      {{7, 7, 3}, 2, 2},  // 0,0,1,1: tiles but for the padding
      {{7, 7, 6}, 3, 1},  // 1,1,1,1: symmetric
  };
  uint64_t seed = 100;
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (const Case& c : cases) {
      for (const bool ties : {false, true}) {
        const PoolDesc d = SamePool(kind, c.in, c.k, c.stride);
        SCOPED_TRACE(Describe(d) + (ties ? ", ties" : ""));
        const bool is_max = kind == PoolKind::kMax;
        const auto [n, x, dy, want_y, want_dx] = this->Pooling(d, ties, &seed);
        // Pointers for the lambdas: clang 14 cannot capture a structured
        // binding.
        const float* const xs = x.data();
        const float* const dys = dy.data();

        const PoolGeometry g = Geometry(d);
        const std::vector<Pooled> pooled = this->template Elements<Pooled>(
            n * d.out.size(),
            [&](auto i) { return gpu::PoolPaddedAt(i, is_max, g, xs); });
        std::vector<float> y;
        std::vector<int32_t> argmax;
        for (const Pooled& p : pooled) {
          y.push_back(p.value);
          argmax.push_back(p.where);
          if (is_max) {
            ASSERT_GE(p.where, 0);  // `same` leaves no window empty
            ASSERT_LT(p.where, d.kh * d.kw);
          }
        }
        const std::vector<float> dx =
            this->template Elements<float>(n * d.in.size(), [&](auto i) {
              return gpu::PoolPaddedGradAt(i, is_max, g, argmax.data(), dys);
            });
        if (is_max) {
          EXPECT_EQ(y, want_y);
        } else {
          EXPECT_LT(Relative(y, want_y), 1e-6);
        }
        EXPECT_LT(Relative(dx, want_dx), 1e-6);
      }
    }
  }
}

// The GPU runs a convolution whose `same` padding is asymmetric as a
// symmetric one (cuDNN's) over a zero-padded copy of its input, and crops
// the copy's gradient back. Here the CPU's convolution stands in for
// cuDNN's: over the copy with no padding it must give the asymmetric
// convolution's output, input gradient (cropped) and weight gradients.
TYPED_TEST(GpuElementsTest, PaddedCopyAndCropRunAnAsymmetricConvolution) {
  const ConvDesc descs[] = {
      SameConv({8, 8, 3}, 6, 4, 1),  // even window: pads 1,1,2,2
      SameConv({8, 8, 5}, 7, 3, 2),  // stride 2 on an even size: 0,0,1,1
      SameConv({8, 7, 3}, 4, 3, 2),  // asymmetric in h only: 0,1,1,1
  };
  Backend* cpu = this->cpu_.get();
  uint64_t seed = 200;
  for (const ConvDesc& d : descs) {
    SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString());
    ASSERT_FALSE(d.pad.symmetric());
    ConvDesc on_copy = d;
    on_copy.in.h += d.pad.top + d.pad.bottom;
    on_copy.in.w += d.pad.left + d.pad.right;
    on_copy.pad = Padding{};
    const PadGeometry g{d.in.h,     d.in.w,       d.in.c,      d.pad.top,
                        d.pad.left, on_copy.in.h, on_copy.in.w};
    const int n = 3;
    const int64_t weights = int64_t{d.filters} * d.kh * d.kw * d.in.c;
    const std::vector<float> x = RandomVector(n * d.in.size(), ++seed);
    HostArray w(cpu, RandomVector(weights, ++seed, -0.3, 0.3));
    HostArray b(cpu, RandomVector(d.filters, ++seed));
    HostArray dy(cpu, RandomVector(n * d.out.size(), ++seed));

    const std::vector<float> padded = this->template Elements<float>(
        n * on_copy.in.size(),
        [&](auto i) { return gpu::PaddedAt(i, g, x.data()); });
    // The copy holds x and zeros: cropping it gives x back exactly.
    EXPECT_EQ(this->template Elements<float>(
                  n * d.in.size(),
                  [&](auto i) { return gpu::CroppedAt(i, g, padded.data()); }),
              x);

    auto asymmetric = cpu->MakeConv(d, n);
    auto symmetric = cpu->MakeConv(on_copy, n);
    ASSERT_TRUE(asymmetric.ok()) << asymmetric.status();
    ASSERT_TRUE(symmetric.ok()) << symmetric.status();
    HostArray hx(cpu, x), hpadded(cpu, padded);
    HostArray want_y(cpu, n * d.out.size()), y(cpu, n * d.out.size());
    HostArray want_dx(cpu, n * d.in.size());
    HostArray dpadded(cpu, n * on_copy.in.size());
    HostArray want_dw(cpu, weights), dw(cpu, weights);
    HostArray want_db(cpu, d.filters), db(cpu, d.filters);
    (*asymmetric)->Forward(n, hx.data(), w.data(), b.data(), want_y.data());
    (*asymmetric)->BackwardData(n, dy.data(), w.data(), want_dx.data());
    (*asymmetric)
        ->BackwardWeights(n, hx.data(), dy.data(), want_dw.data(),
                          want_db.data());
    (*symmetric)->Forward(n, hpadded.data(), w.data(), b.data(), y.data());
    (*symmetric)->BackwardData(n, dy.data(), w.data(), dpadded.data());
    (*symmetric)
        ->BackwardWeights(n, hpadded.data(), dy.data(), dw.data(), db.data());
    const std::vector<float> dpadded_values = dpadded.values();
    const std::vector<float> dx = this->template Elements<float>(
        n * d.in.size(),
        [&](auto i) { return gpu::CroppedAt(i, g, dpadded_values.data()); });
    EXPECT_LT(Relative(y.values(), want_y.values()), 1e-5);
    EXPECT_LT(Relative(dx, want_dx.values()), 1e-5);
    EXPECT_LT(Relative(dw.values(), want_dw.values()), 1e-5);
    EXPECT_LT(Relative(db.values(), want_db.values()), 1e-5);
  }
}

// precision: bf16 | fp16 on the GPU (gpu_conv_low.cc) runs cuDNN on copies
// cast by gpu_cast_kernels.cu: channels and filters padded to multiples of
// 8, an asymmetric padding made a border, and the results cast back
// (cropped, the bias added). With the casts' rounding left out (float
// copies here) and the CPU's convolution standing in for cuDNN's, the
// copies' geometry must give the layer's own output, input gradient and
// weight gradient.
TYPED_TEST(GpuElementsTest, LowPrecisionCopiesRunTheConvolution) {
  const ConvDesc descs[] = {
      Conv({6, 6, 1}, 5, 3, 1, 0),   // 1 channel and 5 filters: 8 each
      Conv({5, 5, 3}, 10, 3, 1, 1),  // cuDNN's symmetric padding: 16 filters
      Conv({4, 4, 8}, 16, 1, 1, 0),  // nothing padded
      SameConv({8, 8, 3}, 6, 4, 1),  // a border of 1,1,2,2
      SameConv({8, 7, 5}, 7, 3, 2),  // 0,1,1,1
  };
  Backend* cpu = this->cpu_.get();
  auto pad8 = [](int c) { return (c + 7) / 8 * 8; };
  uint64_t seed = 400;
  for (const ConvDesc& d : descs) {
    SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString());
    const bool border = !d.pad.symmetric();
    const int pc = pad8(d.in.c), pk = pad8(d.filters);
    // What gpu_conv_low.cc describes to cuDNN: the copies' shapes.
    ConvDesc on_copy = d;
    on_copy.in = {border ? d.in.h + d.pad.top + d.pad.bottom : d.in.h,
                  border ? d.in.w + d.pad.left + d.pad.right : d.in.w, pc};
    on_copy.filters = pk;
    on_copy.out.c = pk;
    if (border) on_copy.pad = Padding{};
    const gpu::CastGeometry input{d.in.h,
                                  d.in.w,
                                  d.in.c,
                                  on_copy.in.h,
                                  on_copy.in.w,
                                  pc,
                                  border ? d.pad.top : 0,
                                  border ? d.pad.left : 0};
    const gpu::CastGeometry output{d.out.h, d.out.w, d.filters,
                                   d.out.h, d.out.w, pk};
    const gpu::CastGeometry filters{d.kh, d.kw, d.in.c, d.kh, d.kw, pc};
    auto to_copy = [&](const gpu::CastGeometry& g, int n, int padded_n,
                       const std::vector<float>& from) {
      return this->template Elements<float>(
          int64_t{padded_n} * g.ph * g.pw * g.pc, [&](auto i) {
            const auto source = gpu::CastSource(i, g, n);
            return source < 0 ? 0.0f : from[source];
          });
    };
    auto back = [&](const gpu::CastGeometry& g, int n,
                    const std::vector<float>& copy, const float* bias) {
      return this->template Elements<float>(
          int64_t{n} * g.h * g.w * g.c, [&](auto i) {
            const float v = copy[gpu::CastBackSource(i, g)];
            return bias != nullptr ? v + bias[i % g.c] : v;
          });
    };

    const int n = 3;
    const int64_t weights = int64_t{d.filters} * d.kh * d.kw * d.in.c;
    const std::vector<float> x = RandomVector(n * d.in.size(), ++seed);
    const std::vector<float> w = RandomVector(weights, ++seed, -0.3, 0.3);
    const std::vector<float> b = RandomVector(d.filters, ++seed);
    const std::vector<float> dy = RandomVector(n * d.out.size(), ++seed);
    // The copies round-trip: cast back, x is x.
    const std::vector<float> x_copy = to_copy(input, n, n, x);
    EXPECT_EQ(back(input, n, x_copy, nullptr), x);

    auto layer = cpu->MakeConv(d, n);
    auto copied = cpu->MakeConv(on_copy, n);
    ASSERT_TRUE(layer.ok()) << layer.status();
    ASSERT_TRUE(copied.ok()) << copied.status();
    HostArray hx(cpu, x), hw(cpu, w), hb(cpu, b), hdy(cpu, dy);
    HostArray want_y(cpu, n * d.out.size()), want_dx(cpu, n * d.in.size());
    HostArray want_dw(cpu, weights), want_db(cpu, d.filters);
    (*layer)->Forward(n, hx.data(), hw.data(), hb.data(), want_y.data());
    (*layer)->BackwardWeights(n, hx.data(), hdy.data(), want_dw.data(),
                              want_db.data());
    (*layer)->BackwardData(n, hdy.data(), hw.data(), want_dx.data());

    HostArray cx(cpu, x_copy), cw(cpu, to_copy(filters, d.filters, pk, w));
    HostArray cdy(cpu, to_copy(output, n, n, dy));
    HostArray no_bias(cpu, std::vector<float>(pk, 0.0f));
    HostArray cy(cpu, n * on_copy.out.size()), cdx(cpu, n * on_copy.in.size());
    HostArray cdw(cpu, int64_t{pk} * d.kh * d.kw * pc), cdb(cpu, pk);
    (*copied)->Forward(n, cx.data(), cw.data(), no_bias.data(), cy.data());
    (*copied)->BackwardWeights(n, cx.data(), cdy.data(), cdw.data(),
                               cdb.data());
    (*copied)->BackwardData(n, cdy.data(), cw.data(), cdx.data());
    EXPECT_LT(Relative(back(output, n, cy.values(), b.data()), want_y.values()),
              1e-5);
    EXPECT_LT(Relative(back(input, n, cdx.values(), nullptr), want_dx.values()),
              1e-5);
    EXPECT_LT(Relative(back(filters, d.filters, cdw.values(), nullptr),
                       want_dw.values()),
              1e-5);
  }
}

// The multiply-and-shift division the lowered convolution's kernels use
// gives n / d exactly: every divisor to 3000 against the first 3000
// dividends, multiples of it and their neighbours up to 2^31 - 1, and large
// divisors, powers of two and their neighbours among them.
TEST(DivisorTest, DividesExactlyBelowTwoToThe31) {
  auto check = [](int d, int64_t n) {
    if (n < 0 || n > INT32_MAX) return;
    const int got = gpu::Divisor(d).Of(static_cast<int>(n));
    ASSERT_EQ(got, n / d) << n << " / " << d;
  };
  std::vector<int> divisors;
  for (int d = 1; d <= 3000; ++d) divisors.push_back(d);
  for (int l = 12; l <= 31; ++l) {
    const int64_t p = int64_t{1} << l;
    for (int64_t d : {p - 1, p, p + 1, p / 3, p / 3 + 1}) {
      if (d >= 1 && d <= INT32_MAX) divisors.push_back(static_cast<int>(d));
    }
  }
  uint64_t state = 12345;
  auto next = [&] {  // xorshift: any numbers will do
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int d : divisors) {
    SCOPED_TRACE(d);
    if (d <= 3000) {
      for (int n = 0; n < 3000; ++n) check(d, n);
    }
    for (int64_t q : {int64_t{1}, int64_t{7}, int64_t{INT32_MAX} / d,
                      int64_t{INT32_MAX} / d - 1}) {
      for (int64_t delta : {-1, 0, 1}) check(d, q * d + delta);
    }
    check(d, INT32_MAX);
    for (int k = 0; k < 200; ++k) check(d, static_cast<int64_t>(next() >> 33));
  }
}

// C = op(A) op(B) (+ C where beta is 1), column-major, as cublasSgemm
// computes it (alpha 1); fails the test where cuBLAS would refuse the
// leading dimensions.
void HostProduct(const gpu::MatrixProduct& p, const float* a, const float* b,
                 float beta, float* c) {
  ASSERT_GE(p.lda, std::max(1, p.trans_a ? p.k : p.m));
  ASSERT_GE(p.ldb, std::max(1, p.trans_b ? p.n : p.k));
  ASSERT_GE(p.ldc, std::max(1, p.m));
  for (int j = 0; j < p.n; ++j) {
    for (int i = 0; i < p.m; ++i) {
      double sum = 0;
      for (int l = 0; l < p.k; ++l) {
        const float av =
            p.trans_a ? a[l + int64_t{i} * p.lda] : a[i + int64_t{l} * p.lda];
        const float bv =
            p.trans_b ? b[j + int64_t{l} * p.ldb] : b[l + int64_t{j} * p.ldb];
        sum += double{av} * bv;
      }
      float& out = c[i + int64_t{j} * p.ldc];
      out = static_cast<float>(beta != 0 ? sum + double{beta} * out : sum);
    }
  }
}

// A fully connected layer in bf16 or fp16 (gpu_fc.cc) step for step on the
// host, the casts' rounding left out: the copies padded as
// fc_low_products.h says (checked: x's rows, the weights' rows and their
// count, zeros beyond), cuBLAS's products as it describes them, against the
// CPU backend's layer. Sizes that are multiples of 8 and sizes that are not.
TYPED_TEST(GpuElementsTest, LowPrecisionFullyConnectedProductsAreTheCpus) {
  Backend* cpu = this->cpu_.get();
  uint64_t seed = 500;
  for (const FcDesc d : {FcDesc{13, 5}, FcDesc{16, 8}, FcDesc{50, 10}}) {
    SCOPED_TRACE(d.in);
    const gpu::FcLowProducts p(d.in, d.units);
    EXPECT_EQ(p.in_p() % 8, 0);
    EXPECT_EQ(p.units_p() % 8, 0);
    auto to_copy = [&](const gpu::CastGeometry& g, int n, int padded_n,
                       const std::vector<float>& from) {
      return this->template Elements<float>(
          int64_t{padded_n} * g.pc, [&](auto i) {
            const auto source = gpu::CastSource(i, g, n);
            return source < 0 ? 0.0f : from[source];
          });
    };
    const int n = 3, in = static_cast<int>(d.in);
    const std::vector<float> x = RandomVector(n * d.in, ++seed);
    const std::vector<float> w = RandomVector(d.units * d.in, ++seed);
    const std::vector<float> b = RandomVector(d.units, ++seed);
    const std::vector<float> dy = RandomVector(n * d.units, ++seed);
    const std::vector<float> wc =
        to_copy(p.InputRows(), d.units, p.units_p(), w);
    for (int r = 0; r < p.units_p(); ++r) {
      for (int k = 0; k < p.in_p(); ++k) {
        ASSERT_EQ(wc[r * p.in_p() + k],
                  r < d.units && k < in ? w[r * in + k] : 0.0f)
            << r << ", " << k;
      }
    }
    const std::vector<float> xc = to_copy(p.InputRows(), n, n, x);
    const std::vector<float> dyc = to_copy(p.GradientRows(), n, n, dy);

    auto layer = cpu->MakeFc(d, n);
    ASSERT_TRUE(layer.ok()) << layer.status();
    HostArray hx(cpu, x), hw(cpu, w), hb(cpu, b), hdy(cpu, dy);
    HostArray want_y(cpu, n * d.units), want_dx(cpu, n * d.in);
    HostArray want_dw(cpu, d.units * d.in), want_db(cpu, d.units);
    (*layer)->Forward(n, hx.data(), hw.data(), hb.data(), want_y.data());
    (*layer)->BackwardWeights(n, hx.data(), hdy.data(), want_dw.data(),
                              want_db.data());
    (*layer)->BackwardData(n, hdy.data(), hw.data(), want_dx.data());

    std::vector<float> y(n * d.units), dx(n * d.in), dw(d.units * d.in);
    for (int s = 0; s < n; ++s) {
      std::copy(b.begin(), b.end(), y.begin() + s * d.units);  // the bias
    }
    HostProduct(p.Forward(n), wc.data(), xc.data(), 1, y.data());
    HostProduct(p.BackwardData(n), wc.data(), dyc.data(), 0, dx.data());
    HostProduct(p.BackwardWeights(n), xc.data(), dyc.data(), 0, dw.data());
    EXPECT_LT(Relative(y, want_y.values()), 1e-5);
    EXPECT_LT(Relative(dx, want_dx.values()), 1e-5);
    EXPECT_LT(Relative(dw, want_dw.values()), 1e-5);
  }
}

// gpu_conv.cc's lowered convolution step for step on the host: per chunk
// of samples, the patches (PatchAt), cuBLAS's product as conv_lowering.h
// describes it, and the fold of the patches' gradient (FoldedAt), against
// the CPU backend's convolution; in one chunk and in several (a workspace
// cap of two samples' patches, the last chunk short).
TYPED_TEST(GpuElementsTest, LoweredConvolutionIsTheCpus) {
  const ConvDesc descs[] = {
      Conv({28, 28, 1}, 20, 5, 1, 0),   // LeNet's first
      Conv({12, 12, 20}, 50, 5, 1, 0),  // and second
      Conv({9, 9, 3}, 8, 3, 2, 1),      // strided, padded
      Conv({6, 6, 8}, 5, 1, 1, 0),      // 1x1: the patches are x
      Conv({7, 7, 4}, 6, 1, 2, 0),      // 1x1, strided: they are not
      Conv({5, 5, 3}, 4, 5, 1, 2),      // windows mostly in the padding
      SameConv({8, 8, 3}, 6, 4, 1),     // asymmetric: pads 1,1,2,2
      SameConv({8, 7, 3}, 4, 3, 2),     // in h only: 0,1,1,1
  };
  // And a 3x2 window moved by 2 down and 1 across, padded in h only.
  ConvDesc oblong = Conv({9, 8, 3}, 4, 3, 2, 1);
  oblong.kw = 2;
  oblong.stride_w = 1;
  oblong.pad.left = oblong.pad.right = 0;
  oblong.out = Shape{5, 7, 4};
  std::vector<ConvDesc> all(std::begin(descs), std::end(descs));
  all.push_back(oblong);
  Backend* cpu = this->cpu_.get();
  uint64_t seed = 300;
  for (const ConvDesc& d : all) {
    const int n = 6;
    const int64_t in = d.in.size(), out = d.out.size();
    const int64_t weights = int64_t{d.filters} * d.kh * d.kw * d.in.c;
    const std::vector<float> x = RandomVector(n * in, ++seed);
    const std::vector<float> w = RandomVector(weights, ++seed, -0.3, 0.3);
    const std::vector<float> b = RandomVector(d.filters, ++seed);
    const std::vector<float> dy = RandomVector(n * out, ++seed);

    auto k = cpu->MakeConv(d, n);
    ASSERT_TRUE(k.ok()) << k.status();
    HostArray hx(cpu, x), hw(cpu, w), hb(cpu, b), hdy(cpu, dy);
    HostArray want_y(cpu, n * out), want_dx(cpu, n * in);
    HostArray want_dw(cpu, weights), want_db(cpu, d.filters);
    (*k)->Forward(n, hx.data(), hw.data(), hb.data(), want_y.data());
    (*k)->BackwardData(n, hdy.data(), hw.data(), want_dx.data());
    (*k)->BackwardWeights(n, hx.data(), hdy.data(), want_dw.data(),
                          want_db.data());

    const int64_t sample_bytes =
        int64_t{d.out.h} * d.out.w * d.kh * d.kw * d.in.c * sizeof(float);
    // Chunks of all 6 samples, of 2, and of 4 then 2; backward weights in
    // one group per chunk or in up to 4.
    struct Split {
      int samples;  // per chunk
      int groups;   // at most
    };
    for (const Split split : {Split{n, 1}, Split{2, 1}, Split{4, 1},
                              Split{n, 4}, Split{2, 4}, Split{4, 4}}) {
      const size_t cap =
          split.samples == n
              ? size_t{1} << 30
              : static_cast<size_t>(split.samples * sample_bytes);
      const gpu::ConvLowering lowered(d, cap);
      SCOPED_TRACE(d.in.ToString() + " -> " + d.out.ToString() + " " +
                   std::to_string(d.kh) + "x" + std::to_string(d.kw) +
                   " stride " + std::to_string(d.stride_h) + " pad " +
                   PadString(d.pad) + ", chunks of " +
                   std::to_string(lowered.chunk()) + ", groups up to " +
                   std::to_string(split.groups));
      EXPECT_EQ(lowered.identity(), d.kh == 1 && d.stride_h == 1);
      if (!lowered.identity()) {
        EXPECT_EQ(std::min(lowered.chunk(), n), split.samples);
      }
      const gpu::ConvGeometry& g = lowered.geometry();
      std::vector<float> y(n * out), dx(n * in), dw(weights, 7.0f);
      for (int s = 0; s < n; s += lowered.chunk()) {
        const int samples = std::min(lowered.chunk(), n - s);
        const float* xs = x.data() + s * in;
        std::vector<float> patches;
        if (!lowered.identity()) {
          patches = this->template Elements<float>(
              lowered.PatchElements(samples),
              [&](auto i) { return gpu::PatchAt(i, g, xs); });
          xs = patches.data();
        }
        HostProduct(lowered.Forward(samples), w.data(), xs, 0,
                    y.data() + s * out);
        std::vector<float> dpatches(lowered.PatchElements(samples));
        HostProduct(lowered.BackwardData(samples), w.data(),
                    dy.data() + s * out, 0,
                    lowered.identity() ? dx.data() + s * in : dpatches.data());
        if (!lowered.identity()) {
          const std::vector<float> folded = this->template Elements<float>(
              samples * in,
              [&](auto i) { return gpu::FoldedAt(i, g, dpatches.data()); });
          std::copy(folded.begin(), folded.end(), dx.begin() + s * in);
        }
        const int groups = gpu::ConvLowering::Groups(samples, split.groups);
        if (groups == 1) {
          HostProduct(lowered.BackwardWeights(samples), xs, dy.data() + s * out,
                      s == 0 ? 0 : 1, dw.data());
          continue;
        }
        // As cublasSgemmStridedBatched, then SumPartsKernel.
        const int per = samples / groups;
        const gpu::MatrixProduct product = lowered.BackwardWeights(per);
        const int64_t rows = lowered.Rows64(per);
        const int64_t size = lowered.FilterElements();
        std::vector<float> parts(groups * size, 5.0f);
        for (int k = 0; k < groups; ++k) {
          HostProduct(product, xs + k * rows * product.lda,
                      dy.data() + s * out + k * rows * product.ldb, 0,
                      parts.data() + k * size);
        }
        const std::vector<float> summed =
            this->template Elements<float>(size, [&](auto i) {
              return gpu::SumOfPartsAt(
                  i, groups, static_cast<decltype(i)>(size), parts.data());
            });
        for (int64_t i = 0; i < size; ++i) {
          dw[i] = s > 0 ? dw[i] + summed[i] : summed[i];
        }
      }
      for (int64_t r = 0; r < n * out / d.filters; ++r) {
        for (int f = 0; f < d.filters; ++f) y[r * d.filters + f] += b[f];
      }
      EXPECT_LT(Relative(y, want_y.values()), 1e-5);
      EXPECT_LT(Relative(dx, want_dx.values()), 1e-5);
      EXPECT_LT(Relative(dw, want_dw.values()), 1e-5);
    }
  }
}

// PrepareImagesKernel's arithmetic makes the loader's images from bytes and
// placements, bit for bit (the cases data_test runs on the CPU backend).
TYPED_TEST(GpuElementsTest, ImagesFromBytesAreTheLoadersBitForBit) {
  EXPECT_EQ(testing::CompareImagesFromBytes(
                [](int n, const Shape& shape, const uint8_t* pixels,
                   const SamplePlacement* placements, const float* scale_bias,
                   float* out, int64_t) {
                  const std::vector<float> made =
                      GpuElementsTest<TypeParam>::template Elements<float>(
                          n * shape.size(), [&](auto i) {
                            return gpu::ImageAt(i, shape.h, shape.w, shape.c,
                                                pixels, placements, scale_bias);
                          });
                  std::copy(made.begin(), made.end(), out);
                }),
            "");
}

}  // namespace
}  // namespace dlbatch::trainer
