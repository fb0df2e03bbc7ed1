// Helpers of the trainer's layer and network tests: device arrays filled
// from the host, random data, a finite-difference gradient check, and
// LeNet.
#ifndef DLBATCH_TESTS_TRAINER_TEST_UTIL_H_
#define DLBATCH_TESTS_TRAINER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlbatch/v1/job.pb.h"
#include "gtest/gtest.h"
#include "trainer/backend.h"
#include "trainer/layers.h"
#include "trainer/rng.h"

namespace dlbatch::trainer::testing {

// A float array on a backend, mirrored by hand to and from the host.
class DeviceArray {
 public:
  DeviceArray(Backend* backend, int64_t count)
      : backend_(backend),
        count_(count),
        buffer_(*backend->Allocate(std::max<int64_t>(count, 1) * 4)) {}
  DeviceArray(Backend* backend, const std::vector<float>& host)
      : DeviceArray(backend, static_cast<int64_t>(host.size())) {
    Set(host);
  }

  float* data() const { return buffer_.f32(); }
  int64_t count() const { return count_; }
  void Set(const std::vector<float>& host) {
    backend_->CopyToDevice(data(), host.data(), host.size() * 4);
  }
  std::vector<float> Get() const {
    std::vector<float> host(count_);
    backend_->CopyToHost(host.data(), data(), count_ * 4);
    return host;
  }

 private:
  Backend* backend_;
  int64_t count_;
  Buffer buffer_;
};

inline std::vector<float> RandomVector(int64_t count, uint64_t seed,
                                       double lo = -1, double hi = 1) {
  Rng rng(Key(seed, 12345));
  std::vector<float> v(count);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * rng.Uniform());
  return v;
}

// ‖a − b‖ / ‖b‖.
inline double RelativeError(const std::vector<float>& a,
                            const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ‖got − ref‖ / ‖ref‖, summed in double.
inline double RelativeError(const std::vector<float>& got,
                            const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double{got[i]} - ref[i];
    num += d * d;
    den += double{ref[i]} * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline double Dot(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double{y[i]} * r[i];
  return s;
}

// Checks `analytic`, the gradient of loss() with respect to `values`, by
// central differences at `samples` random elements. loss() reads `values`
// (the caller uploads them inside it).
inline void CheckGradient(const char* what, std::vector<float>& values,
                          const std::vector<float>& analytic,
                          const std::function<double()>& loss, float eps,
                          double tolerance, int samples = 24,
                          uint64_t seed = 7) {
  ASSERT_EQ(values.size(), analytic.size()) << what;
  Rng rng(Key(seed, values.size()));
  for (int s = 0; s < samples; ++s) {
    const size_t i = rng.Below(values.size());
    const float saved = values[i];
    values[i] = saved + eps;
    const double plus = loss();
    values[i] = saved - eps;
    const double minus = loss();
    values[i] = saved;
    const double numeric = (plus - minus) / (2.0 * eps);
    EXPECT_NEAR(analytic[i], numeric, tolerance * (1 + std::fabs(numeric)))
        << what << " element " << i;
  }
  loss();  // leaves the unperturbed values uploaded
}

// Caffe's LeNet for 28x28x1 images and 10 classes.
inline v1::NetworkSpec LeNetSpec() {
  v1::NetworkSpec spec;
  for (int d : {28, 28, 1}) spec.add_input(d);
  auto add = [&](const std::string& type, int filters, int size, int units) {
    v1::LayerSpec* l = spec.add_layers();
    l->set_type(type);
    if (filters) l->set_filters(filters);
    if (size) l->set_size(size);
    if (units) l->set_units(units);
  };
  add("conv", 20, 5, 0);
  add("maxpool", 0, 2, 0);
  add("conv", 50, 5, 0);
  add("maxpool", 0, 2, 0);
  add("fc", 0, 0, 500);
  add("relu", 0, 0, 0);
  add("fc", 0, 0, 10);
  add("softmax", 0, 0, 0);
  return spec;
}

// A fixture holding a one-thread CPU backend: a busy CI machine stalls a
// team of threads at every barrier; threaded paths have tests of their own.
class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = MakeCpuBackend(1);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }
  std::unique_ptr<Backend> backend_;
};

// `same` padding of a k x k window moved by `stride` over `in`: the pads
// (the extra row and column at the bottom and right, so often asymmetric)
// and the output's height and width.
inline void ResolveSame(const Shape& in, int k, int stride, Padding* pad,
                        Shape* out) {
  SamePadding(in.h, k, stride, &pad->top, &pad->bottom, &out->h);
  SamePadding(in.w, k, stride, &pad->left, &pad->right, &out->w);
}

// A k x k convolution of `filters` moved by `stride` with `pad` on every
// side.
inline ConvDesc Conv(Shape in, int filters, int k, int stride, int pad) {
  ConvDesc d;
  d.in = in;
  d.filters = filters;
  d.kh = d.kw = k;
  d.stride_h = d.stride_w = stride;
  d.pad = Padding{pad, pad, pad, pad};
  d.out = Shape{(in.h + 2 * pad - k) / stride + 1,
                (in.w + 2 * pad - k) / stride + 1, filters};
  return d;
}

// A k x k convolution of `filters` with `same` padding.
inline ConvDesc SameConv(Shape in, int filters, int k, int stride) {
  ConvDesc d = Conv(in, filters, k, stride, 0);
  ResolveSame(in, k, stride, &d.pad, &d.out);
  return d;
}

// A k x k pooling with `same` padding.
inline PoolDesc SamePool(PoolKind kind, Shape in, int k, int stride) {
  PoolDesc d;
  d.kind = kind;
  d.in = in;
  d.kh = d.kw = k;
  d.stride_h = d.stride_w = stride;
  d.out.c = in.c;
  ResolveSame(in, k, stride, &d.pad, &d.out);
  return d;
}

// "top,left,bottom,right".
inline std::string PadString(const Padding& p) {
  return std::to_string(p.top) + "," + std::to_string(p.left) + "," +
         std::to_string(p.bottom) + "," + std::to_string(p.right);
}

}  // namespace dlbatch::trainer::testing

#endif  // DLBATCH_TESTS_TRAINER_TEST_UTIL_H_
