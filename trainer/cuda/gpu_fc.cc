// Fully connected layers on the GPU: cuBLAS products over row-major
// matrices. cuBLAS is column-major, where a row-major (r x c) matrix reads
// as its (c x r) transpose: x (n, in) as X = x^T, w (units, in) as
// W = w^T (in x units), y (n, units) as Y = y^T. So
//   y  = x w^T + b   is  Y  = W^T X       gemm(T, N), after Y = b per column
//   dx = dy w        is  DX = W DY        gemm(N, N)
//   dw = dy^T x      is  DW = X DY^T      gemm(N, T)
//   db = sum of dy's rows  is  DY ones(n)  gemv(N)

#include <cublas_v2.h>

#include <climits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

class GpuFc final : public FcKernel {
 public:
  GpuFc(Context* ctx, const FcDesc& desc, int max_batch, Buffer ones)
      : ctx_(ctx),
        in_(static_cast<int>(desc.in)),
        units_(desc.units),
        max_batch_(max_batch),
        ones_(std::move(ones)) {}

  void Forward(int n, const float* x, const float* w, const float* b,
               float* y) override {
    Check(n);
    LaunchBroadcastRows(ctx_->stream, n, units_, b, y);
    const float one = 1;
    DLBATCH_CUBLAS_CHECK(ctx_->blas->Sgemm(ctx_->cublas, CUBLAS_OP_T,
                                           CUBLAS_OP_N, units_, n, in_, &one, w,
                                           in_, x, in_, &one, y, units_));
  }

  void BackwardData(int n, const float* dy, const float* w,
                    float* dx) override {
    Check(n);
    const float one = 1, zero = 0;
    DLBATCH_CUBLAS_CHECK(ctx_->blas->Sgemm(ctx_->cublas, CUBLAS_OP_N,
                                           CUBLAS_OP_N, in_, n, units_, &one, w,
                                           in_, dy, units_, &zero, dx, in_));
  }

  void BackwardWeights(int n, const float* x, const float* dy, float* dw,
                       float* db) override {
    Check(n);
    const float one = 1, zero = 0;
    DLBATCH_CUBLAS_CHECK(ctx_->blas->Sgemm(ctx_->cublas, CUBLAS_OP_N,
                                           CUBLAS_OP_T, in_, units_, n, &one, x,
                                           in_, dy, units_, &zero, dw, in_));
    DLBATCH_CUBLAS_CHECK(ctx_->blas->Sgemv(ctx_->cublas, CUBLAS_OP_N, units_, n,
                                           &one, dy, units_, ones_.f32(), 1,
                                           &zero, db, 1));
  }

 private:
  void Check(int n) const {
    if (n < 1 || n > max_batch_) {
      Die("fully connected", __FILE__, __LINE__,
          absl::StrCat("batch size ", n, " outside [1, ", max_batch_, "]")
              .c_str());
    }
  }

  Context* ctx_;
  const int in_;
  const int units_;
  const int max_batch_;
  Buffer ones_;  // device float[max_batch], all 1: db's gemv
};

}  // namespace

absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(Context* ctx, Backend* backend,
                                                 const FcDesc& desc,
                                                 int max_batch) {
  if (desc.in < 1 || desc.in > INT_MAX || desc.units < 1 || max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fully connected ", desc.in, " -> ", desc.units, " for batches of ",
        max_batch, ": cuBLAS takes sizes in [1, ", INT_MAX, "]"));
  }
  absl::StatusOr<Buffer> ones = backend->Allocate(max_batch * sizeof(float));
  if (!ones.ok()) return ones.status();
  LaunchFill(ctx->stream, ones->f32(), max_batch, 1.0f);
  return std::make_unique<GpuFc>(ctx, desc, max_batch, *std::move(ones));
}

}  // namespace dlbatch::trainer::gpu
