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
// And what cuDNN cannot do: pooling with asymmetric padding (`same` with an
// even window or a stride over an even size) and the zero-padded copy that
// lets cuDNN's symmetric convolution run such a layer; and a batch's images
// from the data set's bytes, scaled, normalised and augmented (placed).
// And a convolution's unfolded patches and their fold, for running it as a
// matrix product where that beats cuDNN (conv_lowering.h).
//
// Kernels whose index arithmetic is a template parameter run it in int32
// where every index of their arrays fits (FitsInt32, decided by the
// launcher), else in int64. 64-bit division and modulo take many
// instructions: profiled on an H100 at int64, the bias add (57 us) and the
// tiled max-pool backward (124 us) spent most of their time on them. The
// grid-stride counter stays int64 (it may step past 2^31); only the index
// of an element, below the count, is narrowed. Results do not change. At
// int32 the divisions by the geometry's sizes are a multiply and a shift
// (Divisor, gpu_elements.h): an int32 division is still about twenty
// instructions, and the kernels divide several times per element.
//
// Sums add in a fixed order (per-thread runs, then a fixed tree, then the
// chunks in order), never with atomics: a step computes the same bits each
// time it runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "trainer/cuda/backend_cuda_grid.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/cuda/gpu_elements.h"
#include "trainer/placement.h"

namespace dlbatch::trainer::gpu {
namespace {

// Whether indices below `count` (and the arithmetic that builds them from
// non-negative coordinates, each partial result at most the index) fit in
// int32.
bool FitsInt32(int64_t count) { return count <= INT32_MAX; }

// Launches kernel<int32_t> where every index fits (FitsInt32(largest), the
// element count of the kernel's largest array), else kernel<int64_t>, on
// Blocks(count) x kThreads, and checks the launch.
#define DLBATCH_LAUNCH_INDEXED(kernel, largest, count, stream, ...)         \
  do {                                                                      \
    if (FitsInt32(largest)) {                                               \
      kernel<int32_t><<<Blocks(count), kThreads, 0, stream>>>(__VA_ARGS__); \
    } else {                                                                \
      kernel<int64_t><<<Blocks(count), kThreads, 0, stream>>>(__VA_ARGS__); \
    }                                                                       \
    DLBATCH_CUDA_CHECK_LAUNCH(#kernel);                                     \
  } while (false)

template <typename Index>
__global__ void AddBiasRowsKernel(int64_t count, Divisor c,
                                  const float* __restrict__ bias,
                                  float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(i, count) {
    const Index j = static_cast<Index>(i);
    y[i] += bias[j - Quotient(j, c) * c.value];
  }
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

// The per-element arithmetic of the kernels below is gpu_elements.h's: one
// thread per output element, grid-stride.

template <typename Index>
__global__ void MaxPoolTiledForwardKernel(int64_t count, PoolGeometry g,
                                          const float* __restrict__ x,
                                          float* __restrict__ y,
                                          uint8_t* __restrict__ argmax) {
  DLBATCH_GRID_STRIDE(i, count) {
    const Pooled p = MaxPoolTiledAt(static_cast<Index>(i), g, x);
    y[i] = p.value;
    if (argmax != nullptr) argmax[i] = static_cast<uint8_t>(p.where);
  }
}

template <typename Index>
__global__ void MaxPoolTiledBackwardKernel(int64_t count, PoolGeometry g,
                                           const uint8_t* __restrict__ argmax,
                                           const float* __restrict__ dy,
                                           float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    dx[i] = MaxPoolTiledGradAt(static_cast<Index>(i), g, argmax, dy);
  }
}

// --- asymmetric padding ---

template <typename Index>
__global__ void PadNhwcKernel(int64_t count, PadGeometry g,
                              const float* __restrict__ x,
                              float* __restrict__ padded) {
  DLBATCH_GRID_STRIDE(i, count) {
    padded[i] = PaddedAt(static_cast<Index>(i), g, x);
  }
}

template <typename Index>
__global__ void CropNhwcKernel(int64_t count, PadGeometry g,
                               const float* __restrict__ padded,
                               float* __restrict__ x) {
  DLBATCH_GRID_STRIDE(i, count) {
    x[i] = CroppedAt(static_cast<Index>(i), g, padded);
  }
}

template <typename Index>
__global__ void UnfoldKernel(int64_t count, ConvGeometry g,
                             const float* __restrict__ x,
                             float* __restrict__ patches) {
  DLBATCH_GRID_STRIDE(i, count) {
    patches[i] = PatchAt(static_cast<Index>(i), g, x);
  }
}

template <typename Index>
__global__ void FoldKernel(int64_t count, ConvGeometry g,
                           const float* __restrict__ patches,
                           float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    dx[i] = FoldedAt(static_cast<Index>(i), g, patches);
  }
}

template <typename Index>
__global__ void SumPartsKernel(int64_t count, int parts,
                               const float* __restrict__ partial, bool add,
                               float* __restrict__ out) {
  DLBATCH_GRID_STRIDE(i, count) {
    const float sum = SumOfPartsAt(static_cast<Index>(i), parts,
                                   static_cast<Index>(count), partial);
    out[i] = add ? out[i] + sum : sum;
  }
}

template <typename Index>
__global__ void PoolPaddedForwardKernel(int64_t count, bool is_max,
                                        PoolGeometry g,
                                        const float* __restrict__ x,
                                        float* __restrict__ y,
                                        int32_t* __restrict__ argmax) {
  DLBATCH_GRID_STRIDE(i, count) {
    const Pooled p = PoolPaddedAt(static_cast<Index>(i), is_max, g, x);
    y[i] = p.value;
    if (is_max && argmax != nullptr) argmax[i] = p.where;
  }
}

template <typename Index>
__global__ void PoolPaddedBackwardKernel(int64_t count, bool is_max,
                                         PoolGeometry g,
                                         const int32_t* __restrict__ argmax,
                                         const float* __restrict__ dy,
                                         float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    dx[i] = PoolPaddedGradAt(static_cast<Index>(i), is_max, g, argmax, dy);
  }
}

template <typename Index>
__global__ void PrepareImagesKernel(int64_t count, int h, int w, int c,
                                    const uint8_t* __restrict__ pixels,
                                    const SamplePlacement* __restrict__ placed,
                                    const float* __restrict__ scale_bias,
                                    float* __restrict__ out) {
  DLBATCH_GRID_STRIDE(i, count) {
    out[i] =
        ImageAt(static_cast<Index>(i), h, w, c, pixels, placed, scale_bias);
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
  const int64_t count = rows * c;
  DLBATCH_LAUNCH_INDEXED(AddBiasRowsKernel, count, count, stream, count,
                         Divisor(c), bias, y);
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
  // Its indices reach into x, which is at least as large as y.
  DLBATCH_LAUNCH_INDEXED(
      MaxPoolTiledForwardKernel, int64_t{n} * h * w * c, count, stream, count,
      MakePoolGeometry(h, w, c, kh, kw, kh, kw, 0, 0, oh, ow), x, y, argmax);
}

void LaunchMaxPoolTiledBackward(cudaStream_t stream, int n, int h, int w, int c,
                                int kh, int kw, int oh, int ow,
                                const uint8_t* argmax, const float* dy,
                                float* dx) {
  const int64_t count = int64_t{n} * h * w * c;  // at least y's elements
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(
      MaxPoolTiledBackwardKernel, count, count, stream, count,
      MakePoolGeometry(h, w, c, kh, kw, kh, kw, 0, 0, oh, ow), argmax, dy, dx);
}

// --- asymmetric padding ---

void LaunchPadNhwc(cudaStream_t stream, int n, int h, int w, int c, int top,
                   int left, int ph, int pw, const float* x, float* padded) {
  const int64_t count = int64_t{n} * ph * pw * c;  // at least x's elements
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(PadNhwcKernel, count, count, stream, count,
                         PadGeometry{h, w, c, top, left, ph, pw}, x, padded);
}

void LaunchCropNhwc(cudaStream_t stream, int n, int h, int w, int c, int top,
                    int left, int ph, int pw, const float* padded, float* x) {
  const int64_t count = int64_t{n} * h * w * c;
  if (count <= 0) return;
  // Its indices reach into padded, the larger.
  DLBATCH_LAUNCH_INDEXED(CropNhwcKernel, int64_t{n} * ph * pw * c, count,
                         stream, count, PadGeometry{h, w, c, top, left, ph, pw},
                         padded, x);
}

void LaunchUnfold(cudaStream_t stream, int samples, const ConvGeometry& g,
                  const float* x, float* patches) {
  const int64_t count = int64_t{samples} * g.oh * g.ow * g.kh * g.kw * g.c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(UnfoldKernel,
                         std::max(count, int64_t{samples} * g.h * g.w * g.c),
                         count, stream, count, g, x, patches);
}

void LaunchFold(cudaStream_t stream, int samples, const ConvGeometry& g,
                const float* patches, float* dx) {
  const int64_t count = int64_t{samples} * g.h * g.w * g.c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(
      FoldKernel,
      std::max(count, int64_t{samples} * g.oh * g.ow * g.kh * g.kw * g.c),
      count, stream, count, g, patches, dx);
}

void LaunchSumParts(cudaStream_t stream, int parts, int64_t size,
                    const float* partial, bool add, float* out) {
  if (size <= 0) return;
  DLBATCH_LAUNCH_INDEXED(SumPartsKernel, size * parts, size, stream, size,
                         parts, partial, add, out);
}

void LaunchPoolPaddedForward(cudaStream_t stream, bool is_max, int n, int h,
                             int w, int c, int kh, int kw, int sh, int sw,
                             int top, int left, int oh, int ow, const float* x,
                             float* y, int32_t* argmax) {
  const int64_t count = int64_t{n} * oh * ow * c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(
      PoolPaddedForwardKernel, std::max(count, int64_t{n} * h * w * c), count,
      stream, count, is_max,
      MakePoolGeometry(h, w, c, kh, kw, sh, sw, top, left, oh, ow), x, y,
      argmax);
}

void LaunchPoolPaddedBackward(cudaStream_t stream, bool is_max, int n, int h,
                              int w, int c, int kh, int kw, int sh, int sw,
                              int top, int left, int oh, int ow,
                              const int32_t* argmax, const float* dy,
                              float* dx) {
  const int64_t count = int64_t{n} * h * w * c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(
      PoolPaddedBackwardKernel, std::max(count, int64_t{n} * oh * ow * c),
      count, stream, count, is_max,
      MakePoolGeometry(h, w, c, kh, kw, sh, sw, top, left, oh, ow), argmax, dy,
      dx);
}

// --- a batch's images from bytes ---

void LaunchPrepareImages(cudaStream_t stream, int n, int h, int w, int c,
                         const uint8_t* pixels,
                         const SamplePlacement* placements,
                         const float* scale_bias, float* out) {
  const int64_t count = int64_t{n} * h * w * c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(PrepareImagesKernel, count, count, stream, count, h, w,
                         c, pixels, placements, scale_bias, out);
}

}  // namespace dlbatch::trainer::gpu
