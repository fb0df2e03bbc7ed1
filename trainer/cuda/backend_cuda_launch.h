// The GPU backend's own CUDA kernels, as host functions that launch them on
// a stream (backend_cuda_kernels.cu, gpu_batchnorm_kernels.cu). Plain C++
// and the CUDA runtime only, no absl: nvcc compiles the files that include
// this, the host compiler the rest of the backend.
//
// Every launcher returns as soon as its kernels are queued and ends the
// process (Fault) if a launch fails. Pointers are device memory; counts and
// semantics are backend.h's.
#ifndef DLBATCH_TRAINER_CUDA_BACKEND_CUDA_LAUNCH_H_
#define DLBATCH_TRAINER_CUDA_BACKEND_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/cuda/gpu_elements.h"  // ConvGeometry
#include "trainer/placement.h"

namespace dlbatch::trainer::gpu {

// Ends the process with the failed call, its file and line (backend.h: a
// failure while running cannot be recovered). Defined in backend_cuda.cc.
[[noreturn]] void Die(const char* what, const char* file, int line,
                      const char* detail);
// What the return-code checks below call on a failure: Die, unless this
// thread records a step (CaptureErrors, backend_cuda_internal.h): then the
// first failure is kept for FinishRecording, which fails with it, and the
// caller goes on (nothing recorded runs, so nothing depends on the call).
void Fault(const char* what, const char* file, int line, const char* detail);

#define DLBATCH_CUDA_CHECK(expr)                                              \
  do {                                                                        \
    const cudaError_t dlbatch_cuda_error = (expr);                            \
    if (dlbatch_cuda_error != cudaSuccess) {                                  \
      ::dlbatch::trainer::gpu::Fault(#expr, __FILE__, __LINE__,               \
                                     cudaGetErrorString(dlbatch_cuda_error)); \
    }                                                                         \
  } while (false)

// After a kernel launch: a bad configuration shows up here, a fault in the
// kernel at the next synchronising call.
// `kernel` is a string literal naming it.
#define DLBATCH_CUDA_CHECK_LAUNCH(kernel)                                     \
  do {                                                                        \
    const cudaError_t dlbatch_cuda_error = cudaGetLastError();                \
    if (dlbatch_cuda_error != cudaSuccess) {                                  \
      ::dlbatch::trainer::gpu::Fault("launch of " kernel, __FILE__, __LINE__, \
                                     cudaGetErrorString(dlbatch_cuda_error)); \
    }                                                                         \
  } while (false)

// Whether this build's kernels have machine code (or PTX the driver can
// compile) for the current device: cudaSuccess, or what CUDA says of one
// kernel (cudaErrorNoKernelImageForDevice where the build's architectures
// leave the device out). Launches nothing.
cudaError_t KernelImageStatus();

// --- element-wise (backend_cuda_kernels.cu) ---
void LaunchFill(cudaStream_t stream, float* x, int64_t count, float value);
void LaunchScale(cudaStream_t stream, int64_t count, float alpha, float* x);
void LaunchMultiply(cudaStream_t stream, int64_t count, const float* a,
                    const float* b, float* out);
void LaunchActivationForward(cudaStream_t stream, float alpha, int64_t count,
                             const float* x, float* y);
void LaunchActivationBackward(cudaStream_t stream, float alpha, int64_t count,
                              const float* x, const float* dy, float* dx);
// Exact GELU (erff) and its derivative.
void LaunchGeluForward(cudaStream_t stream, int64_t count, const float* x,
                       float* y);
void LaunchGeluBackward(cudaStream_t stream, int64_t count, const float* x,
                        const float* dy, float* dx);
// out = a + b; out may be a or b.
void LaunchAdd(cudaStream_t stream, int64_t count, const float* a,
               const float* b, float* out);
// dst[r * dst_stride + c] = src[r * src_stride + c], r < rows, c < cols:
// a concat layer's channels (Backend::CopyStrided).
void LaunchCopyStrided(cudaStream_t stream, int64_t rows, int64_t cols,
                       const float* src, int64_t src_stride, float* dst,
                       int64_t dst_stride);
// *at = value, in stream order (a kernel, so that it is recorded as one).
void LaunchStoreU64(cudaStream_t stream, uint64_t* at, uint64_t value);
// Draws with Key(*key, salt), *key read on the device (SetDropoutKey).
void LaunchDropoutForward(cudaStream_t stream, float p, const uint64_t* key,
                          uint64_t salt, int64_t count, const float* x,
                          float* mask, float* y);
// y[r, c] = bias[c] for r < rows, c < cols (row-major): the fully
// connected layer's bias, before its product is added with beta = 1.
void LaunchBroadcastRows(cudaStream_t stream, int rows, int cols,
                         const float* bias, float* y);

// Sum of squares into *result (device double) through `partial` (device
// double[kSumSquaresBlocks]), in a fixed order: the same inputs give the
// same bits.
inline constexpr int kSumSquaresBlocks = 256;
void LaunchSumSquares(cudaStream_t stream, int64_t count, const float* x,
                      double* partial, double* result);
// Where sqrt(*sum_squares) > threshold: x *= float(threshold / that norm),
// read on the device (Backend::ClipToNorm).
void LaunchScaleToNorm(cudaStream_t stream, int64_t count, double threshold,
                       const double* sum_squares, float* x);

void LaunchSoftmaxCrossEntropy(cudaStream_t stream, int n, int classes,
                               const float* logits, const int32_t* labels,
                               float smoothing, float* probs, float* stats);
void LaunchSoftmaxCrossEntropyBackward(cudaStream_t stream, int n, int classes,
                                       const float* probs,
                                       const int32_t* labels, float smoothing,
                                       float scale, float* dlogits);

// --- solvers: one pass each; [0, decayed) gets L2 ---
void LaunchSgdmUpdate(cudaStream_t stream, int64_t count, int64_t decayed,
                      float lr, float momentum, float l2, float* params,
                      const float* grads, float* velocity, bool nesterov);
// correction1 = 1 / (1 - beta1^t), correction2 = 1 / (1 - beta2^t).
void LaunchAdamUpdate(cudaStream_t stream, int64_t count, int64_t decayed,
                      float lr, float beta1, float beta2, float epsilon,
                      float correction1, float correction2, float l2,
                      float* params, const float* grads, float* m, float* v);
void LaunchRmspropUpdate(cudaStream_t stream, int64_t count, int64_t decayed,
                         float lr, float beta2, float epsilon, float l2,
                         float* params, const float* grads, float* v);

// --- layers (gpu_layer_kernels.cu) ---
// y[r, j] += bias[j] over `rows` rows of `c` channels (NHWC activations).
void LaunchAddBiasRows(cudaStream_t stream, int64_t rows, int c,
                       const float* bias, float* y);
// db[j] = sum over rows of dy[r, j], in a fixed order through `partial`
// (device double[kBiasGradMaxChunks * c], scratch of the caller).
inline constexpr int kBiasGradMaxChunks = 512;
void LaunchBiasGradRows(cudaStream_t stream, int64_t rows, int c,
                        const float* dy, double* partial, float* db);
// Max pooling whose kh x kw windows tile the input (stride = size, no
// padding; oh = h / kh, ow = w / kw): forward records each window's argmax
// (uint8, row-major in the window) where `argmax` is not null; backward
// writes every element of dx from it.
void LaunchMaxPoolTiledForward(cudaStream_t stream, int n, int h, int w, int c,
                               int kh, int kw, int oh, int ow, const float* x,
                               float* y, uint8_t* argmax);
void LaunchMaxPoolTiledBackward(cudaStream_t stream, int n, int h, int w, int c,
                                int kh, int kw, int oh, int ow,
                                const uint8_t* argmax, const float* dy,
                                float* dx);
// out (n, h, w, c) = pixels (n, h, w, c; bytes) placed and scaled as
// Backend::PrepareImages says; placements may be null.
void LaunchPrepareImages(cudaStream_t stream, int n, int h, int w, int c,
                         const uint8_t* pixels,
                         const SamplePlacement* placements,
                         const float* scale_bias, float* out);
// --- convolutions as matrix products (conv_lowering.h) ---
// patches (samples * oh * ow rows of kh * kw * c) = the patches of x's
// `samples` samples (PatchAt); dx (samples, h, w, c) = the fold of the
// patches' gradient (FoldedAt), every element written.
void LaunchUnfold(cudaStream_t stream, int samples, const ConvGeometry& g,
                  const float* x, float* patches);
void LaunchFold(cudaStream_t stream, int samples, const ConvGeometry& g,
                const float* patches, float* dx);
// out[i] (+ out[i] where `add`) = the sum over g < parts of
// partial[g * size + i] (SumOfPartsAt), i < size.
void LaunchSumParts(cudaStream_t stream, int parts, int64_t size,
                    const float* partial, bool add, float* out);
// --- batch normalisation (gpu_batchnorm_kernels.cu) ---
// Activations are `rows` = n * h * w positions of `c` channels (NHWC);
// `positions` = h * w. The passes are SyncBatchNormKernel's (backend.h);
// `partial` is device double[kBnMaxChunks * 2 * c], `coef` device
// float[3 * c], both scratch of the calling kernel.
inline constexpr int kBnMaxChunks = 128;
void LaunchBnForwardSums(cudaStream_t stream, int64_t rows, int c, int n,
                         const float* x, const float* shift, double* partial,
                         float* sums);
void LaunchBnForwardNormalize(cudaStream_t stream, int64_t rows, int c,
                              int64_t positions, float epsilon, const float* x,
                              const float* gamma, const float* beta,
                              const float* shift, const float* sums, float* y,
                              float* saved_mean, float* saved_var,
                              float* running_mean, float* running_var,
                              float momentum, float* coef);
void LaunchBnBackwardSums(cudaStream_t stream, int64_t rows, int c, int n,
                          float epsilon, const float* x, const float* dy,
                          const float* saved_mean, const float* saved_var,
                          double* partial, float* dgamma, float* dbeta,
                          float* sums);
void LaunchBnBackwardData(cudaStream_t stream, int64_t rows, int c,
                          int64_t positions, float epsilon, const float* x,
                          const float* dy, const float* gamma,
                          const float* saved_mean, const float* saved_var,
                          const float* sums, float* coef, float* dx);
// y = (x - running_mean) * gamma / sqrt(running_var + epsilon) + beta.
void LaunchBnForwardInference(cudaStream_t stream, int64_t rows, int c,
                              float epsilon, const float* x, const float* gamma,
                              const float* beta, const float* running_mean,
                              const float* running_var, float* coef, float* y);

// --- asymmetric padding (gpu_layer_kernels.cu) ---
// cuDNN pads symmetrically; these run layers whose `same` padding is not.
// padded (n, ph, pw, c) = x (n, h, w, c) at offset (top, left), zeros
// around it (every element written); ph >= h + top, pw >= w + left.
void LaunchPadNhwc(cudaStream_t stream, int n, int h, int w, int c, int top,
                   int left, int ph, int pw, const float* x, float* padded);
// x = the (h, w) interior of padded at offset (top, left): the inverse.
void LaunchCropNhwc(cudaStream_t stream, int n, int h, int w, int c, int top,
                    int left, int ph, int pw, const float* padded, float* x);
// Max (is_max) or average pooling over windows (kh, kw) that start at
// (oy * sh - top, ox * sw - left), counting only elements inside the input
// (PoolDesc's semantics, any padding). Forward records max pooling's argmax
// (int32 per output element: its row-major position in the window, the
// first maximum) where `argmax` is not null; backward writes every element
// of dx, adding in a fixed order without atomics (argmax unused for
// average).
void LaunchPoolPaddedForward(cudaStream_t stream, bool is_max, int n, int h,
                             int w, int c, int kh, int kw, int sh, int sw,
                             int top, int left, int oh, int ow, const float* x,
                             float* y, int32_t* argmax);
void LaunchPoolPaddedBackward(cudaStream_t stream, bool is_max, int n, int h,
                              int w, int c, int kh, int kw, int sh, int sw,
                              int top, int left, int oh, int ow,
                              const int32_t* argmax, const float* dy,
                              float* dx);

// --- mixed precision: float32 to and from bf16 or fp16 (gpu_cast_kernels.cu)
enum class LowType { kBf16, kFp16 };  // 2 bytes an element either way

// CastGeometry: gpu_elements.h.
// low (padded_n samples of ph x pw x pc, `type`) = x's n samples placed as
// `g` says, zeros elsewhere (the samples n..padded_n too).
void LaunchToLow(cudaStream_t stream, LowType type, int n, int padded_n,
                 const CastGeometry& g, const float* x, void* low);
// y (n samples of h x w x c) = low's elements at (top, left) of each
// sample, plus bias[channel] where bias is not null.
void LaunchFromLow(cudaStream_t stream, LowType type, int n,
                   const CastGeometry& g, const void* low, const float* bias,
                   float* y);

}  // namespace dlbatch::trainer::gpu

#endif  // DLBATCH_TRAINER_CUDA_BACKEND_CUDA_LAUNCH_H_
