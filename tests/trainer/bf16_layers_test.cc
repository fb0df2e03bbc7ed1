// precision: bf16 on the CPU, kernel by kernel: refused with the reason on a
// CPU without AVX-512 BF16 or AMX (and fp16 refused on any CPU); where the
// CPU has them, convolutions and fully connected layers in bf16 against the
// same kernels in float32, within what rounding their inputs to bf16 (8
// significant bits) moves a sum of products.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/backend_select.h"

namespace dlbatch::trainer {
namespace {

using testing::DeviceArray;
using ::testing::HasSubstr;
using testing::RandomVector;

// ‖a − b‖ / ‖b‖ of two float arrays.
double Relative(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> ref(b.begin(), b.end());
  return testing::RelativeError(a, ref);
}

// Rounding x, w and dy to bf16 moves each product by up to 2^-8 relative;
// summed over hundreds of terms of both signs, the sums move by well under
// 1% of their norm. A kernel still in float32 would differ by ~1e-6; one
// that lost the float32 accumulation or a tensor, by far more than 1%.
constexpr double kBf16Tolerance = 1e-2;

TEST(Bf16Cpu, SupportIsReportedWithItsReason) {
  absl::Status support = CpuBf16Support();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCpuBackend(1, true);
  if (support.ok()) {
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_THAT((*backend)->Describe(), HasSubstr("bf16"));
    return;
  }
  EXPECT_EQ(support.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(support.message()), HasSubstr("AVX-512 BF16"));
  EXPECT_THAT(std::string(support.message()), HasSubstr("precision: fp32"));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status(), support);
  // Through the trainer's choice of backend, too.
  auto chosen = MakeChosenBackend(BackendChoice{}, 1, "bf16");
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status(), support);
}

TEST(Bf16Cpu, Fp16IsRefusedOnTheCpuSayingWhatToUse) {
  auto chosen = MakeChosenBackend(BackendChoice{}, 1, "fp16");
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(chosen.status().message()), HasSubstr("GPUs only"));
  EXPECT_THAT(std::string(chosen.status().message()), HasSubstr("bf16"));
  // fp32 and tf32 (the GPU's; the CPU computes fp32) still make one.
  for (const char* p : {"", "fp32", "tf32"}) {
    auto ok = MakeChosenBackend(BackendChoice{}, 1, p);
    ASSERT_TRUE(ok.ok()) << p << ": " << ok.status();
    EXPECT_THAT((*ok)->Describe(), ::testing::Not(HasSubstr("bf16")));
  }
}

class Bf16Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = CpuBf16Support(); !s.ok()) {
      GTEST_SKIP() << "this CPU cannot run bf16: " << s.message();
    }
    f32_ = *MakeCpuBackend(1, false);
    bf16_ = *MakeCpuBackend(1, true);
  }

  std::unique_ptr<Backend> f32_, bf16_;
};

struct Outputs {
  std::vector<float> y, dx, dw, db;
};

// A convolution's forward and both backward passes on `backend`.
Outputs RunConv(Backend* backend, const ConvDesc& d, int n,
                const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>& b, const std::vector<float>& dy) {
  auto kernel = backend->MakeConv(d, n);
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  if (!kernel.ok()) return {};
  DeviceArray dx_(backend, x), w_(backend, w), b_(backend, b),
      y_(backend, static_cast<int64_t>(dy.size())), dy_(backend, dy),
      dxo(backend, static_cast<int64_t>(x.size())),
      dwo(backend, static_cast<int64_t>(w.size())),
      dbo(backend, static_cast<int64_t>(b.size()));
  (*kernel)->Forward(n, dx_.data(), w_.data(), b_.data(), y_.data());
  (*kernel)->BackwardData(n, dy_.data(), w_.data(), dxo.data());
  (*kernel)->BackwardWeights(n, dx_.data(), dy_.data(), dwo.data(), dbo.data());
  return {y_.Get(), dxo.Get(), dwo.Get(), dbo.Get()};
}

TEST_F(Bf16Kernels, ConvolutionsMatchFloat32WithinBf16Rounding) {
  struct Case {
    Shape in;
    int filters, k, stride, pad;
  };
  // LeNet's first layer, a ResNet block's 3x3 'same', a strided one.
  for (const Case& c :
       {Case{{28, 28, 1}, 20, 5, 1, 0}, Case{{8, 8, 32}, 32, 3, 1, 1},
        Case{{9, 9, 16}, 24, 3, 2, 1}}) {
    ConvDesc d;
    d.in = c.in;
    d.filters = c.filters;
    d.kh = d.kw = c.k;
    d.stride_h = d.stride_w = c.stride;
    d.pad = {c.pad, c.pad, c.pad, c.pad};
    d.out = {(c.in.h + 2 * c.pad - c.k) / c.stride + 1,
             (c.in.w + 2 * c.pad - c.k) / c.stride + 1, c.filters};
    const int n = 4;
    const auto x = RandomVector(n * d.in.size(), 1);
    const auto w =
        RandomVector(int64_t{c.filters} * c.k * c.k * c.in.c, 2, -0.2, 0.2);
    const auto b = RandomVector(c.filters, 3);
    const auto dy = RandomVector(n * d.out.size(), 4);
    const Outputs ref = RunConv(f32_.get(), d, n, x, w, b, dy);
    const Outputs got = RunConv(bf16_.get(), d, n, x, w, b, dy);
    ASSERT_EQ(got.y.size(), ref.y.size());
    const std::string what = d.in.ToString() + " -> " + d.out.ToString();
    EXPECT_LT(Relative(got.y, ref.y), kBf16Tolerance) << what;
    EXPECT_LT(Relative(got.dx, ref.dx), kBf16Tolerance) << what;
    EXPECT_LT(Relative(got.dw, ref.dw), kBf16Tolerance) << what;
    // The bias gradient sums dy alone: bf16 rounding of dy only.
    EXPECT_LT(Relative(got.db, ref.db), kBf16Tolerance) << what;
    // Not float32 in disguise: rounding to bf16 does change the results.
    EXPECT_GT(Relative(got.y, ref.y), 1e-5) << what;
  }
}

TEST_F(Bf16Kernels, FullyConnectedMatchesFloat32WithinBf16Rounding) {
  const FcDesc d{800, 500};
  const int n = 16;
  const auto x = RandomVector(n * d.in, 5);
  const auto w = RandomVector(d.units * d.in, 6, -0.05, 0.05);
  const auto b = RandomVector(d.units, 7);
  const auto dy = RandomVector(n * d.units, 8);
  Outputs out[2];
  Backend* backends[2] = {f32_.get(), bf16_.get()};
  for (int i = 0; i < 2; ++i) {
    Backend* be = backends[i];
    auto kernel = be->MakeFc(d, n);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    DeviceArray xa(be, x), wa(be, w), ba(be, b), dya(be, dy),
        y(be, n * d.units), dx(be, n * d.in), dw(be, d.units * d.in),
        db(be, d.units);
    (*kernel)->Forward(n, xa.data(), wa.data(), ba.data(), y.data());
    (*kernel)->BackwardData(n, dya.data(), wa.data(), dx.data());
    (*kernel)->BackwardWeights(n, xa.data(), dya.data(), dw.data(), db.data());
    out[i] = {y.Get(), dx.Get(), dw.Get(), db.Get()};
  }
  EXPECT_LT(Relative(out[1].y, out[0].y), kBf16Tolerance);
  EXPECT_LT(Relative(out[1].dx, out[0].dx), kBf16Tolerance);
  EXPECT_LT(Relative(out[1].dw, out[0].dw), kBf16Tolerance);
  EXPECT_LT(Relative(out[1].db, out[0].db), kBf16Tolerance);
  EXPECT_GT(Relative(out[1].y, out[0].y), 1e-5);
}

// A step converts x and dy to bf16 once each and its later passes reuse
// the copies (BoundPrimitive::ShareInput). Reused only for the tensor that
// was converted, as it was: a pass given another tensor, or a new step
// over new contents in the same buffers, computes what a fresh kernel
// computes from those contents. Exactly, as both kernels come from one
// backend and so run the implementations its autotuning chose.
TEST_F(Bf16Kernels, APassReusesABf16CopyOnlyOfTheTensorItWasMadeFrom) {
  ConvDesc d;
  d.in = {8, 8, 32};
  d.filters = 32;
  d.kh = d.kw = 3;
  d.pad = {1, 1, 1, 1};
  d.out = {8, 8, 32};
  const int n = 4;
  Backend* be = bf16_.get();
  auto kernel = be->MakeConv(d, n);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  const int64_t xs = n * d.in.size(), ys = n * d.out.size();
  const auto w = RandomVector(9 * 32 * 32, 1, -0.2, 0.2);
  const auto b = RandomVector(32, 2);
  DeviceArray wa(be, w), ba(be, b), x(be, xs), other_x(be, xs), y(be, ys),
      dy(be, ys), other_dy(be, ys), dx(be, xs), dw(be, w.size()),
      db(be, b.size());

  // What a fresh kernel makes of x and dy in a whole step.
  auto fresh = [&](const std::vector<float>& xv,
                   const std::vector<float>& dyv) {
    auto k = be->MakeConv(d, n);
    EXPECT_TRUE(k.ok()) << k.status();
    DeviceArray xa(be, xv), dya(be, dyv), ya(be, ys), dxa(be, xs),
        dwa(be, w.size()), dba(be, b.size());
    (*k)->Forward(n, xa.data(), wa.data(), ba.data(), ya.data());
    (*k)->BackwardWeights(n, xa.data(), dya.data(), dwa.data(), dba.data());
    (*k)->BackwardData(n, dya.data(), wa.data(), dxa.data());
    return Outputs{ya.Get(), dxa.Get(), dwa.Get(), dba.Get()};
  };
  auto step = [&](const DeviceArray& fwd_x, const DeviceArray& bwd_x,
                  const DeviceArray& weights_dy, const DeviceArray& data_dy) {
    (*kernel)->Forward(n, fwd_x.data(), wa.data(), ba.data(), y.data());
    (*kernel)->BackwardWeights(n, bwd_x.data(), weights_dy.data(), dw.data(),
                               db.data());
    (*kernel)->BackwardData(n, data_dy.data(), wa.data(), dx.data());
  };

  // A whole step over x and dy in the kernel's buffers, against a fresh
  // kernel's.
  auto step_matches_fresh = [&](const std::vector<float>& xv,
                                const std::vector<float>& dyv) {
    x.Set(xv);
    dy.Set(dyv);
    step(x, x, dy, dy);
    const Outputs want = fresh(xv, dyv);
    EXPECT_EQ(y.Get(), want.y);
    EXPECT_EQ(dw.Get(), want.dw);
    EXPECT_EQ(db.Get(), want.db);
    EXPECT_EQ(dx.Get(), want.dx);
    return want;
  };
  const auto x1 = RandomVector(xs, 3), x2 = RandomVector(xs, 4);
  const auto dy1 = RandomVector(ys, 5), dy2 = RandomVector(ys, 6);
  const Outputs first = step_matches_fresh(x1, dy1);
  // The next step, new contents in the same buffers.
  const Outputs second = step_matches_fresh(x2, dy2);
  EXPECT_NE(second.dw, first.dw);

  // Backward passes given other tensors than the ones converted before
  // them: each reads its own (backward weights x2 and dy2, backward data
  // dy1).
  other_x.Set(x2);
  other_dy.Set(dy1);
  x.Set(x1);
  step(x, other_x, dy, other_dy);
  EXPECT_EQ(dw.Get(), second.dw);
  EXPECT_EQ(db.Get(), second.db);
  EXPECT_EQ(dx.Get(), first.dx);
}

}  // namespace
}  // namespace dlbatch::trainer
