// Synchronised batch normalisation on the CPU: our own per-channel loops
// over NHWC activations (oneDNN's primitive cannot take sums made
// elsewhere). Each pass splits the positions (n * h * w rows of c channels)
// across the OpenMP team; every thread sums its rows into its own double
// accumulators, which are then added in thread order, so a result depends
// only on the inputs and the team size, never on timing.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/cpu/backend_cpu_internal.h"

namespace dlbatch::trainer::cpu {
namespace {

// Below this many elements a pass runs on the calling thread alone.
constexpr int64_t kParallelMin = 1 << 15;

class CpuSyncBatchNorm final : public SyncBatchNormKernel {
 public:
  CpuSyncBatchNorm(const Context* ctx, const BatchNormDesc& desc)
      : ctx_(ctx),
        c_(desc.in.c),
        positions_(int64_t{desc.in.h} * desc.in.w),
        epsilon_(desc.epsilon),
        a_(c_),
        b_(c_),
        k_(c_) {}

  void ForwardSums(int n, const float* x, const float* shift,
                   float* sums) override {
    const int c = c_;
    SumRows(n, [&](int64_t r, double* s1, double* s2) {
      const float* xr = x + r * c;
#pragma omp simd
      for (int ch = 0; ch < c; ++ch) {
        const double d = xr[ch] - shift[ch];
        s1[ch] += d;
        s2[ch] += d * d;
      }
    });
    for (int ch = 0; ch < 2 * c; ++ch)
      sums[ch] = static_cast<float>(total_[ch]);
    sums[2 * c] = static_cast<float>(n);
  }

  void ForwardNormalize(int n, const float* x, const float* gamma,
                        const float* beta, const float* shift,
                        const float* sums, float* y, float* saved_mean,
                        float* saved_var, float* running_mean,
                        float* running_var, float momentum) override {
    const int c = c_;
    const double m = Positions(sums);
    for (int ch = 0; ch < c; ++ch) {
      const double d = sums[ch] / m;  // mean - shift
      const double var = std::max(sums[c + ch] / m - d * d, 0.0);
      const double mean = shift[ch] + d;
      const double scale = gamma[ch] / std::sqrt(var + epsilon_);
      a_[ch] = static_cast<float>(scale);
      saved_mean[ch] = static_cast<float>(mean);
      saved_var[ch] = static_cast<float>(var);
      // After the reads of shift[ch], which may be running_mean[ch].
      running_mean[ch] = (1 - momentum) * running_mean[ch] +
                         momentum * static_cast<float>(mean);
      running_var[ch] =
          (1 - momentum) * running_var[ch] + momentum * static_cast<float>(var);
    }
    // y = (x - mean) * gamma / sqrt(var + eps) + beta.
    const float* a = a_.data();
    const float* mean = saved_mean;
    MapRows(n, [&](int64_t r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
#pragma omp simd
      for (int ch = 0; ch < c; ++ch) {
        yr[ch] = (xr[ch] - mean[ch]) * a[ch] + beta[ch];
      }
    });
  }

  void BackwardSums(int n, const float* x, const float* dy,
                    const float* saved_mean, const float* saved_var,
                    float* dgamma, float* dbeta, float* sums) override {
    const int c = c_;
    SumRows(n, [&](int64_t r, double* s1, double* s2) {
      const float* xr = x + r * c;
      const float* dyr = dy + r * c;
#pragma omp simd
      for (int ch = 0; ch < c; ++ch) {
        const double g = dyr[ch];
        s1[ch] += g * (xr[ch] - saved_mean[ch]);
        s2[ch] += g;
      }
    });
    for (int ch = 0; ch < c; ++ch) {
      const double inv_std = 1.0 / std::sqrt(double{saved_var[ch]} + epsilon_);
      dgamma[ch] = sums[ch] = static_cast<float>(total_[ch] * inv_std);
      dbeta[ch] = sums[c + ch] = static_cast<float>(total_[c + ch]);
    }
    sums[2 * c] = static_cast<float>(n);
  }

  void BackwardData(int n, const float* x, const float* dy, const float* gamma,
                    const float* saved_mean, const float* saved_var,
                    const float* sums, float* dx) override {
    const int c = c_;
    const double m = Positions(sums);
    // dx = a * dy + k * (x - mean) + b with a = gamma * inv_std,
    // k = -a * inv_std * dgamma / m, b = -a * dbeta / m.
    for (int ch = 0; ch < c; ++ch) {
      const double inv_std = 1.0 / std::sqrt(double{saved_var[ch]} + epsilon_);
      const double a = gamma[ch] * inv_std;
      const double k = -a * inv_std * sums[ch] / m;
      a_[ch] = static_cast<float>(a);
      k_[ch] = static_cast<float>(k);
      b_[ch] = static_cast<float>(-a * sums[c + ch] / m);
    }
    const float* a = a_.data();
    const float* b = b_.data();
    const float* k = k_.data();
    MapRows(n, [&](int64_t r) {
      const float* xr = x + r * c;
      const float* dyr = dy + r * c;
      float* dxr = dx + r * c;
#pragma omp simd
      for (int ch = 0; ch < c; ++ch) {
        dxr[ch] = a[ch] * dyr[ch] + k[ch] * (xr[ch] - saved_mean[ch]) + b[ch];
      }
    });
  }

 private:
  // Positions per channel over all ranks, from the totalled sample count.
  double Positions(const float* sums) const {
    return double{sums[2 * c_]} * static_cast<double>(positions_);
  }

  bool Parallel(int n) const {
    return int64_t{n} * positions_ * c_ > kParallelMin && ctx_->threads > 1;
  }

  // Runs add(row, s1, s2) over the n * h * w rows, each thread into its own
  // [c] double accumulators s1 and s2, and leaves their sums (added in thread
  // order) in total_[0, c) and total_[c, 2c).
  template <typename Add>
  void SumRows(int n, const Add& add) {
    ctx_->Enter();
    const int64_t rows = int64_t{n} * positions_;
    const int c = c_;
    const size_t need = static_cast<size_t>(omp_get_max_threads()) * 2 * c;
    if (partial_.size() < need) partial_.resize(need);
    double* partial = partial_.data();
    int team = 1;
#pragma omp parallel if (Parallel(n))
    {
      const int t = omp_get_thread_num();
      const int threads = omp_get_num_threads();
#pragma omp single
      team = threads;
      double* s1 = partial + static_cast<size_t>(t) * 2 * c;
      double* s2 = s1 + c;
      std::fill(s1, s1 + 2 * c, 0.0);
      const int64_t begin = rows * t / threads;
      const int64_t end = rows * (t + 1) / threads;
      for (int64_t r = begin; r < end; ++r) add(r, s1, s2);
    }
    total_.assign(partial, partial + 2 * c);
    for (int t = 1; t < team; ++t) {
      const double* p = partial + static_cast<size_t>(t) * 2 * c;
      for (int i = 0; i < 2 * c; ++i) total_[i] += p[i];
    }
  }

  // Runs f(row) over the n * h * w rows.
  template <typename F>
  void MapRows(int n, const F& f) {
    ctx_->Enter();
    const int64_t rows = int64_t{n} * positions_;
#pragma omp parallel for schedule(static) if (Parallel(n))
    for (int64_t r = 0; r < rows; ++r) f(r);
  }

  const Context* ctx_;
  const int c_;
  const int64_t positions_;  // h * w
  const double epsilon_;
  std::vector<double> partial_;  // per thread: [c] sums, then [c] more
  std::vector<double> total_;
  std::vector<float> a_, b_, k_;  // per-channel coefficients of a pass
};

}  // namespace

absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>> MakeSyncBatchNorm(
    const Context* ctx, const BatchNormDesc& desc, int max_batch) {
  if (desc.in.h <= 0 || desc.in.w <= 0 || desc.in.c <= 0 || max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synchronised batch normalization of ", desc.in.ToString(),
        " for batches of ", max_batch, ": every size must be >= 1"));
  }
  return std::make_unique<CpuSyncBatchNorm>(ctx, desc);
}

}  // namespace dlbatch::trainer::cpu
