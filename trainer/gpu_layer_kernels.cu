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
//
// Kernels whose index arithmetic is a template parameter run it in int32
// where every index of their arrays fits (FitsInt32, decided by the
// launcher), else in int64. 64-bit division and modulo take many
// instructions: profiled on an H100 at int64, the bias add (57 us) and the
// tiled max-pool backward (124 us) spent most of their time on them. The
// grid-stride counter stays int64 (it may step past 2^31); only the index
// of an element, below the count, is narrowed. Results do not change.
//
// Sums add in a fixed order (per-thread runs, then a fixed tree, then the
// chunks in order), never with atomics: a step computes the same bits each
// time it runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "trainer/backend_cuda_grid.h"
#include "trainer/backend_cuda_launch.h"
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
#define DLBATCH_LAUNCH_INDEXED(kernel, largest, count, stream, ...)          \
  do {                                                                      \
    if (FitsInt32(largest)) {                                               \
      kernel<int32_t><<<Blocks(count), kThreads, 0, stream>>>(__VA_ARGS__); \
    } else {                                                                \
      kernel<int64_t><<<Blocks(count), kThreads, 0, stream>>>(__VA_ARGS__); \
    }                                                                       \
    DLBATCH_CUDA_CHECK_LAUNCH(#kernel);                                     \
  } while (false)

// Element j's coordinates in an NHWC array of h x w x c samples.
template <typename Index>
struct Nhwc {
  Index sample;
  int y, x, channel;
};
template <typename Index>
__device__ Nhwc<Index> Coordinates(Index j, int h, int w, int c) {
  Nhwc<Index> at;
  at.channel = static_cast<int>(j % c);
  Index rest = j / c;
  at.x = static_cast<int>(rest % w);
  rest /= w;
  at.y = static_cast<int>(rest % h);
  at.sample = rest / h;
  return at;
}

template <typename Index>
__global__ void AddBiasRowsKernel(int64_t count, int c,
                                  const float* __restrict__ bias,
                                  float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(i, count) { y[i] += bias[static_cast<Index>(i) % c]; }
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
template <typename Index>
__global__ void MaxPoolTiledForwardKernel(int64_t count, int h, int w, int c,
                                          int kh, int kw, int oh, int ow,
                                          const float* __restrict__ x,
                                          float* __restrict__ y,
                                          uint8_t* __restrict__ argmax) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, oy, ox, channel] =
        Coordinates(static_cast<Index>(i), oh, ow, c);
    const float* base =
        x + ((sample * h + Index{oy} * kh) * w + Index{ox} * kw) * c + channel;
    float best = base[0];
    int where = 0;
    for (int dy = 0; dy < kh; ++dy) {
      for (int dx = 0; dx < kw; ++dx) {
        const float v = base[(Index{dy} * w + dx) * c];
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
template <typename Index>
__global__ void MaxPoolTiledBackwardKernel(int64_t count, int h, int w, int c,
                                           int kh, int kw, int oh, int ow,
                                           const uint8_t* __restrict__ argmax,
                                           const float* __restrict__ dy,
                                           float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, iy, ix, channel] =
        Coordinates(static_cast<Index>(i), h, w, c);
    const int oy = iy / kh, ox = ix / kw;
    float g = 0;
    if (oy < oh && ox < ow) {
      const Index o = ((sample * oh + oy) * ow + ox) * c + channel;
      if (argmax[o] == (iy - oy * kh) * kw + (ix - ox * kw)) g = dy[o];
    }
    dx[i] = g;
  }
}

// --- asymmetric padding ---

// One thread per element of padded (n, ph, pw, c): x's (n, h, w, c) element
// at (py - top, px - left) where that lies inside x, else 0.
template <typename Index>
__global__ void PadNhwcKernel(int64_t count, int h, int w, int c, int top,
                              int left, int ph, int pw,
                              const float* __restrict__ x,
                              float* __restrict__ padded) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, py, px, channel] =
        Coordinates(static_cast<Index>(i), ph, pw, c);
    const int iy = py - top, ix = px - left;
    float v = 0;
    if (iy >= 0 && iy < h && ix >= 0 && ix < w) {
      v = x[((sample * h + iy) * w + ix) * c + channel];
    }
    padded[i] = v;
  }
}

// One thread per element of x (n, h, w, c): the padded element at
// (iy + top, ix + left).
template <typename Index>
__global__ void CropNhwcKernel(int64_t count, int h, int w, int c, int top,
                               int left, int ph, int pw,
                               const float* __restrict__ padded,
                               float* __restrict__ x) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, iy, ix, channel] =
        Coordinates(static_cast<Index>(i), h, w, c);
    x[i] = padded[((sample * ph + iy + top) * pw + ix + left) * c + channel];
  }
}

// The input elements of a window along one dimension: [begin, end) of
// [start, start + k) clipped to [0, size).
struct Span {
  int begin, end;
};
__device__ Span Clip(int start, int k, int size) {
  return Span{std::max(start, 0), std::min(start + k, size)};
}

// One thread per output element (n, oy, ox, channel) of a pooling whose
// window starts at (oy * sh - top, ox * sw - left): max or average over the
// window's elements inside the input. Max records the first maximum in
// window order (row-major) as its position in the window, as the CPU
// backend picks, where `argmax` is not null; a window with no element
// inside (which `same` padding never makes) gives 0 and position -1.
template <typename Index>
__global__ void PoolPaddedForwardKernel(int64_t count, bool is_max, int h,
                                        int w, int c, int kh, int kw, int sh,
                                        int sw, int top, int left, int oh,
                                        int ow, const float* __restrict__ x,
                                        float* __restrict__ y,
                                        int32_t* __restrict__ argmax) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, oy, ox, channel] =
        Coordinates(static_cast<Index>(i), oh, ow, c);
    const int y0 = oy * sh - top, x0 = ox * sw - left;
    const Span rows = Clip(y0, kh, h), cols = Clip(x0, kw, w);
    const float* plane = x + sample * h * w * c + channel;
    float result = 0;
    if (is_max) {
      int where = -1;
      for (int iy = rows.begin; iy < rows.end; ++iy) {
        for (int ix = cols.begin; ix < cols.end; ++ix) {
          const float v = plane[(Index{iy} * w + ix) * c];
          if (where < 0 || v > result) {
            result = v;
            where = (iy - y0) * kw + (ix - x0);
          }
        }
      }
      if (argmax != nullptr) argmax[i] = where;
    } else {
      float sum = 0;
      for (int iy = rows.begin; iy < rows.end; ++iy) {
        for (int ix = cols.begin; ix < cols.end; ++ix) {
          sum += plane[(Index{iy} * w + ix) * c];
        }
      }
      const int elements = (rows.end - rows.begin) * (cols.end - cols.begin);
      if (elements > 0) result = sum / static_cast<float>(elements);
    }
    y[i] = result;
  }
}

// One thread per input element (n, iy, ix, channel): the sum, over the
// windows that contain it (in order of oy, then ox), of the window's
// gradient where it is the window's recorded argmax (max) or of the
// gradient divided by the window's elements inside the input (average).
template <typename Index>
__global__ void PoolPaddedBackwardKernel(int64_t count, bool is_max, int h,
                                         int w, int c, int kh, int kw, int sh,
                                         int sw, int top, int left, int oh,
                                         int ow,
                                         const int32_t* __restrict__ argmax,
                                         const float* __restrict__ dy,
                                         float* __restrict__ dx) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, iy, ix, channel] =
        Coordinates(static_cast<Index>(i), h, w, c);
    // In padded coordinates (>= 0), window oy covers [oy * sh, oy * sh +
    // kh): it contains py where oy * sh <= py <= oy * sh + kh - 1.
    const int py = iy + top, px = ix + left;
    const int oy_begin = py >= kh ? (py - kh) / sh + 1 : 0;
    const int ox_begin = px >= kw ? (px - kw) / sw + 1 : 0;
    const int oy_last = std::min(py / sh, oh - 1);
    const int ox_last = std::min(px / sw, ow - 1);
    float g = 0;
    for (int oy = oy_begin; oy <= oy_last; ++oy) {
      for (int ox = ox_begin; ox <= ox_last; ++ox) {
        const Index o = ((sample * oh + oy) * ow + ox) * c + channel;
        if (is_max) {
          if (argmax[o] == (py - oy * sh) * kw + (px - ox * sw)) g += dy[o];
        } else {
          const Span rows = Clip(oy * sh - top, kh, h);
          const Span cols = Clip(ox * sw - left, kw, w);
          const int elements =
              (rows.end - rows.begin) * (cols.end - cols.begin);
          g += dy[o] / static_cast<float>(elements);
        }
      }
    }
    dx[i] = g;
  }
}

// One thread per output value (sample, y, x, channel): the source byte
// SourceAt names, times the channel's scale plus its bias (rounded after
// each, as the host's loader computes it: no fused multiply-add), or the
// bias where the position is fill. Null placements: every sample as it is.
template <typename Index>
__global__ void PrepareImagesKernel(int64_t count, int h, int w, int c,
                                    const uint8_t* __restrict__ pixels,
                                    const SamplePlacement* __restrict__ placed,
                                    const float* __restrict__ scale_bias,
                                    float* __restrict__ out) {
  DLBATCH_GRID_STRIDE(i, count) {
    const auto [sample, y, x, channel] =
        Coordinates(static_cast<Index>(i), h, w, c);
    const float bias = scale_bias[c + channel];
    int sy = y, sx = x;
    if (placed != nullptr) {
      sy = SourceAt(placed[sample].y, y, h);
      sx = SourceAt(placed[sample].x, x, w);
      if (sy < 0 || sx < 0) {
        out[i] = bias;
        continue;
      }
    }
    const float v = pixels[((sample * h + sy) * w + sx) * c + channel];
    out[i] = __fadd_rn(__fmul_rn(v, scale_bias[channel]), bias);
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
  DLBATCH_LAUNCH_INDEXED(AddBiasRowsKernel, count, count, stream, count, c,
                         bias, y);
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
  DLBATCH_LAUNCH_INDEXED(MaxPoolTiledForwardKernel, int64_t{n} * h * w * c,
                         count, stream, count, h, w, c, kh, kw, oh, ow, x, y,
                         argmax);
}

void LaunchMaxPoolTiledBackward(cudaStream_t stream, int n, int h, int w, int c,
                                int kh, int kw, int oh, int ow,
                                const uint8_t* argmax, const float* dy,
                                float* dx) {
  const int64_t count = int64_t{n} * h * w * c;  // at least y's elements
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(MaxPoolTiledBackwardKernel, count, count, stream,
                         count, h, w, c, kh, kw, oh, ow, argmax, dy, dx);
}

// --- asymmetric padding ---

void LaunchPadNhwc(cudaStream_t stream, int n, int h, int w, int c, int top,
                   int left, int ph, int pw, const float* x, float* padded) {
  const int64_t count = int64_t{n} * ph * pw * c;  // at least x's elements
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(PadNhwcKernel, count, count, stream, count, h, w, c,
                         top, left, ph, pw, x, padded);
}

void LaunchCropNhwc(cudaStream_t stream, int n, int h, int w, int c, int top,
                    int left, int ph, int pw, const float* padded, float* x) {
  const int64_t count = int64_t{n} * h * w * c;
  if (count <= 0) return;
  // Its indices reach into padded, the larger.
  DLBATCH_LAUNCH_INDEXED(CropNhwcKernel, int64_t{n} * ph * pw * c, count,
                         stream, count, h, w, c, top, left, ph, pw, padded, x);
}

void LaunchPoolPaddedForward(cudaStream_t stream, bool is_max, int n, int h,
                             int w, int c, int kh, int kw, int sh, int sw,
                             int top, int left, int oh, int ow, const float* x,
                             float* y, int32_t* argmax) {
  const int64_t count = int64_t{n} * oh * ow * c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(PoolPaddedForwardKernel,
                         std::max(count, int64_t{n} * h * w * c), count, stream,
                         count, is_max, h, w, c, kh, kw, sh, sw, top, left, oh,
                         ow, x, y, argmax);
}

void LaunchPoolPaddedBackward(cudaStream_t stream, bool is_max, int n, int h,
                              int w, int c, int kh, int kw, int sh, int sw,
                              int top, int left, int oh, int ow,
                              const int32_t* argmax, const float* dy,
                              float* dx) {
  const int64_t count = int64_t{n} * h * w * c;
  if (count <= 0) return;
  DLBATCH_LAUNCH_INDEXED(PoolPaddedBackwardKernel,
                         std::max(count, int64_t{n} * oh * ow * c), count,
                         stream, count, is_max, h, w, c, kh, kw, sh, sw, top,
                         left, oh, ow, argmax, dy, dx);
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
