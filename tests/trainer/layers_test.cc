// The CPU backend's kernels against plain-loop references (forward) and
// finite differences (backward), the element-wise functions and the solvers
// against their formulas.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using testing::CheckGradient;
using testing::DeviceArray;
using testing::Dot;
using testing::RandomVector;
using testing::RelativeError;

// TwoThreadsAgreeWithOne covers the threaded paths.
using LayersTest = testing::CpuBackendTest;

// --- references ---

int64_t At(const Shape& s, int n, int h, int w, int c) {
  return ((int64_t{n} * s.h + h) * s.w + w) * s.c + c;
}

std::vector<double> ConvReference(const ConvDesc& d, int n,
                                  const std::vector<float>& x,
                                  const std::vector<float>& w,
                                  const std::vector<float>& b) {
  std::vector<double> y(n * d.out.size());
  for (int s = 0; s < n; ++s) {
    for (int oh = 0; oh < d.out.h; ++oh) {
      for (int ow = 0; ow < d.out.w; ++ow) {
        for (int f = 0; f < d.filters; ++f) {
          double sum = b[f];
          for (int i = 0; i < d.kh; ++i) {
            const int ih = oh * d.stride_h - d.pad.top + i;
            if (ih < 0 || ih >= d.in.h) continue;
            for (int j = 0; j < d.kw; ++j) {
              const int iw = ow * d.stride_w - d.pad.left + j;
              if (iw < 0 || iw >= d.in.w) continue;
              for (int c = 0; c < d.in.c; ++c) {
                sum += double{x[At(d.in, s, ih, iw, c)]} *
                       w[((int64_t{f} * d.kh + i) * d.kw + j) * d.in.c + c];
              }
            }
          }
          y[At(d.out, s, oh, ow, f)] = sum;
        }
      }
    }
  }
  return y;
}

std::vector<double> PoolReference(const PoolDesc& d, int n,
                                  const std::vector<float>& x) {
  std::vector<double> y(n * d.out.size());
  for (int s = 0; s < n; ++s) {
    for (int oh = 0; oh < d.out.h; ++oh) {
      for (int ow = 0; ow < d.out.w; ++ow) {
        for (int c = 0; c < d.in.c; ++c) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          int count = 0;
          for (int i = 0; i < d.kh; ++i) {
            const int ih = oh * d.stride_h - d.pad.top + i;
            if (ih < 0 || ih >= d.in.h) continue;
            for (int j = 0; j < d.kw; ++j) {
              const int iw = ow * d.stride_w - d.pad.left + j;
              if (iw < 0 || iw >= d.in.w) continue;
              const double v = x[At(d.in, s, ih, iw, c)];
              best = std::max(best, v);
              sum += v;
              ++count;
            }
          }
          y[At(d.out, s, oh, ow, c)] =
              d.kind == PoolKind::kMax ? best : sum / count;
        }
      }
    }
  }
  return y;
}

// Per-channel biased mean and variance over (n, h, w).
void ChannelStats(const Shape& in, int n, const std::vector<float>& x,
                  std::vector<double>* mean, std::vector<double>* var) {
  mean->assign(in.c, 0);
  var->assign(in.c, 0);
  const int64_t m = n * int64_t{in.h} * in.w;
  for (int64_t i = 0; i < m; ++i) {
    for (int c = 0; c < in.c; ++c) (*mean)[c] += x[i * in.c + c];
  }
  for (double& v : *mean) v /= m;
  for (int64_t i = 0; i < m; ++i) {
    for (int c = 0; c < in.c; ++c) {
      const double d = x[i * in.c + c] - (*mean)[c];
      (*var)[c] += d * d;
    }
  }
  for (double& v : *var) v /= m;
}

// --- convolution ---

struct ConvCase {
  Shape in;
  int filters, kh, kw, stride;
  Padding pad;
};

ConvDesc MakeConvDesc(const ConvCase& c) {
  ConvDesc d;
  d.in = c.in;
  d.filters = c.filters;
  d.kh = c.kh;
  d.kw = c.kw;
  d.stride_h = d.stride_w = c.stride;
  d.pad = c.pad;
  d.out.h = (c.in.h + c.pad.top + c.pad.bottom - c.kh) / c.stride + 1;
  d.out.w = (c.in.w + c.pad.left + c.pad.right - c.kw) / c.stride + 1;
  d.out.c = c.filters;
  return d;
}

class ConvTest : public LayersTest,
                 public ::testing::WithParamInterface<ConvCase> {};

TEST_P(ConvTest, ForwardMatchesReferenceAndBackwardMatchesDifferences) {
  const ConvDesc d = MakeConvDesc(GetParam());
  const int max_batch = 4, n = 3;  // n < max_batch on purpose
  auto kernel = backend_->MakeConv(d, max_batch);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  ConvKernel& conv = **kernel;

  std::vector<float> x = RandomVector(n * d.in.size(), 1);
  std::vector<float> w = RandomVector(d.filters * d.kh * d.kw * d.in.c, 2);
  std::vector<float> b = RandomVector(d.filters, 3);
  const std::vector<float> r = RandomVector(n * d.out.size(), 4);
  DeviceArray dx_(backend_.get(), x), dw_(backend_.get(), w),
      db_(backend_.get(), b), dy_(backend_.get(), n * d.out.size());

  conv.Forward(n, dx_.data(), dw_.data(), db_.data(), dy_.data());
  EXPECT_LT(RelativeError(dy_.Get(), ConvReference(d, n, x, w, b)), 1e-5);

  DeviceArray r_(backend_.get(), r), gx(backend_.get(), x.size()),
      gw(backend_.get(), w.size()), gb(backend_.get(), b.size());
  conv.BackwardData(n, r_.data(), dw_.data(), gx.data());
  conv.BackwardWeights(n, dx_.data(), r_.data(), gw.data(), gb.data());
  auto loss = [&] {
    dx_.Set(x);
    dw_.Set(w);
    db_.Set(b);
    conv.Forward(n, dx_.data(), dw_.data(), db_.data(), dy_.data());
    return Dot(dy_.Get(), r);
  };
  CheckGradient("dx", x, gx.Get(), loss, 1e-2f, 2e-3);
  CheckGradient("dw", w, gw.Get(), loss, 1e-2f, 2e-3);
  CheckGradient("db", b, gb.Get(), loss, 1e-2f, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvTest,
    ::testing::Values(
        // LeNet's first layer, smaller.
        ConvCase{{12, 12, 1}, 4, 5, 5, 1, {}},
        ConvCase{{7, 6, 3}, 5, 3, 3, 1, {1, 1, 1, 1}},
        // `same` with stride 2 on an even size: the extra row at the bottom.
        ConvCase{{8, 7, 3}, 4, 3, 3, 2, {0, 1, 1, 1}},
        // `same` with an even window: asymmetric in both dimensions.
        ConvCase{{6, 5, 2}, 3, 4, 4, 1, {1, 1, 2, 2}}),
    [](const ::testing::TestParamInfo<ConvCase>& info) {
      const ConvCase& c = info.param;
      return absl::StrCat("in", c.in.h, "x", c.in.w, "x", c.in.c, "_k", c.kh,
                          "_s", c.stride, "_pad", c.pad.top, c.pad.left,
                          c.pad.bottom, c.pad.right);
    });

// Where the filters are not a multiple of 16, backward weights may take dy
// in oneDNN's blocked layout (reordered from NHWC on each call) when that
// is faster. Either layout computes the same gradients, and a choice kept
// in the tuning (1000 + i: the blocked layout's i-th implementation) is
// taken as it is; one that oneDNN no longer lists is timed again.
TEST(CpuConvLayouts, BackwardWeightsAgreesInEitherLayoutAndKeepsItsChoice) {
  const ConvDesc d = MakeConvDesc({{12, 12, 1}, 20, 5, 5, 1, {}});
  const int n = 4;
  const std::string key =
      "convolution [12, 12, 1] -> [8, 8, 20] (5x5, stride 1x1) backward "
      "weights, n 4";
  const std::vector<float> x = RandomVector(n * d.in.size(), 1);
  const std::vector<float> dy = RandomVector(n * d.out.size(), 2);
  const std::vector<float> w = RandomVector(20 * 25, 3);
  // dW[f][i][j] = sum over samples and outputs of dy * x under the window.
  std::vector<double> dw_ref(20 * 25, 0.0), db_ref(20, 0.0);
  for (int s = 0; s < n; ++s) {
    for (int oh = 0; oh < 8; ++oh) {
      for (int ow = 0; ow < 8; ++ow) {
        for (int f = 0; f < 20; ++f) {
          const double g = dy[At(d.out, s, oh, ow, f)];
          db_ref[f] += g;
          for (int i = 0; i < 5; ++i) {
            for (int j = 0; j < 5; ++j) {
              dw_ref[(f * 5 + i) * 5 + j] +=
                  g * x[At(d.in, s, oh + i, ow + j, 0)];
            }
          }
        }
      }
    }
  }
  for (const int choice : {0, 1000, 1999, 7000}) {
    SCOPED_TRACE(absl::StrCat("choice ", choice));
    auto backend = MakeCpuBackend(1);
    ASSERT_TRUE(backend.ok()) << backend.status();
    Backend* be = backend->get();
    be->LoadTuning(absl::StrCat(choice, "\t", key, "\n"));
    auto kernel = be->MakeConv(d, n);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    const std::string tuning = be->SaveTuning();
    const bool listed = choice == 0 || choice == 1000;  // not 1999, 7000
    EXPECT_EQ(tuning.find(absl::StrCat(choice, "\t", key)) != std::string::npos,
              listed)
        << tuning;
    DeviceArray xa(be, x), dya(be, dy), wa(be, w), dxa(be, x.size()),
        dwa(be, w.size()), dba(be, 20);
    (*kernel)->BackwardWeights(n, xa.data(), dya.data(), dwa.data(),
                               dba.data());
    (*kernel)->BackwardData(n, dya.data(), wa.data(), dxa.data());
    EXPECT_LT(RelativeError(dwa.Get(), dw_ref), 1e-5);
    EXPECT_LT(RelativeError(dba.Get(), db_ref), 1e-5);
  }
}

// --- fully connected ---

// The forward runs as oneDNN's inner product or, in float32, as its matmul
// over the transposed weights, whichever autotuning timed faster (kept in
// the tuning as 0 or 1): both are checked here, each chosen by a tuning.
class FcTest : public ::testing::TestWithParam<int> {};

TEST_P(FcTest, ForwardMatchesReferenceAndBackwardMatchesDifferences) {
  FcDesc d{/*in=*/37, /*units=*/11};
  const int n = 5;
  auto backend = MakeCpuBackend(1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  Backend* be = backend->get();
  std::string tuning;
  for (int batch : {5, 8}) {
    absl::StrAppend(&tuning, GetParam(), "\tinner product 37 -> 11 forward, n ",
                    batch, "\n");
  }
  be->LoadTuning(tuning);
  auto kernel = be->MakeFc(d, 8);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  FcKernel& fc = **kernel;
  std::vector<float> x = RandomVector(n * d.in, 1);
  std::vector<float> w = RandomVector(d.units * d.in, 2);
  std::vector<float> b = RandomVector(d.units, 3);
  const std::vector<float> r = RandomVector(n * d.units, 4);
  DeviceArray dx_(be, x), dw_(be, w), db_(be, b), dy_(be, n * d.units);
  fc.Forward(n, dx_.data(), dw_.data(), db_.data(), dy_.data());
  EXPECT_EQ(be->SaveTuning(), tuning);  // taken as given, not timed again
  std::vector<double> ref(n * d.units);
  for (int s = 0; s < n; ++s) {
    for (int u = 0; u < d.units; ++u) {
      double sum = b[u];
      for (int i = 0; i < d.in; ++i)
        sum += double{x[s * d.in + i]} * w[u * d.in + i];
      ref[s * d.units + u] = sum;
    }
  }
  EXPECT_LT(RelativeError(dy_.Get(), ref), 1e-5);

  DeviceArray r_(be, r), gx(be, x.size()), gw(be, w.size()), gb(be, b.size());
  fc.BackwardData(n, r_.data(), dw_.data(), gx.data());
  fc.BackwardWeights(n, dx_.data(), r_.data(), gw.data(), gb.data());
  auto loss = [&] {
    dx_.Set(x);
    dw_.Set(w);
    db_.Set(b);
    fc.Forward(n, dx_.data(), dw_.data(), db_.data(), dy_.data());
    return Dot(dy_.Get(), r);
  };
  CheckGradient("dx", x, gx.Get(), loss, 1e-2f, 2e-3);
  CheckGradient("dw", w, gw.Get(), loss, 1e-2f, 2e-3);
  CheckGradient("db", b, gb.Get(), loss, 1e-2f, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Forwards, FcTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? "InnerProduct" : "Matmul";
                         });

// --- pooling ---

struct PoolCase {
  PoolKind kind;
  Shape in;
  int k, stride;
  Padding pad;
};

class PoolTest : public LayersTest,
                 public ::testing::WithParamInterface<PoolCase> {};

TEST_P(PoolTest, ForwardMatchesReferenceAndBackwardMatchesDifferences) {
  const PoolCase& c = GetParam();
  PoolDesc d;
  d.kind = c.kind;
  d.in = c.in;
  d.kh = c.k > 0 ? c.k : c.in.h;  // 0: global
  d.kw = c.k > 0 ? c.k : c.in.w;
  d.stride_h = d.stride_w = c.stride;
  d.pad = c.pad;
  d.out =
      Shape{(c.in.h + c.pad.top + c.pad.bottom - d.kh) / c.stride + 1,
            (c.in.w + c.pad.left + c.pad.right - d.kw) / c.stride + 1, c.in.c};
  const int n = 3;
  auto kernel = backend_->MakePool(d, 4);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  PoolKernel& pool = **kernel;
  const size_t ws_bytes = pool.WorkspaceBytes(4);
  EXPECT_EQ(ws_bytes > 0, c.kind == PoolKind::kMax);
  auto ws = backend_->Allocate(ws_bytes);
  ASSERT_TRUE(ws.ok());

  std::vector<float> x = RandomVector(n * d.in.size(), 1);
  const std::vector<float> r = RandomVector(n * d.out.size(), 4);
  DeviceArray dx_(backend_.get(), x), dy_(backend_.get(), n * d.out.size());
  pool.Forward(n, dx_.data(), dy_.data(), ws->as<void>());
  const std::vector<double> ref = PoolReference(d, n, x);
  EXPECT_LT(RelativeError(dy_.Get(), ref), 1e-6);
  // Inference (no workspace) gives the same.
  DeviceArray y2(backend_.get(), n * d.out.size());
  pool.Forward(n, dx_.data(), y2.data(), nullptr);
  EXPECT_EQ(y2.Get(), dy_.Get());

  DeviceArray r_(backend_.get(), r), gx(backend_.get(), x.size());
  pool.Backward(n, dx_.data(), dy_.data(), r_.data(), ws->as<void>(),
                gx.data());
  const std::vector<float> analytic = gx.Get();
  auto loss = [&] {
    dx_.Set(x);
    pool.Forward(n, dx_.data(), dy_.data(), ws->as<void>());
    return Dot(dy_.Get(), r);
  };
  // A small step, so that no window's maximum changes hands.
  CheckGradient("dx", x, analytic, loss, 1e-3f, 5e-3, 40);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PoolTest,
    ::testing::Values(PoolCase{PoolKind::kMax, {8, 8, 5}, 2, 2, {}},
                      PoolCase{PoolKind::kMax, {7, 7, 3}, 3, 2, {0, 0, 1, 1}},
                      PoolCase{PoolKind::kAverage, {6, 6, 4}, 2, 2, {}},
                      // Padding excluded from the average.
                      PoolCase{
                          PoolKind::kAverage, {5, 5, 2}, 3, 2, {1, 1, 1, 1}},
                      // Global average pooling: the whole input.
                      PoolCase{PoolKind::kAverage, {4, 3, 6}, 0, 1, {}}),
    [](const ::testing::TestParamInfo<PoolCase>& info) {
      const PoolCase& c = info.param;
      return absl::StrCat(c.kind == PoolKind::kMax ? "max" : "avg", "_in",
                          c.in.h, "x", c.in.w, "x", c.in.c, "_k", c.k, "_s",
                          c.stride, "_pad", c.pad.top, c.pad.left, c.pad.bottom,
                          c.pad.right);
    });

// --- batch normalisation ---

TEST_F(LayersTest, BatchNormTrainingInferenceAndBackward) {
  BatchNormDesc d{{4, 3, 5}, 1e-5f};
  const int n = 6;
  auto kernel = backend_->MakeBatchNorm(d, 8);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  BatchNormKernel& bn = **kernel;
  const int c = d.in.c;
  std::vector<float> x = RandomVector(n * d.in.size(), 1, -1, 3);
  std::vector<float> gamma = RandomVector(c, 2, 0.5, 1.5);
  std::vector<float> beta = RandomVector(c, 3);
  const std::vector<float> r = RandomVector(n * d.in.size(), 4);
  DeviceArray x_(backend_.get(), x), g_(backend_.get(), gamma),
      b_(backend_.get(), beta), y_(backend_.get(), x.size()),
      mean_(backend_.get(), c), var_(backend_.get(), c),
      rmean(backend_.get(), std::vector<float>(c, 0.5f)),
      rvar(backend_.get(), std::vector<float>(c, 2.0f));

  bn.ForwardTraining(n, x_.data(), g_.data(), b_.data(), y_.data(),
                     mean_.data(), var_.data(), rmean.data(), rvar.data(),
                     0.1f);
  std::vector<double> mean, var;
  ChannelStats(d.in, n, x, &mean, &var);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int k = i % c;
    ref[i] = gamma[k] * (x[i] - mean[k]) / std::sqrt(var[k] + 1e-5) + beta[k];
  }
  EXPECT_LT(RelativeError(y_.Get(), ref), 1e-5);
  const std::vector<float> saved_mean = mean_.Get(), saved_var = var_.Get();
  const std::vector<float> running_mean = rmean.Get(), running_var = rvar.Get();
  for (int k = 0; k < c; ++k) {
    EXPECT_NEAR(saved_mean[k], mean[k], 1e-5);
    EXPECT_NEAR(saved_var[k], var[k], 1e-5);  // biased
    EXPECT_NEAR(running_mean[k], 0.9 * 0.5 + 0.1 * mean[k], 1e-5);
    EXPECT_NEAR(running_var[k], 0.9 * 2.0 + 0.1 * var[k], 1e-5);
  }

  bn.ForwardInference(n, x_.data(), g_.data(), b_.data(), rmean.data(),
                      rvar.data(), y_.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const int k = i % c;
    ref[i] =
        gamma[k] * (x[i] - running_mean[k]) / std::sqrt(running_var[k] + 1e-5) +
        beta[k];
  }
  EXPECT_LT(RelativeError(y_.Get(), ref), 1e-5);

  DeviceArray r_(backend_.get(), r), gx(backend_.get(), x.size()),
      gg(backend_.get(), c), gb(backend_.get(), c);
  bn.ForwardTraining(n, x_.data(), g_.data(), b_.data(), y_.data(),
                     mean_.data(), var_.data(), rmean.data(), rvar.data(),
                     0.1f);
  bn.Backward(n, x_.data(), r_.data(), g_.data(), mean_.data(), var_.data(),
              gx.data(), gg.data(), gb.data());
  auto loss = [&] {
    x_.Set(x);
    g_.Set(gamma);
    b_.Set(beta);
    bn.ForwardTraining(n, x_.data(), g_.data(), b_.data(), y_.data(),
                       mean_.data(), var_.data(), rmean.data(), rvar.data(),
                       0.1f);
    return Dot(y_.Get(), r);
  };
  CheckGradient("dx", x, gx.Get(), loss, 1e-2f, 1e-2);
  CheckGradient("dgamma", gamma, gg.Get(), loss, 1e-2f, 1e-2);
  CheckGradient("dbeta", beta, gb.Get(), loss, 1e-2f, 1e-2);
}

// --- element-wise ---

TEST_F(LayersTest, ReluAndLeakyReluForwardAndBackward) {
  for (float alpha : {0.0f, 0.01f, 0.3f}) {
    const int64_t count = 70000;  // above the parallel threshold
    std::vector<float> x = RandomVector(count, 5);
    const std::vector<float> dy = RandomVector(count, 6);
    DeviceArray x_(backend_.get(), x), y_(backend_.get(), count),
        dy_(backend_.get(), dy), dx_(backend_.get(), count);
    backend_->ActivationForward({alpha}, count, x_.data(), y_.data());
    backend_->ActivationBackward({alpha}, count, x_.data(), dy_.data(),
                                 dx_.data());
    const std::vector<float> y = y_.Get(), dx = dx_.Get();
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(y[i], x[i] > 0 ? x[i] : alpha * x[i]) << i;
      ASSERT_EQ(dx[i], x[i] > 0 ? dy[i] : alpha * dy[i]) << i;
    }
  }
}

TEST_F(LayersTest, DropoutDrawsItsMaskFromTheCounter) {
  const int64_t count = 100000;
  const float p = 0.3f;
  // The layer's draws come from Key(the step's key, its salt).
  const uint64_t seed = Key(42, 3);
  std::vector<float> x = RandomVector(count, 7);
  DeviceArray x_(backend_.get(), x), mask_(backend_.get(), count),
      y_(backend_.get(), count);
  backend_->SetDropoutKey(42);
  backend_->DropoutForward(p, 3, count, x_.data(), mask_.data(), y_.data());
  const std::vector<float> mask = mask_.Get(), y = y_.Get();
  int64_t dropped = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float want = UniformAt(seed, i) >= p ? 1 / (1 - p) : 0;
    ASSERT_EQ(mask[i], want) << i;
    ASSERT_EQ(y[i], x[i] * mask[i]) << i;
    dropped += mask[i] == 0;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / count, p, 0.01);

  DeviceArray dy_(backend_.get(), x), dx_(backend_.get(), count);
  backend_->Multiply(count, dy_.data(), mask_.data(), dx_.data());
  EXPECT_EQ(dx_.Get(), y);

  // Another key, another mask; the key holds until the next one.
  backend_->SetDropoutKey(43);
  backend_->DropoutForward(p, 3, count, x_.data(), mask_.data(), y_.data());
  const std::vector<float> other = mask_.Get();
  EXPECT_NE(other, mask);
  backend_->DropoutForward(p, 3, count, x_.data(), mask_.data(), y_.data());
  EXPECT_EQ(mask_.Get(), other);
}

// The CPU runs calls as they come: there is nothing to record (a training
// run asked to record its steps there runs them as issued).
TEST_F(LayersTest, TheCpuBackendDoesNotRecord) {
  EXPECT_FALSE(backend_->can_record());
  const absl::Status s = backend_->StartRecording();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_FALSE(backend_->FinishRecording().ok());
}

TEST_F(LayersTest, SoftmaxCrossEntropyStatsAndGradient) {
  const int n = 5, k = 4;
  std::vector<float> logits = RandomVector(n * k, 8, -3, 3);
  // Row 4 ties between classes 1 and 2: the first counts as the argmax.
  logits[4 * k + 0] = 0;
  logits[4 * k + 1] = 2;
  logits[4 * k + 2] = 2;
  logits[4 * k + 3] = -1;
  const std::vector<int32_t> labels = {0, 3, 2, 1, 2};
  DeviceArray logits_(backend_.get(), logits), probs_(backend_.get(), n * k),
      stats_(backend_.get(), std::vector<float>{1.5f, 2.0f});
  auto labels_buf = backend_->Allocate(n * sizeof(int32_t));
  ASSERT_TRUE(labels_buf.ok());
  backend_->CopyToDevice(labels_buf->as<void>(), labels.data(),
                         n * sizeof(int32_t));
  const int32_t* labels_ = labels_buf->as<int32_t>();
  backend_->SoftmaxCrossEntropy(n, k, logits_.data(), labels_, 0, probs_.data(),
                                stats_.data());
  double loss = 0;
  int correct = 0;
  std::vector<double> probs(n * k);
  for (int r = 0; r < n; ++r) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += std::exp(double{logits[r * k + j]});
    for (int j = 0; j < k; ++j) {
      probs[r * k + j] = std::exp(double{logits[r * k + j]}) / sum;
    }
    loss += -std::log(probs[r * k + labels[r]]);
    const int argmax = static_cast<int>(
        std::max_element(logits.begin() + r * k, logits.begin() + r * k + k) -
        (logits.begin() + r * k));
    correct += argmax == labels[r];
  }
  EXPECT_LT(RelativeError(probs_.Get(), probs), 1e-6);
  const std::vector<float> stats = stats_.Get();
  EXPECT_NEAR(stats[0], 1.5 + loss, 1e-5);  // added to, not overwritten
  EXPECT_EQ(stats[1], 2.0f + correct);

  DeviceArray dlogits(backend_.get(), n * k);
  backend_->SoftmaxCrossEntropyBackward(n, k, probs_.data(), labels_, 0, 0.25f,
                                        dlogits.data());
  const std::vector<float> g = dlogits.Get();
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < k; ++j) {
      EXPECT_NEAR(g[r * k + j],
                  0.25 * (probs[r * k + j] - (j == labels[r] ? 1 : 0)), 1e-6);
    }
  }
}

// --- solvers ---

struct SolverData {
  explicit SolverData(int64_t count)
      : p(RandomVector(count, 11)),
        g(RandomVector(count, 12)),
        s1(RandomVector(count, 13, 0, 1)),
        s2(RandomVector(count, 14, 0, 1)) {}
  std::vector<float> p, g, s1, s2;
};

TEST_F(LayersTest, SolversFollowTheirFormulas) {
  const int64_t count = 50000, decayed = 30001;
  const float lr = 0.01f, l2 = 0.001f;
  const SolverData d(count);
  auto grad = [&](int64_t i) {
    return i < decayed ? d.g[i] + l2 * d.p[i] : d.g[i];
  };
  {  // sgdm
    DeviceArray p(backend_.get(), d.p), g(backend_.get(), d.g),
        v(backend_.get(), d.s1);
    backend_->SgdmUpdate(count, decayed, lr, 0.9f, l2, p.data(), g.data(),
                         v.data());
    const std::vector<float> pp = p.Get(), vv = v.Get();
    for (int64_t i = 0; i < count; ++i) {
      const double want_v = 0.9 * d.s1[i] - lr * grad(i);
      ASSERT_NEAR(vv[i], want_v, 1e-6) << i;
      ASSERT_NEAR(pp[i], d.p[i] + want_v, 1e-6) << i;
    }
  }
  {  // adam at t = 3
    DeviceArray p(backend_.get(), d.p), g(backend_.get(), d.g),
        m(backend_.get(), d.s1), v(backend_.get(), d.s2);
    backend_->AdamUpdate(count, decayed, lr, 0.9f, 0.999f, 1e-8f, 3, l2,
                         p.data(), g.data(), m.data(), v.data());
    const std::vector<float> pp = p.Get(), mm = m.Get(), vv = v.Get();
    for (int64_t i = 0; i < count; ++i) {
      const double gi = grad(i);
      const double want_m = 0.9 * d.s1[i] + 0.1 * gi;
      const double want_v = 0.999 * d.s2[i] + 0.001 * gi * gi;
      const double mhat = want_m / (1 - std::pow(0.9, 3));
      const double vhat = want_v / (1 - std::pow(0.999, 3));
      ASSERT_NEAR(mm[i], want_m, 1e-6) << i;
      ASSERT_NEAR(vv[i], want_v, 1e-6) << i;
      ASSERT_NEAR(pp[i], d.p[i] - lr * mhat / (std::sqrt(vhat) + 1e-8), 1e-5)
          << i;
    }
  }
  {  // rmsprop
    DeviceArray p(backend_.get(), d.p), g(backend_.get(), d.g),
        v(backend_.get(), d.s2);
    backend_->RmspropUpdate(count, decayed, lr, 0.99f, 1e-8f, l2, p.data(),
                            g.data(), v.data());
    const std::vector<float> pp = p.Get(), vv = v.Get();
    for (int64_t i = 0; i < count; ++i) {
      const double gi = grad(i);
      const double want_v = 0.99 * d.s2[i] + 0.01 * gi * gi;
      ASSERT_NEAR(vv[i], want_v, 1e-6) << i;
      ASSERT_NEAR(pp[i], d.p[i] - lr * gi / (std::sqrt(want_v) + 1e-8), 1e-5)
          << i;
    }
  }
}

TEST_F(LayersTest, SumSquaresScaleFillAndCopies) {
  const int64_t count = 123457;
  std::vector<float> x = RandomVector(count, 15);
  DeviceArray x_(backend_.get(), x);
  double want = 0;
  for (float v : x) want += double{v} * v;
  EXPECT_NEAR(backend_->SumSquares(count, x_.data()), want, 1e-9 * want);
  backend_->Scale(count, -2.0f, x_.data());
  EXPECT_EQ(x_.Get()[777], -2.0f * x[777]);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x_.Set(x);
  EXPECT_FALSE(std::isfinite(backend_->SumSquares(count, x_.data())));
  backend_->Fill(x_.data(), count, 0.5f);
  EXPECT_EQ(x_.Get(), std::vector<float>(count, 0.5f));
  DeviceArray y_(backend_.get(), count);
  backend_->CopyOnDevice(y_.data(), x_.data(), count * 4);
  backend_->Synchronize();
  EXPECT_EQ(y_.Get(), x_.Get());
  // Allocate zero-fills.
  auto buf = backend_->Allocate(1000);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->bytes(), 1000u);
  EXPECT_TRUE(std::all_of(buf->as<char>(), buf->as<char>() + 1000,
                          [](char c) { return c == 0; }));
  EXPECT_NE(backend_->Describe().find("oneDNN"), std::string::npos);
  EXPECT_FALSE(backend_->on_gpu());
}

// The threaded paths (oneDNN's and the loops' above their parallel
// threshold) compute what one thread does.
TEST_F(LayersTest, TwoThreadsAgreeWithOne) {
  auto two = MakeCpuBackend(2);
  ASSERT_TRUE(two.ok()) << two.status();
  ConvDesc d;
  d.in = Shape{12, 12, 20};
  d.filters = 50;
  d.kh = d.kw = 5;
  d.out = Shape{8, 8, 50};
  const int n = 16;
  const std::vector<float> x = RandomVector(n * d.in.size(), 1);
  const std::vector<float> w = RandomVector(50 * 25 * 20, 2);
  const std::vector<float> b = RandomVector(50, 3);
  std::vector<std::vector<float>> outputs;
  for (Backend* backend : {backend_.get(), two->get()}) {
    auto conv = backend->MakeConv(d, n);
    ASSERT_TRUE(conv.ok()) << conv.status();
    DeviceArray x_(backend, x), w_(backend, w), b_(backend, b),
        y_(backend, n * d.out.size()), gw(backend, w.size()),
        gb(backend, b.size());
    (*conv)->Forward(n, x_.data(), w_.data(), b_.data(), y_.data());
    (*conv)->BackwardWeights(n, x_.data(), y_.data(), gw.data(), gb.data());
    outputs.push_back(y_.Get());
    outputs.push_back(gw.Get());
    const int64_t count = 100000;
    DeviceArray p(backend, RandomVector(count, 4)),
        g(backend, RandomVector(count, 5)), v(backend, count);
    backend->SgdmUpdate(count, count / 2, 0.1f, 0.9f, 0.01f, p.data(), g.data(),
                        v.data());
    outputs.push_back(p.Get());
  }
  const std::vector<double> y1(outputs[0].begin(), outputs[0].end());
  const std::vector<double> gw1(outputs[1].begin(), outputs[1].end());
  EXPECT_LT(RelativeError(outputs[3], y1), 1e-5);
  EXPECT_LT(RelativeError(outputs[4], gw1), 1e-5);
  EXPECT_EQ(outputs[5], outputs[2]);
}

TEST_F(LayersTest, RejectsANegativeThreadCount) {
  EXPECT_FALSE(MakeCpuBackend(-1).ok());
}

}  // namespace
}  // namespace dlbatch::trainer
