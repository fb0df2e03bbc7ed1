// Fully connected layers on the GPU: cuBLAS products over row-major
// matrices. cuBLAS is column-major, where a row-major (r x c) matrix reads
// as its (c x r) transpose: x (n, in) as X = x^T, w (units, in) as
// W = w^T (in x units), y (n, units) as Y = y^T. So
//   y  = x w^T + b   is  Y  = W^T X       gemm(T, N), after Y = b per column
//   dx = dy w        is  DX = W DY        gemm(N, N)
//   dw = dy^T x      is  DW = X DY^T      gemm(N, T)
//   db = sum of dy's rows  is  DY ones(n)  gemv(N)
//
// In bf16 or fp16 (precision: bf16 | fp16) the same products run as
// cublasGemmEx on low-precision copies of x, w and dy with float32
// accumulation and float32 results (y, dx, dw directly: no cast back), as
// fc_low_products.h describes them (rows padded to multiples of 8
// elements, zeros that add nothing). Forward casts w and x, and
// BackwardWeights (which the network calls first) casts dy; later calls of
// the step reuse what holds the same pointer and batch size
// (gpu_conv_low.cc says why that holds). db sums float32 dy.

#include <cublas_v2.h>

#include <climits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/cuda/fc_low_products.h"

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

cudaDataType_t CublasType(LowType t) {
  return t == LowType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
}

class GpuLowFc final : public FcKernel {
 public:
  GpuLowFc(Context* ctx, const FcDesc& desc, int max_batch, Buffer ones,
           Buffer x_low, Buffer dy_low, Buffer w_low)
      : ctx_(ctx),
        units_(desc.units),
        p_(desc.in, desc.units),
        max_batch_(max_batch),
        type_(CublasType(ctx->low)),
        ones_(std::move(ones)),
        x_low_(std::move(x_low)),
        dy_low_(std::move(dy_low)),
        w_low_(std::move(w_low)) {}

  void Forward(int n, const float* x, const float* w, const float* b,
               float* y) override {
    Check(n);
    CastWeights(w);
    CastInput(n, x, /*again=*/true);
    dy_of_ = nullptr;
    LaunchBroadcastRows(ctx_->stream, n, units_, b, y);
    Multiply(p_.Forward(n), w_low_, x_low_, 1, y);
  }

  void BackwardData(int n, const float* dy, const float* w,
                    float* dx) override {
    Check(n);
    if (w != weights_of_) CastWeights(w);
    CastGradient(n, dy);
    Multiply(p_.BackwardData(n), w_low_, dy_low_, 0, dx);
  }

  void BackwardWeights(int n, const float* x, const float* dy, float* dw,
                       float* db) override {
    Check(n);
    CastInput(n, x, /*again=*/false);
    CastGradient(n, dy);
    Multiply(p_.BackwardWeights(n), x_low_, dy_low_, 0, dw);
    const float one = 1, zero = 0;
    DLBATCH_CUBLAS_CHECK(ctx_->blas->Sgemv(ctx_->cublas, CUBLAS_OP_N, units_, n,
                                           &one, dy, units_, ones_.f32(), 1,
                                           &zero, db, 1));
  }

 private:
  void CastWeights(const float* w) {
    LaunchToLow(ctx_->stream, ctx_->low, units_, p_.units_p(), p_.InputRows(),
                w, w_low_.as<void>());
    weights_of_ = w;
  }
  void CastInput(int n, const float* x, bool again) {
    if (!again && x == input_of_ && n == input_n_) return;
    LaunchToLow(ctx_->stream, ctx_->low, n, n, p_.InputRows(), x,
                x_low_.as<void>());
    input_of_ = x;
    input_n_ = n;
  }
  void CastGradient(int n, const float* dy) {
    if (dy == dy_of_ && n == dy_n_) return;
    LaunchToLow(ctx_->stream, ctx_->low, n, n, p_.GradientRows(), dy,
                dy_low_.as<void>());
    dy_of_ = dy;
    dy_n_ = n;
  }

  // c = a b (+ c where beta is 1) as `product` says: a and b low
  // precision, c float32, accumulated in float32.
  void Multiply(const MatrixProduct& product, const Buffer& a, const Buffer& b,
                float beta, float* c) {
    const float one = 1;
    DLBATCH_CUBLAS_CHECK(ctx_->blas->GemmEx(
        ctx_->cublas, product.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        product.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, product.m, product.n,
        product.k, &one, a.as<void>(), type_, product.lda, b.as<void>(), type_,
        product.ldb, &beta, c, CUDA_R_32F, product.ldc, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }

  void Check(int n) const {
    if (n < 1 || n > max_batch_) {
      Die("fully connected", __FILE__, __LINE__,
          absl::StrCat("batch size ", n, " outside [1, ", max_batch_, "]")
              .c_str());
    }
  }

  Context* ctx_;
  const int units_;
  const FcLowProducts p_;
  const int max_batch_;
  const cudaDataType_t type_;
  Buffer ones_;    // device float[max_batch], all 1: db's gemv
  Buffer x_low_;   // max_batch x in_p
  Buffer dy_low_;  // max_batch x units_p
  Buffer w_low_;   // units_p x in_p
  const float* weights_of_ = nullptr;  // what w_low_ holds
  const float* input_of_ = nullptr;    // what x_low_ holds
  int input_n_ = 0;
  const float* dy_of_ = nullptr;  // what dy_low_ holds
  int dy_n_ = 0;
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
  if (!ctx->low_precision) {
    return std::make_unique<GpuFc>(ctx, desc, max_batch, *std::move(ones));
  }
  if (desc.in > INT_MAX - 7 || desc.units > INT_MAX - 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("fully connected ", desc.in, " -> ", desc.units,
                     ": too large for cuBLAS once padded to a multiple of 8"));
  }
  constexpr size_t kLow = 2;  // bytes of a bf16 or fp16
  const FcLowProducts p(desc.in, desc.units);
  const size_t in_p = p.in_p(), units_p = p.units_p();
  absl::StatusOr<Buffer> x_low = backend->Allocate(kLow * max_batch * in_p);
  if (!x_low.ok()) return x_low.status();
  absl::StatusOr<Buffer> dy_low = backend->Allocate(kLow * max_batch * units_p);
  if (!dy_low.ok()) return dy_low.status();
  absl::StatusOr<Buffer> w_low = backend->Allocate(kLow * units_p * in_p);
  if (!w_low.ok()) return w_low.status();
  return std::make_unique<GpuLowFc>(ctx, desc, max_batch, *std::move(ones),
                                    *std::move(x_low), *std::move(dy_low),
                                    *std::move(w_low));
}

}  // namespace dlbatch::trainer::gpu
