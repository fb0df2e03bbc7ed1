// Internals of the GPU backend (backend_cuda*.cc, gpu_*.cc): the device,
// stream and library handles its kernels share, checks that turn CUDA,
// cuDNN and cuBLAS return codes into a Status (while making a kernel) or
// the end of the process (while running, backend.h), and owners of cuDNN
// descriptors.
//
// Not for layers or the network: they see only backend.h.
#ifndef DLBATCH_TRAINER_CUDA_BACKEND_CUDA_INTERNAL_H_
#define DLBATCH_TRAINER_CUDA_BACKEND_CUDA_INTERNAL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/cuda/cublas_library.h"

namespace dlbatch::trainer::gpu {

#define DLBATCH_CUDNN_CHECK(expr)                       \
  do {                                                  \
    const cudnnStatus_t dlbatch_cudnn_status = (expr);  \
    if (dlbatch_cudnn_status != CUDNN_STATUS_SUCCESS) { \
      ::dlbatch::trainer::gpu::Fault(                   \
          #expr, __FILE__, __LINE__,                    \
          cudnnGetErrorString(dlbatch_cudnn_status));   \
    }                                                   \
  } while (false)

#define DLBATCH_CUBLAS_CHECK(expr)                                             \
  do {                                                                         \
    const cublasStatus_t dlbatch_cublas_status = (expr);                       \
    if (dlbatch_cublas_status != CUBLAS_STATUS_SUCCESS) {                      \
      ::dlbatch::trainer::gpu::Fault(                                          \
          #expr, __FILE__, __LINE__,                                           \
          ::dlbatch::trainer::gpu::CublasStatusString(dlbatch_cublas_status)); \
    }                                                                          \
  } while (false)

// While one is open on a thread, the return-code checks of that thread
// (DLBATCH_CUDA_CHECK, DLBATCH_CUDA_CHECK_LAUNCH, DLBATCH_CUDNN_CHECK,
// DLBATCH_CUBLAS_CHECK) keep their first failure here instead of ending the
// process (Fault): a step being recorded, where a call that cannot be
// recorded should end the recording, not the trainer. Scopes nest; the
// innermost keeps the failures. A scope belongs to the thread that opened
// it and is closed there (in any order).
class CaptureErrors {
 public:
  CaptureErrors();
  ~CaptureErrors();
  CaptureErrors(const CaptureErrors&) = delete;
  CaptureErrors& operator=(const CaptureErrors&) = delete;

  // OK, or the first failure since the scope opened (as CallError words
  // it, Internal).
  const absl::Status& status() const { return first_; }
  // Called by Fault.
  void Keep(const char* what, const char* file, int line, const char* detail);

 private:
  absl::Status first_;
  CaptureErrors* outer_;
};

// The Status of a failed call, naming it, its file and line.
absl::Status CallError(absl::StatusCode code, const char* what,
                       const char* file, int line, const char* detail);

// Ends the process: BackwardData of a convolution made without it
// (ConvDesc::input_grad false: the network never asks for that dx, and no
// algorithm was chosen for it).
[[noreturn]] void NoBackwardData(const std::string& name);

// cudaMalloc of `bytes` (256 where 0) into *data for `what` (a layer's
// name) on `device`: Backend::Allocate's and the kernels' own memory. Out
// of memory is ResourceExhausted saying what to shrink, with CUDA's error
// cleared (it is not sticky).
absl::Status DeviceAlloc(void** data, size_t bytes, int device,
                         absl::string_view what);
template <typename T>
absl::Status DeviceAlloc(T** data, size_t bytes, int device,
                         absl::string_view what) {
  void* p = nullptr;
  absl::Status s = DeviceAlloc(&p, bytes, device, what);
  *data = static_cast<T*>(p);
  return s;
}

// While making a kernel or the backend: a failure returns its Status.
#define DLBATCH_CUDA_RETURN_IF_ERROR(expr)                        \
  do {                                                            \
    const cudaError_t dlbatch_cuda_error = (expr);                \
    if (dlbatch_cuda_error != cudaSuccess) {                      \
      return ::dlbatch::trainer::gpu::CallError(                  \
          absl::StatusCode::kInternal, #expr, __FILE__, __LINE__, \
          cudaGetErrorString(dlbatch_cuda_error));                \
    }                                                             \
  } while (false)

// cuDNN's "not supported" and "bad parameter" say the shape cannot run
// (InvalidArgument, backend.h); anything else is Internal.
#define DLBATCH_CUDNN_RETURN_IF_ERROR(expr)                      \
  do {                                                           \
    const cudnnStatus_t dlbatch_cudnn_status = (expr);           \
    if (dlbatch_cudnn_status != CUDNN_STATUS_SUCCESS) {          \
      return ::dlbatch::trainer::gpu::CallError(                 \
          dlbatch_cudnn_status == CUDNN_STATUS_NOT_SUPPORTED ||  \
                  dlbatch_cudnn_status == CUDNN_STATUS_BAD_PARAM \
              ? absl::StatusCode::kInvalidArgument               \
              : absl::StatusCode::kInternal,                     \
          #expr, __FILE__, __LINE__,                             \
          cudnnGetErrorString(dlbatch_cudnn_status));            \
    }                                                            \
  } while (false)

#define DLBATCH_CUBLAS_RETURN_IF_ERROR(expr)                                   \
  do {                                                                         \
    const cublasStatus_t dlbatch_cublas_status = (expr);                       \
    if (dlbatch_cublas_status != CUBLAS_STATUS_SUCCESS) {                      \
      return ::dlbatch::trainer::gpu::CallError(                               \
          absl::StatusCode::kInternal, #expr, __FILE__, __LINE__,              \
          ::dlbatch::trainer::gpu::CublasStatusString(dlbatch_cublas_status)); \
    }                                                                          \
  } while (false)

// What every GPU kernel shares with its backend. Owned by the backend;
// kernels keep a pointer (the backend outlives them, backend.h).
struct Context {
  int device = 0;
  bool tf32 = false;
  // precision: bf16 or fp16 (CudaBackendOptions::precision): convolutions
  // and fully connected layers compute in `low` (gpu_conv_low.cc,
  // gpu_fc.cc); everything else stays float32.
  bool low_precision = false;
  LowType low = LowType::kBf16;
  // CudaBackendOptions' (the environment's word applied).
  CudaBackendOptions::Lowering lowering = CudaBackendOptions::Lowering::kTimed;
  size_t lowered_bytes = 0;
  int lowered_groups = 1;
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  const CublasLibrary* blas = nullptr;  // cuBLAS's functions (LoadCublas)

  // One workspace for every cuDNN call: they run one at a time on the
  // stream. Sized at kernel creation for the largest batch; Workspace grows
  // it (after waiting for the stream) should a call need more.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Counts the workspace's moves: work recorded before one (a CUDA graph,
  // Backend::StartRecording) points at freed memory and is stale.
  uint64_t workspace_moves = 0;
  absl::Status ReserveWorkspace(size_t bytes);
  void* Workspace(size_t bytes);

  // Algorithm choices of the convolutions: a key (what, shapes, batch
  // size) -> cuDNN's algorithm enum. Backend::SaveTuning/LoadTuning.
  std::map<std::string, int> tuning;
};

// Owner of one cuDNN descriptor.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { DLBATCH_CUDNN_CHECK(Create(&desc_)); }
  ~CudnnDescriptor() {
    if (desc_ != nullptr) Destroy(desc_);
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using TensorDescriptor =
    CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                    cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                    cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    CudnnDescriptor<cudnnConvolutionDescriptor_t,
                    cudnnCreateConvolutionDescriptor,
                    cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor =
    CudnnDescriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                    cudnnDestroyPoolingDescriptor>;

// Sets `desc` to n x (h, w, c) of `type` (float unless said), NHWC
// (shape.h).
absl::Status SetNhwc(const TensorDescriptor& desc, int n, const Shape& shape,
                     cudnnDataType_t type = CUDNN_DATA_FLOAT);

absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(Context* ctx,
                                                     const ConvDesc& desc,
                                                     int max_batch);
// A convolution that computes in ctx->low (REQUIRES: ctx->low_precision):
// casts in, cuDNN on tensor cores, casts out.
absl::StatusOr<std::unique_ptr<ConvKernel>> MakeLowConv(Context* ctx,
                                                        const ConvDesc& desc,
                                                        int max_batch);
// In low precision where ctx->low_precision.
absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(Context* ctx, Backend* backend,
                                                 const FcDesc& desc,
                                                 int max_batch);
absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(Context* ctx,
                                                     const PoolDesc& desc,
                                                     int max_batch);
absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
    Context* ctx, Backend* backend, const BatchNormDesc& desc, int max_batch);
absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>> MakeSyncBatchNorm(
    Context* ctx, Backend* backend, const BatchNormDesc& desc, int max_batch);

}  // namespace dlbatch::trainer::gpu

#endif  // DLBATCH_TRAINER_CUDA_BACKEND_CUDA_INTERNAL_H_
