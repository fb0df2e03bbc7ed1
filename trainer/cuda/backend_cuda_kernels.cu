// The GPU backend's element-wise kernels: activations, dropout, softmax
// cross-entropy, the solvers (one fused pass over the contiguous parameter
// buffer each) and the reductions. Kernels first, their launchers after;
// backend_cpu_kernels.cc holds the reference loops they are tested against.
//
// Reductions (sum of squares, the loss) add in a fixed order with a fixed
// launch shape, never with atomics, so that a step computes the same bits
// every time it runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "trainer/cuda/backend_cuda_grid.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/rng.h"

namespace dlbatch::trainer::gpu {
namespace {

// --- kernels ---

__global__ void FillKernel(float* __restrict__ x, int64_t count, float value) {
  DLBATCH_GRID_STRIDE(i, count) x[i] = value;
}

__global__ void ScaleKernel(int64_t count, float alpha, float* __restrict__ x) {
  DLBATCH_GRID_STRIDE(i, count) x[i] *= alpha;
}

__global__ void MultiplyKernel(int64_t count, const float* __restrict__ a,
                               const float* __restrict__ b,
                               float* __restrict__ out) {
  DLBATCH_GRID_STRIDE(i, count) out[i] = a[i] * b[i];
}

__global__ void ActivationForwardKernel(float alpha, int64_t count,
                                        const float* __restrict__ x,
                                        float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float v = x[i];
    y[i] = v > 0 ? v : alpha * v;
  }
}

__global__ void ActivationBackwardKernel(float alpha, int64_t count,
                                         const float* __restrict__ x,
                                         const float* __restrict__ dy,
                                         float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) dx[i] = x[i] > 0 ? dy[i] : alpha * dy[i];
}

// 0.5 x (1 + erf(x / sqrt 2)) and its derivative Phi(x) + x phi(x).
__global__ void GeluForwardKernel(int64_t count, const float* __restrict__ x,
                                  float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}

__global__ void GeluBackwardKernel(int64_t count, const float* __restrict__ x,
                                   const float* __restrict__ dy,
                                   float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

// out may alias a or b: each thread reads its element before writing it.
__global__ void AddKernel(int64_t count, const float* a, const float* b,
                          float* out) {
  DLBATCH_GRID_STRIDE(i, count) out[i] = a[i] + b[i];
}

__global__ void CopyStridedKernel(int64_t rows, int64_t cols,
                                  const float* __restrict__ src,
                                  int64_t src_stride, float* __restrict__ dst,
                                  int64_t dst_stride) {
  DLBATCH_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols;
    const int64_t c = i - r * cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

// The same counter-based draws as the CPU backend (rng.h's UniformAt),
// from the key SetDropoutKey left in device memory.
__global__ void DropoutForwardKernel(float p, float keep,
                                     const uint64_t* __restrict__ key,
                                     uint64_t salt, int64_t count,
                                     const float* __restrict__ x,
                                     float* __restrict__ mask,
                                     float* __restrict__ y) {
  const uint64_t seed = Key(*key, salt);
  DLBATCH_GRID_STRIDE(i, count) {
    const float m = UniformAt(seed, static_cast<uint64_t>(i)) >= p ? keep : 0;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void StoreU64Kernel(uint64_t* __restrict__ at, uint64_t value) {
  *at = value;
}

__global__ void BroadcastRowsKernel(int rows, int cols,
                                    const float* __restrict__ bias,
                                    float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(i, int64_t{rows} * cols) y[i] = bias[i % cols];
}

// Sums a block's `value`s in a fixed tree order; thread 0 gets the total.
template <typename T>
__device__ T BlockSum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// Launched with kSumSquaresBlocks blocks of kThreads: each block's sum into
// partial[block].
__global__ void SumSquaresPartialKernel(int64_t count,
                                        const float* __restrict__ x,
                                        double* __restrict__ partial) {
  __shared__ double shared[kThreads];
  double sum = 0;
  DLBATCH_GRID_STRIDE(i, count) {
    const double v = x[i];
    sum += v * v;
  }
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// x *= threshold / norm where the norm (from the device) exceeds it; the
// factor is the CPU backend's, rounded from double once.
__global__ void ScaleToNormKernel(int64_t count, double threshold,
                                  const double* __restrict__ sum_squares,
                                  float* __restrict__ x) {
  const double norm = sqrt(*sum_squares);
  if (!(norm > threshold)) return;
  const float factor = static_cast<float>(threshold / norm);
  DLBATCH_GRID_STRIDE(i, count) x[i] *= factor;
}

// One block of kThreads over the partial sums.
__global__ void SumPartialsKernel(int parts, const double* __restrict__ partial,
                                  double* __restrict__ result) {
  __shared__ double shared[kThreads];
  double sum = 0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) sum += partial[i];
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) *result = sum;
}

// One block; a thread per row (rows strided by the block). The loss and the
// correct count are summed in a fixed order and added to stats once.
__global__ void SoftmaxCrossEntropyKernel(int n, int classes,
                                          const float* __restrict__ logits,
                                          const int32_t* __restrict__ labels,
                                          float smoothing,
                                          float* __restrict__ probs,
                                          float* __restrict__ stats) {
  __shared__ double shared[kThreads];
  double loss = 0, correct = 0;
  for (int r = threadIdx.x; r < n; r += blockDim.x) {
    const float* z = logits + int64_t{r} * classes;
    float* p = probs + int64_t{r} * classes;
    int argmax = 0;
    for (int k = 1; k < classes; ++k) {
      if (z[k] > z[argmax]) argmax = k;
    }
    const float max = z[argmax];
    double sum = 0, sum_z = 0;
    for (int k = 0; k < classes; ++k) {
      p[k] = expf(z[k] - max);
      sum += p[k];
      sum_z += static_cast<double>(z[k]) - max;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int k = 0; k < classes; ++k) p[k] *= inv;
    const int label = labels[r];
    // From the logits: finite where the probability underflows.
    const double log_sum = log(sum);
    const double nll = log_sum - (static_cast<double>(z[label]) - max);
    loss += smoothing == 0 ? nll
                           : (1.0 - smoothing) * nll +
                                 smoothing * (log_sum - sum_z / classes);
    correct += argmax == label ? 1 : 0;
  }
  loss = BlockSum(loss, shared);
  __syncthreads();
  correct = BlockSum(correct, shared);
  if (threadIdx.x == 0) {
    stats[0] += static_cast<float>(loss);
    stats[1] += static_cast<float>(correct);
  }
}

__global__ void SoftmaxCrossEntropyBackwardKernel(
    int n, int classes, const float* __restrict__ probs,
    const int32_t* __restrict__ labels, float label_q, float other_q,
    float scale, float* __restrict__ dlogits) {
  DLBATCH_GRID_STRIDE(i, int64_t{n} * classes) {
    const int64_t r = i / classes;
    const int k = static_cast<int>(i - r * classes);
    dlogits[i] = probs[i] * scale - (k == labels[r] ? label_q : other_q);
  }
}

template <bool kNesterov>
__global__ void SgdmKernel(int64_t count, int64_t decayed, float lr,
                           float momentum, float l2, float* __restrict__ params,
                           const float* __restrict__ grads,
                           float* __restrict__ velocity) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float p = params[i];
    const float g = i < decayed ? grads[i] + l2 * p : grads[i];
    const float v = momentum * velocity[i] - lr * g;
    velocity[i] = v;
    params[i] = kNesterov ? p + (momentum * v - lr * g) : p + v;
  }
}

__global__ void AdamKernel(int64_t count, int64_t decayed, float lr,
                           float beta1, float beta2, float epsilon,
                           float correction1, float correction2, float l2,
                           float* __restrict__ params,
                           const float* __restrict__ grads,
                           float* __restrict__ m, float* __restrict__ v) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float p = params[i];
    const float g = i < decayed ? grads[i] + l2 * p : grads[i];
    const float mi = beta1 * m[i] + (1 - beta1) * g;
    const float vi = beta2 * v[i] + (1 - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] =
        p - lr * (mi * correction1) / (sqrtf(vi * correction2) + epsilon);
  }
}

__global__ void RmspropKernel(int64_t count, int64_t decayed, float lr,
                              float beta2, float epsilon, float l2,
                              float* __restrict__ params,
                              const float* __restrict__ grads,
                              float* __restrict__ v) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float p = params[i];
    const float g = i < decayed ? grads[i] + l2 * p : grads[i];
    const float vi = beta2 * v[i] + (1 - beta2) * g * g;
    v[i] = vi;
    params[i] = p - lr * g / (sqrtf(vi) + epsilon);
  }
}

}  // namespace

cudaError_t KernelImageStatus() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, FillKernel);
}

// --- launchers ---

void LaunchFill(cudaStream_t stream, float* x, int64_t count, float value) {
  if (count <= 0) return;
  FillKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, value);
  DLBATCH_CUDA_CHECK_LAUNCH("FillKernel");
}

void LaunchScale(cudaStream_t stream, int64_t count, float alpha, float* x) {
  if (count <= 0) return;
  ScaleKernel<<<Blocks(count), kThreads, 0, stream>>>(count, alpha, x);
  DLBATCH_CUDA_CHECK_LAUNCH("ScaleKernel");
}

void LaunchMultiply(cudaStream_t stream, int64_t count, const float* a,
                    const float* b, float* out) {
  if (count <= 0) return;
  MultiplyKernel<<<Blocks(count), kThreads, 0, stream>>>(count, a, b, out);
  DLBATCH_CUDA_CHECK_LAUNCH("MultiplyKernel");
}

void LaunchActivationForward(cudaStream_t stream, float alpha, int64_t count,
                             const float* x, float* y) {
  if (count <= 0) return;
  ActivationForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(alpha, count,
                                                                  x, y);
  DLBATCH_CUDA_CHECK_LAUNCH("ActivationForwardKernel");
}

void LaunchActivationBackward(cudaStream_t stream, float alpha, int64_t count,
                              const float* x, const float* dy, float* dx) {
  if (count <= 0) return;
  ActivationBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(alpha, count,
                                                                   x, dy, dx);
  DLBATCH_CUDA_CHECK_LAUNCH("ActivationBackwardKernel");
}

void LaunchGeluForward(cudaStream_t stream, int64_t count, const float* x,
                       float* y) {
  if (count <= 0) return;
  GeluForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(count, x, y);
  DLBATCH_CUDA_CHECK_LAUNCH("GeluForwardKernel");
}

void LaunchGeluBackward(cudaStream_t stream, int64_t count, const float* x,
                        const float* dy, float* dx) {
  if (count <= 0) return;
  GeluBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(count, x, dy, dx);
  DLBATCH_CUDA_CHECK_LAUNCH("GeluBackwardKernel");
}

void LaunchAdd(cudaStream_t stream, int64_t count, const float* a,
               const float* b, float* out) {
  if (count <= 0) return;
  AddKernel<<<Blocks(count), kThreads, 0, stream>>>(count, a, b, out);
  DLBATCH_CUDA_CHECK_LAUNCH("AddKernel");
}

void LaunchCopyStrided(cudaStream_t stream, int64_t rows, int64_t cols,
                       const float* src, int64_t src_stride, float* dst,
                       int64_t dst_stride) {
  if (rows <= 0 || cols <= 0) return;
  CopyStridedKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(
      rows, cols, src, src_stride, dst, dst_stride);
  DLBATCH_CUDA_CHECK_LAUNCH("CopyStridedKernel");
}

void LaunchStoreU64(cudaStream_t stream, uint64_t* at, uint64_t value) {
  StoreU64Kernel<<<1, 1, 0, stream>>>(at, value);
  DLBATCH_CUDA_CHECK_LAUNCH("StoreU64Kernel");
}

void LaunchDropoutForward(cudaStream_t stream, float p, const uint64_t* key,
                          uint64_t salt, int64_t count, const float* x,
                          float* mask, float* y) {
  if (count <= 0) return;
  DropoutForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(
      p, 1.0f / (1.0f - p), key, salt, count, x, mask, y);
  DLBATCH_CUDA_CHECK_LAUNCH("DropoutForwardKernel");
}

void LaunchBroadcastRows(cudaStream_t stream, int rows, int cols,
                         const float* bias, float* y) {
  if (rows <= 0 || cols <= 0) return;
  BroadcastRowsKernel<<<Blocks(int64_t{rows} * cols), kThreads, 0, stream>>>(
      rows, cols, bias, y);
  DLBATCH_CUDA_CHECK_LAUNCH("BroadcastRowsKernel");
}

void LaunchSumSquares(cudaStream_t stream, int64_t count, const float* x,
                      double* partial, double* result) {
  SumSquaresPartialKernel<<<kSumSquaresBlocks, kThreads, 0, stream>>>(
      std::max<int64_t>(count, 0), x, partial);
  DLBATCH_CUDA_CHECK_LAUNCH("SumSquaresPartialKernel");
  SumPartialsKernel<<<1, kThreads, 0, stream>>>(kSumSquaresBlocks, partial,
                                                result);
  DLBATCH_CUDA_CHECK_LAUNCH("SumPartialsKernel");
}

void LaunchScaleToNorm(cudaStream_t stream, int64_t count, double threshold,
                       const double* sum_squares, float* x) {
  if (count <= 0) return;
  ScaleToNormKernel<<<Blocks(count), kThreads, 0, stream>>>(count, threshold,
                                                            sum_squares, x);
  DLBATCH_CUDA_CHECK_LAUNCH("ScaleToNormKernel");
}

void LaunchSoftmaxCrossEntropy(cudaStream_t stream, int n, int classes,
                               const float* logits, const int32_t* labels,
                               float smoothing, float* probs, float* stats) {
  if (n <= 0) return;
  SoftmaxCrossEntropyKernel<<<1, kThreads, 0, stream>>>(
      n, classes, logits, labels, smoothing, probs, stats);
  DLBATCH_CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyKernel");
}

void LaunchSoftmaxCrossEntropyBackward(cudaStream_t stream, int n, int classes,
                                       const float* probs,
                                       const int32_t* labels, float smoothing,
                                       float scale, float* dlogits) {
  if (n <= 0) return;
  // q * scale as the CPU backend rounds it.
  const float other = smoothing / static_cast<float>(classes) * scale;
  const float label = smoothing == 0 ? scale : (1 - smoothing) * scale + other;
  SoftmaxCrossEntropyBackwardKernel<<<Blocks(int64_t{n} * classes), kThreads, 0,
                                      stream>>>(
      n, classes, probs, labels, label, smoothing == 0 ? 0.0f : other, scale,
      dlogits);
  DLBATCH_CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyBackwardKernel");
}

void LaunchSgdmUpdate(cudaStream_t stream, int64_t count, int64_t decayed,
                      float lr, float momentum, float l2, float* params,
                      const float* grads, float* velocity, bool nesterov) {
  if (count <= 0) return;
  if (nesterov) {
    SgdmKernel<true><<<Blocks(count), kThreads, 0, stream>>>(
        count, decayed, lr, momentum, l2, params, grads, velocity);
  } else {
    SgdmKernel<false><<<Blocks(count), kThreads, 0, stream>>>(
        count, decayed, lr, momentum, l2, params, grads, velocity);
  }
  DLBATCH_CUDA_CHECK_LAUNCH("SgdmKernel");
}

void LaunchAdamUpdate(cudaStream_t stream, int64_t count, int64_t decayed,
                      float lr, float beta1, float beta2, float epsilon,
                      float correction1, float correction2, float l2,
                      float* params, const float* grads, float* m, float* v) {
  if (count <= 0) return;
  AdamKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, decayed, lr, beta1, beta2, epsilon, correction1, correction2, l2,
      params, grads, m, v);
  DLBATCH_CUDA_CHECK_LAUNCH("AdamKernel");
}

void LaunchRmspropUpdate(cudaStream_t stream, int64_t count, int64_t decayed,
                         float lr, float beta2, float epsilon, float l2,
                         float* params, const float* grads, float* v) {
  if (count <= 0) return;
  RmspropKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, decayed, lr, beta2, epsilon, l2, params, grads, v);
  DLBATCH_CUDA_CHECK_LAUNCH("RmspropKernel");
}

}  // namespace dlbatch::trainer::gpu
