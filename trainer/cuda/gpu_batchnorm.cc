// Batch normalisation on the GPU, plain and synchronised across ranks: both
// run the passes of gpu_batchnorm_kernels.cu (see there why not cuDNN's).
// The plain kernel is the synchronised one with a single rank: its sums
// never leave the device, and the running mean serves as the shift that
// keeps the variance from cancelling.
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

// Scratch of one batchnorm layer: the chunks' double partial sums, the
// per-channel coefficients of a pass, and (plain kernel) the sums.
struct Scratch {
  Buffer partial;  // double[kBnMaxChunks * 2c]
  Buffer coef;     // float[3c]
  Buffer sums;     // float[2c + 1]
};

absl::StatusOr<Scratch> MakeScratch(Backend* backend, int c) {
  Scratch s;
  absl::StatusOr<Buffer> b =
      backend->Allocate(sizeof(double) * kBnMaxChunks * 2 * c);
  if (!b.ok()) return b.status();
  s.partial = *std::move(b);
  b = backend->Allocate(sizeof(float) * 3 * c);
  if (!b.ok()) return b.status();
  s.coef = *std::move(b);
  b = backend->Allocate(sizeof(float) * (2 * c + 1));
  if (!b.ok()) return b.status();
  s.sums = *std::move(b);
  return s;
}

class GpuSyncBatchNorm final : public SyncBatchNormKernel {
 public:
  GpuSyncBatchNorm(Context* ctx, const BatchNormDesc& desc, Scratch scratch)
      : ctx_(ctx),
        c_(desc.in.c),
        positions_(int64_t{desc.in.h} * desc.in.w),
        epsilon_(desc.epsilon),
        s_(std::move(scratch)) {}

  void ForwardSums(int n, const float* x, const float* shift,
                   float* sums) override {
    LaunchBnForwardSums(ctx_->stream, Rows(n), c_, n, x, shift,
                        s_.partial.as<double>(), sums);
  }

  void ForwardNormalize(int n, const float* x, const float* gamma,
                        const float* beta, const float* shift,
                        const float* sums, float* y, float* saved_mean,
                        float* saved_var, float* running_mean,
                        float* running_var, float momentum) override {
    LaunchBnForwardNormalize(ctx_->stream, Rows(n), c_, positions_, epsilon_, x,
                             gamma, beta, shift, sums, y, saved_mean, saved_var,
                             running_mean, running_var, momentum,
                             s_.coef.f32());
  }

  void BackwardSums(int n, const float* x, const float* dy,
                    const float* saved_mean, const float* saved_var,
                    float* dgamma, float* dbeta, float* sums) override {
    LaunchBnBackwardSums(ctx_->stream, Rows(n), c_, n, epsilon_, x, dy,
                         saved_mean, saved_var, s_.partial.as<double>(), dgamma,
                         dbeta, sums);
  }

  void BackwardData(int n, const float* x, const float* dy, const float* gamma,
                    const float* saved_mean, const float* saved_var,
                    const float* sums, float* dx) override {
    LaunchBnBackwardData(ctx_->stream, Rows(n), c_, positions_, epsilon_, x, dy,
                         gamma, saved_mean, saved_var, sums, s_.coef.f32(), dx);
  }

  // For the plain kernel.
  void ForwardInference(int n, const float* x, const float* gamma,
                        const float* beta, const float* running_mean,
                        const float* running_var, float* y) {
    LaunchBnForwardInference(ctx_->stream, Rows(n), c_, epsilon_, x, gamma,
                             beta, running_mean, running_var, s_.coef.f32(), y);
  }
  float* own_sums() { return s_.sums.f32(); }

 private:
  int64_t Rows(int n) const { return int64_t{n} * positions_; }

  Context* ctx_;
  const int c_;
  const int64_t positions_;
  const float epsilon_;
  Scratch s_;
};

class GpuBatchNorm final : public BatchNormKernel {
 public:
  explicit GpuBatchNorm(std::unique_ptr<GpuSyncBatchNorm> passes)
      : p_(std::move(passes)) {}

  void ForwardTraining(int n, const float* x, const float* gamma,
                       const float* beta, float* y, float* saved_mean,
                       float* saved_var, float* running_mean,
                       float* running_var, float momentum) override {
    float* sums = p_->own_sums();
    p_->ForwardSums(n, x, running_mean, sums);
    p_->ForwardNormalize(n, x, gamma, beta, running_mean, sums, y, saved_mean,
                         saved_var, running_mean, running_var, momentum);
  }

  void ForwardInference(int n, const float* x, const float* gamma,
                        const float* beta, const float* running_mean,
                        const float* running_var, float* y) override {
    p_->ForwardInference(n, x, gamma, beta, running_mean, running_var, y);
  }

  void Backward(int n, const float* x, const float* dy, const float* gamma,
                const float* saved_mean, const float* saved_var, float* dx,
                float* dgamma, float* dbeta) override {
    float* sums = p_->own_sums();
    p_->BackwardSums(n, x, dy, saved_mean, saved_var, dgamma, dbeta, sums);
    p_->BackwardData(n, x, dy, gamma, saved_mean, saved_var, sums, dx);
  }

 private:
  std::unique_ptr<GpuSyncBatchNorm> p_;
};

absl::StatusOr<std::unique_ptr<GpuSyncBatchNorm>> MakePasses(
    Context* ctx, Backend* backend, const BatchNormDesc& desc, int max_batch) {
  if (desc.in.h <= 0 || desc.in.w <= 0 || desc.in.c <= 0 || max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch normalization of ", desc.in.ToString(), " for batches of ",
        max_batch, ": every size must be >= 1"));
  }
  absl::StatusOr<Scratch> scratch = MakeScratch(backend, desc.in.c);
  if (!scratch.ok()) return scratch.status();
  return std::make_unique<GpuSyncBatchNorm>(ctx, desc, *std::move(scratch));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
    Context* ctx, Backend* backend, const BatchNormDesc& desc, int max_batch) {
  if (desc.relu) {  // the network folds none here: folds_relu() is false
    return absl::InvalidArgumentError(
        "batch normalization on a GPU folds no relu");
  }
  auto passes = MakePasses(ctx, backend, desc, max_batch);
  if (!passes.ok()) return passes.status();
  return std::make_unique<GpuBatchNorm>(*std::move(passes));
}

absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>> MakeSyncBatchNorm(
    Context* ctx, Backend* backend, const BatchNormDesc& desc, int max_batch) {
  auto passes = MakePasses(ctx, backend, desc, max_batch);
  if (!passes.ok()) return passes.status();
  return std::unique_ptr<SyncBatchNormKernel>(*std::move(passes));
}

}  // namespace dlbatch::trainer::gpu
