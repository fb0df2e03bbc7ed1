// Layer kernels of the GPU backend that beat cuDNN's on the shapes small
// networks have (measured on an H100 with Nsight Compute, bench/gpu/NOTES.md):
//
// - a convolution's bias over NHWC rows: cudnnAddTensor and
//   cudnnConvolutionBackwardBias took 45 and 2264 us on LeNet's first layer
//   at batch 1024 (47 MB of gradient), where one pass over the bytes takes
//   about 20 us;
// - max pooling whose windows tile the input (stride = size, no padding,
//   LeNet's and most networks' 2x2/2): cuDNN's deterministic backward took
//   215 us there; with the window's argmax recorded in forward, backward is
//   one pass writing every input gradient once.
//
// Sums add in a fixed order (per-thread runs, then a fixed tree, then the
// chunks in order), never with atomics: a step computes the same bits each
// time it runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "trainer/backend_cuda_grid.h"
#include "trainer/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

__global__ void AddBiasRowsKernel(int64_t rows, int c,
                                  const float* __restrict__ bias,
                                  float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(i, rows * c) y[i] += bias[i % c];
}

// Block (32, kBiasRowsPerBlock): x over 32 channels, y over rows; blockIdx.x
// picks the 32 channels, blockIdx.y the chunk of rows. Each block's sums go
// to partial[chunk * c + channel].
constexpr int kBiasRowsPerBlock = 8;

__global__ void BiasGradPartialKernel(int64_t rows, int c, int64_t chunk_rows,
                                      const float* __restrict__ dy,
                                      double* __restrict__ partial) {
  __shared__ double shared[kBiasRowsPerBlock][32];
  const int channel = blockIdx.x * 32 + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk_rows;
  const int64_t end = std::min(rows, begin + chunk_rows);
  double sum = 0;
  if (channel < c) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kBiasRowsPerBlock) {
      sum += dy[r * c + channel];
    }
  }
  shared[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && channel < c) {
    double total = 0;
    for (int k = 0; k < kBiasRowsPerBlock; ++k) total += shared[k][threadIdx.x];
    partial[blockIdx.y * int64_t{c} + channel] = total;
  }
}

// A block per channel: its threads add strided chunks, then a fixed tree
// adds the threads' sums (one thread per channel took 40 us over 512
// chunks).
__global__ void BiasGradFinishKernel(int c, int chunks,
                                     const double* __restrict__ partial,
                                     float* __restrict__ db) {
  __shared__ double shared[kThreads];
  const int channel = blockIdx.x;
  double sum = 0;
  for (int k = threadIdx.x; k < chunks; k += blockDim.x) {
    sum += partial[k * int64_t{c} + channel];
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[channel] = static_cast<float>(shared[0]);
}

// One thread per output element (n, oy, ox, channel): the window's maximum
// and, where `argmax` is given, its position in the window (row-major; the
// first of equal values, as the CPU backend picks).
__global__ void MaxPoolTiledForwardKernel(int64_t count, int h, int w, int c,
                                          int kh, int kw, int oh, int ow,
                                          const float* __restrict__ x,
                                          float* __restrict__ y,
                                          uint8_t* __restrict__ argmax) {
  DLBATCH_GRID_STRIDE(i, count) {
    const int channel = static_cast<int>(i % c);
    int64_t rest = i / c;
    const int ox = static_cast<int>(rest % ow);
    rest /= ow;
    const int oy = static_cast<int>(rest % oh);
    const int64_t sample = rest / oh;
    const float* base =
        x + ((sample * h + int64_t{oy} * kh) * w + int64_t{ox} * kw) * c +
        channel;
    float best = base[0];
    int where = 0;
    for (int dy = 0; dy < kh; ++dy) {
      for (int dx = 0; dx < kw; ++dx) {
        const float v = base[(int64_t{dy} * w + dx) * c];
        if (v > best) {
          best = v;
          where = dy * kw + dx;
        }
      }
    }
    y[i] = best;
    if (argmax != nullptr) argmax[i] = static_cast<uint8_t>(where);
  }
}

// One thread per input element: the output's gradient where it was its
// window's argmax, else 0 (also in rows and columns no window covers).
__global__ void MaxPoolTiledBackwardKernel(int64_t count, int h, int w, int c,
                                           int kh, int kw, int oh, int ow,
                                           const uint8_t* __restrict__ argmax,
                                           const float* __restrict__ dy,
                                           float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    const int channel = static_cast<int>(i % c);
    int64_t rest = i / c;
    const int ix = static_cast<int>(rest % w);
    rest /= w;
    const int iy = static_cast<int>(rest % h);
    const int64_t sample = rest / h;
    const int oy = iy / kh, ox = ix / kw;
    float g = 0;
    if (oy < oh && ox < ow) {
      const int64_t o = ((sample * oh + oy) * ow + ox) * c + channel;
      if (argmax[o] == (iy - oy * kh) * kw + (ix - ox * kw)) g = dy[o];
    }
    dx[i] = g;
  }
}

int BiasGradChunks(int64_t rows) {
  // About 1024 rows a chunk (up to kBiasGradMaxChunks chunks): enough
  // blocks to keep the device busy, few partial sums to finish.
  return static_cast<int>(
      std::clamp<int64_t>((rows + 1023) / 1024, 1, kBiasGradMaxChunks));
}

}  // namespace

void LaunchAddBiasRows(cudaStream_t stream, int64_t rows, int c,
                       const float* bias, float* y) {
  if (rows <= 0 || c <= 0) return;
  AddBiasRowsKernel<<<Blocks(rows * c), kThreads, 0, stream>>>(rows, c, bias,
                                                                 y);
  DLBATCH_CUDA_CHECK_LAUNCH("AddBiasRowsKernel");
}

void LaunchBiasGradRows(cudaStream_t stream, int64_t rows, int c,
                        const float* dy, double* partial, float* db) {
  if (c <= 0) return;
  if (rows <= 0) {
    LaunchFill(stream, db, c, 0);
    return;
  }
  const int chunks = BiasGradChunks(rows);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  const dim3 grid((c + 31) / 32, chunks);
  const dim3 block(32, kBiasRowsPerBlock);
  BiasGradPartialKernel<<<grid, block, 0, stream>>>(rows, c, chunk_rows, dy,
                                                     partial);
  DLBATCH_CUDA_CHECK_LAUNCH("BiasGradPartialKernel");
  BiasGradFinishKernel<<<c, kThreads, 0, stream>>>(c, chunks, partial, db);
  DLBATCH_CUDA_CHECK_LAUNCH("BiasGradFinishKernel");
}

void LaunchMaxPoolTiledForward(cudaStream_t stream, int n, int h, int w, int c,
                               int kh, int kw, int oh, int ow, const float* x,
                               float* y, uint8_t* argmax) {
  const int64_t count = int64_t{n} * oh * ow * c;
  if (count <= 0) return;
  MaxPoolTiledForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, h, w, c, kh, kw, oh, ow, x, y, argmax);
  DLBATCH_CUDA_CHECK_LAUNCH("MaxPoolTiledForwardKernel");
}

void LaunchMaxPoolTiledBackward(cudaStream_t stream, int n, int h, int w,
                                int c, int kh, int kw, int oh, int ow,
                                const uint8_t* argmax, const float* dy,
                                float* dx) {
  const int64_t count = int64_t{n} * h * w * c;
  if (count <= 0) return;
  MaxPoolTiledBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(
      count, h, w, c, kh, kw, oh, ow, argmax, dy, dx);
  DLBATCH_CUDA_CHECK_LAUNCH("MaxPoolTiledBackwardKernel");
}

}  // namespace dlbatch::trainer::gpu
