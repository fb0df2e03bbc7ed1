// Batch normalisation's kernels on the GPU, the passes of backend.h's
// SyncBatchNormKernel (the plain BatchNormKernel is the same passes with
// one rank). Our own kernels rather than cuDNN's: the interface keeps the
// biased variance (cuDNN saves the inverse standard deviation and moves the
// running variance by the unbiased one), and its sums must cross ranks
// between the passes, which cuDNN's fused calls cannot do.
//
// Per-channel sums over the n * h * w positions run in two steps with a
// fixed shape: blocks of 32 channels x 8 row lanes each sum a chunk of rows
// into double partials, then one thread per channel adds the chunks in
// order. No atomics: a result depends only on the inputs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "trainer/cuda/backend_cuda_grid.h"
#include "trainer/cuda/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

constexpr int kChannelTile = 32;
constexpr int kRowLanes = 8;

// Row chunks for `rows` positions: about 256 rows each, at most
// kBnMaxChunks.
int Chunks(int64_t rows) {
  return static_cast<int>(
      std::clamp<int64_t>((rows + 255) / 256, 1, kBnMaxChunks));
}

// --- kernels ---

// grid (channel tiles, chunks), block (kChannelTile, kRowLanes). Forward
// (dy == nullptr): s1 = sum (x - center), s2 = sum (x - center)^2.
// Backward: s1 = sum dy * (x - center), s2 = sum dy. Chunk j's sums go to
// partial[j * 2c + ch] and partial[j * 2c + c + ch].
__global__ void ChannelSumsKernel(int64_t rows, int c, int chunks,
                                  const float* __restrict__ x,
                                  const float* __restrict__ dy,
                                  const float* __restrict__ center,
                                  double* __restrict__ partial) {
  __shared__ double s1_lanes[kRowLanes][kChannelTile];
  __shared__ double s2_lanes[kRowLanes][kChannelTile];
  const int ch = blockIdx.x * kChannelTile + threadIdx.x;
  const int64_t begin = rows * blockIdx.y / chunks;
  const int64_t end = rows * (blockIdx.y + 1) / chunks;
  double s1 = 0, s2 = 0;
  if (ch < c) {
    const float mid = center[ch];
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const double d = x[r * c + ch] - mid;
      if (dy == nullptr) {
        s1 += d;
        s2 += d * d;
      } else {
        const double g = dy[r * c + ch];
        s1 += g * d;
        s2 += g;
      }
    }
  }
  s1_lanes[threadIdx.y][threadIdx.x] = s1;
  s2_lanes[threadIdx.y][threadIdx.x] = s2;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    for (int lane = 1; lane < kRowLanes; ++lane) {
      s1 += s1_lanes[lane][threadIdx.x];
      s2 += s2_lanes[lane][threadIdx.x];
    }
    double* out = partial + int64_t{blockIdx.y} * 2 * c;
    out[ch] = s1;
    out[c + ch] = s2;
  }
}

// A thread per channel: the chunks' sums in order. Forward: into sums.
// Backward (saved_var != nullptr): dgamma = s1 / sqrt(var + eps),
// dbeta = s2, the same into sums. Both: sums[2c] = n.
__global__ void FinishSumsKernel(int c, int chunks, int n, float epsilon,
                                 const double* __restrict__ partial,
                                 const float* __restrict__ saved_var,
                                 float* __restrict__ dgamma,
                                 float* __restrict__ dbeta,
                                 float* __restrict__ sums) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch == 0) sums[2 * c] = static_cast<float>(n);
  if (ch >= c) return;
  double s1 = 0, s2 = 0;
  for (int j = 0; j < chunks; ++j) {
    s1 += partial[int64_t{j} * 2 * c + ch];
    s2 += partial[int64_t{j} * 2 * c + c + ch];
  }
  if (saved_var != nullptr) {
    s1 /= sqrt(static_cast<double>(saved_var[ch]) + epsilon);
    dgamma[ch] = static_cast<float>(s1);
    dbeta[ch] = static_cast<float>(s2);
  }
  sums[ch] = static_cast<float>(s1);
  sums[c + ch] = static_cast<float>(s2);
}

// A thread per channel, from the totals: mean and biased variance, the
// running statistics moved toward them, and coef[ch] = gamma / std.
__global__ void ForwardStatsKernel(
    int c, int64_t positions, float epsilon, const float* __restrict__ gamma,
    const float* shift, const float* sums, float* __restrict__ saved_mean,
    float* __restrict__ saved_var, float* running_mean,
    float* __restrict__ running_var, float momentum, float* __restrict__ coef) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const double m = static_cast<double>(sums[2 * c]) * positions;
  const double d = sums[ch] / m;  // mean - shift
  const double var = fmax(sums[c + ch] / m - d * d, 0.0);
  const double mean = shift[ch] + d;  // read before running_mean is written
  coef[ch] = static_cast<float>(gamma[ch] / sqrt(var + epsilon));
  saved_mean[ch] = static_cast<float>(mean);
  saved_var[ch] = static_cast<float>(var);
  running_mean[ch] =
      (1 - momentum) * running_mean[ch] + momentum * static_cast<float>(mean);
  running_var[ch] =
      (1 - momentum) * running_var[ch] + momentum * static_cast<float>(var);
}

// A thread per channel: coef[ch] = gamma / sqrt(running_var + eps).
__global__ void InferenceStatsKernel(int c, float epsilon,
                                     const float* __restrict__ gamma,
                                     const float* __restrict__ running_var,
                                     float* __restrict__ coef) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  coef[ch] = static_cast<float>(
      gamma[ch] / sqrt(static_cast<double>(running_var[ch]) + epsilon));
}

// y = (x - mean) * coef + beta.
__global__ void NormalizeKernel(int64_t count, int c,
                                const float* __restrict__ x,
                                const float* __restrict__ mean,
                                const float* __restrict__ coef,
                                const float* __restrict__ beta,
                                float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int ch = static_cast<int>(i % c);
    y[i] = (x[i] - mean[ch]) * coef[ch] + beta[ch];
  }
}

// A thread per channel: dx = a * dy + k * (x - mean) + b with
// a = gamma / std, k = -a / std * sums[ch] / m, b = -a * sums[c + ch] / m;
// coef = [a | k | b].
__global__ void BackwardCoefficientsKernel(int c, int64_t positions,
                                           float epsilon,
                                           const float* __restrict__ gamma,
                                           const float* __restrict__ saved_var,
                                           const float* __restrict__ sums,
                                           float* __restrict__ coef) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const double m = static_cast<double>(sums[2 * c]) * positions;
  const double inv_std =
      1.0 / sqrt(static_cast<double>(saved_var[ch]) + epsilon);
  const double a = gamma[ch] * inv_std;
  coef[ch] = static_cast<float>(a);
  coef[c + ch] = static_cast<float>(-a * inv_std * sums[ch] / m);
  coef[2 * c + ch] = static_cast<float>(-a * sums[c + ch] / m);
}

__global__ void BackwardDataKernel(int64_t count, int c,
                                   const float* __restrict__ x,
                                   const float* __restrict__ dy,
                                   const float* __restrict__ mean,
                                   const float* __restrict__ coef,
                                   float* __restrict__ dx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int ch = static_cast<int>(i % c);
    dx[i] =
        coef[ch] * dy[i] + coef[c + ch] * (x[i] - mean[ch]) + coef[2 * c + ch];
  }
}

void LaunchChannelSums(cudaStream_t stream, int64_t rows, int c, const float* x,
                       const float* dy, const float* center, double* partial) {
  const dim3 grid((c + kChannelTile - 1) / kChannelTile, Chunks(rows));
  const dim3 block(kChannelTile, kRowLanes);
  ChannelSumsKernel<<<grid, block, 0, stream>>>(rows, c, Chunks(rows), x, dy,
                                                center, partial);
  DLBATCH_CUDA_CHECK_LAUNCH("ChannelSumsKernel");
}

int ChannelBlocks(int c) { return (c + kThreads - 1) / kThreads; }

}  // namespace

// --- launchers ---

void LaunchBnForwardSums(cudaStream_t stream, int64_t rows, int c, int n,
                         const float* x, const float* shift, double* partial,
                         float* sums) {
  LaunchChannelSums(stream, rows, c, x, nullptr, shift, partial);
  FinishSumsKernel<<<ChannelBlocks(c), kThreads, 0, stream>>>(
      c, Chunks(rows), n, 0, partial, nullptr, nullptr, nullptr, sums);
  DLBATCH_CUDA_CHECK_LAUNCH("FinishSumsKernel");
}

void LaunchBnForwardNormalize(cudaStream_t stream, int64_t rows, int c,
                              int64_t positions, float epsilon, const float* x,
                              const float* gamma, const float* beta,
                              const float* shift, const float* sums, float* y,
                              float* saved_mean, float* saved_var,
                              float* running_mean, float* running_var,
                              float momentum, float* coef) {
  ForwardStatsKernel<<<ChannelBlocks(c), kThreads, 0, stream>>>(
      c, positions, epsilon, gamma, shift, sums, saved_mean, saved_var,
      running_mean, running_var, momentum, coef);
  DLBATCH_CUDA_CHECK_LAUNCH("ForwardStatsKernel");
  const int64_t count = rows * c;
  NormalizeKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, c, x, saved_mean, coef, beta, y);
  DLBATCH_CUDA_CHECK_LAUNCH("NormalizeKernel");
}

void LaunchBnBackwardSums(cudaStream_t stream, int64_t rows, int c, int n,
                          float epsilon, const float* x, const float* dy,
                          const float* saved_mean, const float* saved_var,
                          double* partial, float* dgamma, float* dbeta,
                          float* sums) {
  LaunchChannelSums(stream, rows, c, x, dy, saved_mean, partial);
  FinishSumsKernel<<<ChannelBlocks(c), kThreads, 0, stream>>>(
      c, Chunks(rows), n, epsilon, partial, saved_var, dgamma, dbeta, sums);
  DLBATCH_CUDA_CHECK_LAUNCH("FinishSumsKernel");
}

void LaunchBnBackwardData(cudaStream_t stream, int64_t rows, int c,
                          int64_t positions, float epsilon, const float* x,
                          const float* dy, const float* gamma,
                          const float* saved_mean, const float* saved_var,
                          const float* sums, float* coef, float* dx) {
  BackwardCoefficientsKernel<<<ChannelBlocks(c), kThreads, 0, stream>>>(
      c, positions, epsilon, gamma, saved_var, sums, coef);
  DLBATCH_CUDA_CHECK_LAUNCH("BackwardCoefficientsKernel");
  const int64_t count = rows * c;
  BackwardDataKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, c, x, dy, saved_mean, coef, dx);
  DLBATCH_CUDA_CHECK_LAUNCH("BackwardDataKernel");
}

void LaunchBnForwardInference(cudaStream_t stream, int64_t rows, int c,
                              float epsilon, const float* x, const float* gamma,
                              const float* beta, const float* running_mean,
                              const float* running_var, float* coef, float* y) {
  InferenceStatsKernel<<<ChannelBlocks(c), kThreads, 0, stream>>>(
      c, epsilon, gamma, running_var, coef);
  DLBATCH_CUDA_CHECK_LAUNCH("InferenceStatsKernel");
  const int64_t count = rows * c;
  NormalizeKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, c, x, running_mean, coef, beta, y);
  DLBATCH_CUDA_CHECK_LAUNCH("NormalizeKernel");
}

}  // namespace dlbatch::trainer::gpu
