// precision: bf16 on the CPU, kernel by kernel: refused with the reason on a
// CPU without AVX-512 BF16 or AMX (and fp16 refused on any CPU); where the
// CPU has them, convolutions and fully connected layers in bf16 against the
// same kernels in float32, within what rounding their inputs to bf16 (8
// significant bits) moves a sum of products.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/backend_select.h"
#include "trainer/network.h"

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
// In bf16, a conv hands the batch norm it alone feeds its output in bf16,
// and that batch norm (its relu folded in) hands bf16 on to the one conv
// after it or as an add's last input, gradients likewise; elsewhere
// activations stay float32.
// The network's outputs and gradients match float32's within bf16 rounding.
TEST_F(Bf16Kernels, BatchNormsTakeAndGiveBf16NextToConvolutions) {
  auto layer = [](const std::string& type, const std::string& name,
                  std::vector<std::string> inputs = {}) {
    v1::LayerSpec l;
    l.set_type(type);
    l.set_name(name);
    for (const std::string& i : inputs) l.add_inputs(i);
    if (type == "conv") {
      l.set_filters(16);
      l.set_size(3);
      l.set_padding_same(true);
    }
    return l;
  };
  v1::NetworkSpec spec;
  for (int d : {8, 8, 3}) spec.add_input(d);
  v1::LayerSpec fc = layer("fc", "fc");
  fc.set_units(5);
  for (const v1::LayerSpec& l : {layer("conv", "c1"),
                                 layer("batchnorm", "b1"),
                                 layer("relu", "r1"),  // to c2 alone
                                 layer("conv", "c2"),
                                 layer("batchnorm", "b2"),
                                 layer("relu", "r2"),  // to c3 and the add
                                 layer("conv", "c3"),
                                 layer("batchnorm", "b3"),  // the add's last
                                 layer("add", "sum", {"r2", "b3"}),
                                 layer("relu", "r3"),
                                 layer("conv", "c4"),
                                 layer("relu", "r4"),  // a conv, then relu
                                 layer("conv", "c5"),
                                 layer("batchnorm", "b5"),
                                 layer("relu", "r5"),  // to two convs
                                 layer("conv", "c6", {"r5"}),
                                 layer("conv", "c7", {"r5"}),
                                 layer("add", "sum2", {"c6", "c7"}),
                                 fc,
                                 layer("softmax", "p")}) {
    *spec.add_layers() = l;
  }
  const int n = 4;
  auto bf16 = Network::Build(spec, bf16_.get(), n);
  auto f32 = Network::Build(spec, f32_.get(), n);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_TRUE(f32.ok()) << f32.status();
  std::vector<std::string> in_bf16;
  for (const LayerInfo& l : (*bf16)->layers()) {
    if (l.bf16_output) in_bf16.push_back(l.name);
  }
  EXPECT_EQ(in_bf16,
            (std::vector<std::string>{"c1", "b1", "c2", "c3", "b3", "c5"}));
  for (const LayerInfo& l : (*f32)->layers()) EXPECT_FALSE(l.bf16_output);

  (*bf16)->Initialize(5);
  (*f32)->Initialize(5);
  DeviceArray images(f32_.get(), RandomVector(n * 8 * 8 * 3, 3));
  std::vector<int32_t> labels = {0, 3, 1, 4};
  Buffer label_buffer = *f32_->Allocate(n * 4);
  f32_->CopyToDevice(label_buffer.as<void>(), labels.data(), n * 4);
  for (Network* net : {bf16->get(), f32->get()}) {
    net->Forward(n, images.data(), /*training=*/true);
    net->Backward(n, label_buffer.as<int32_t>(), 1.0f);
  }
  auto get = [&](const float* p, int64_t count) {
    std::vector<float> host(count);
    f32_->CopyToHost(host.data(), p, count * 4);
    return host;
  };
  EXPECT_LT(Relative(get((*bf16)->probabilities(), n * 5),
                     get((*f32)->probabilities(), n * 5)),
            2e-2);
  // Batch normalisation of four samples magnifies rounding in backward:
  // bf16 without any of this moves these gradients by up to 13 % here, so
  // the bound is loose; a tensor read in the wrong type is off by far more.
  // The biases of convs followed by batch norm have no gradient (the norm
  // takes out the mean) and are left out.
  const std::vector<float> g = get((*bf16)->grads(), (*bf16)->num_params());
  const std::vector<float> ref = get((*f32)->grads(), (*f32)->num_params());
  for (const ParamInfo& p : (*bf16)->params_info()) {
    const bool before_norm = p.name == "c1.bias" || p.name == "c2.bias" ||
                             p.name == "c3.bias" || p.name == "c5.bias";
    if (before_norm) continue;
    const std::vector<float> a(g.begin() + p.offset,
                               g.begin() + p.offset + p.count);
    const std::vector<float> b(ref.begin() + p.offset,
                               ref.begin() + p.offset + p.count);
    EXPECT_LT(Relative(a, b), 0.25) << p.name;
  }
  EXPECT_LT(Relative(get((*bf16)->state(), (*bf16)->state_size()),
                     get((*f32)->state(), (*f32)->state_size())),
            1e-2);
  // Inference, with the running statistics.
  (*bf16)->Forward(n, images.data(), /*training=*/false);
  (*f32)->Forward(n, images.data(), /*training=*/false);
  EXPECT_LT(Relative(get((*bf16)->probabilities(), n * 5),
                     get((*f32)->probabilities(), n * 5)),
            2e-2);
}

// An add's bf16 input and gradient (Backend::AddBf16, GradientToBf16), by
// hand: bf16 is a float's upper 16 bits, rounded to nearest even.
TEST_F(Bf16Kernels, AddsAndGradientsInBf16ByHand) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>(u >> 16);
  };
  const std::vector<float> a = {1, -2, 0.5f};
  const std::vector<uint16_t> b16 = {bits(0.25f), bits(1), bits(-1)};
  DeviceArray a_(bf16_.get(), a), out(bf16_.get(), 3);
  Buffer b_ = *bf16_->Allocate(3 * 2);
  bf16_->CopyToDevice(b_.as<void>(), b16.data(), 3 * 2);
  bf16_->AddBf16(/*relu=*/false, 3, a_.data(), b_.as<void>(), out.data());
  EXPECT_EQ(out.Get(), (std::vector<float>{1.25f, -1, -0.5f}));
  bf16_->AddBf16(/*relu=*/true, 3, a_.data(), b_.as<void>(), out.data());
  EXPECT_EQ(out.Get(), (std::vector<float>{1.25f, 0, 0}));

  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to 1 (even); 1 + 3 * 2^-8
  // halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
  const std::vector<float> g = {1.00390625f, 1.01171875f, -3};
  const std::vector<float> y = {2, 0.5f, 0};
  DeviceArray g_(bf16_.get(), g), y_(bf16_.get(), y);
  Buffer o = *bf16_->Allocate(3 * 2);
  std::vector<uint16_t> got(3);
  bf16_->GradientToBf16(3, nullptr, g_.data(), o.as<void>());
  bf16_->CopyToHost(got.data(), o.as<void>(), 3 * 2);
  EXPECT_EQ(got, (std::vector<uint16_t>{bits(1), bits(1.015625f), bits(-3)}));
  // Masked where y is not positive: relu's gradient from its output.
  bf16_->GradientToBf16(3, y_.data(), g_.data(), o.as<void>());
  bf16_->CopyToHost(got.data(), o.as<void>(), 3 * 2);
  EXPECT_EQ(got, (std::vector<uint16_t>{bits(1), bits(1.015625f), 0x8000}));
}

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
