// What one thread of the GPU backend's grid-stride layer kernels
// (gpu_layer_kernels.cu) computes: element i of the kernel's output. Plain
// C++ that nvcc compiles for the device and the host compiler for the host,
// so that gpu_elements_test runs the kernels' own index arithmetic and
// rounding (at int32 and int64 indices) against the CPU backend on machines
// without a GPU. The launches themselves, streams and graphs, still need a
// GPU (gpu_backend_test).
//
// Index: the type element indices are computed in (int32_t where every
// index of the kernel's arrays fits, else int64_t; the launcher decides).
// REQUIRES: 0 <= i < the output's elements; the pointers cover the arrays
// the geometry describes.
#ifndef DLBATCH_TRAINER_CUDA_GPU_ELEMENTS_H_
#define DLBATCH_TRAINER_CUDA_GPU_ELEMENTS_H_

#include <algorithm>
#include <cstdint>

#include "trainer/placement.h"  // DLBATCH_HOST_DEVICE, SamplePlacement

namespace dlbatch::trainer::gpu {

// Element j's coordinates in an NHWC array of h x w x c samples.
template <typename Index>
struct Nhwc {
  Index sample;
  int y, x, channel;
};
template <typename Index>
DLBATCH_HOST_DEVICE Nhwc<Index> Coordinates(Index j, int h, int w, int c) {
  Nhwc<Index> at;
  at.channel = static_cast<int>(j % c);
  Index rest = j / c;
  at.x = static_cast<int>(rest % w);
  rest /= w;
  at.y = static_cast<int>(rest % h);
  at.sample = rest / h;
  return at;
}

// Division of an index in [0, 2^31) by a fixed divisor in [1, 2^31) as one
// wide multiply and a shift (Granlund and Montgomery, "Division by
// invariant integers using multiplication", 1994, theorem 4.2 with N = 31:
// m = ceil(2^(31+l) / d), l = ceil(log2 d), so m < 2^32). A GPU divides
// an int32 in about twenty instructions, and these kernels divide several
// times per element.
struct Divisor {
  int value = 1;
  uint32_t magic = 0x80000000u;
  int shift = 31;

  Divisor() = default;
  // d < 1 (a geometry with an empty side, whose kernels launch nothing)
  // keeps the multiply of 1.
  explicit Divisor(int d) : value(d) {
    if (d < 1) return;
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    magic = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    shift = 31 + l;
  }
  // n / value, for 0 <= n < 2^31.
  DLBATCH_HOST_DEVICE int Of(int n) const {
    return static_cast<int>(
        (static_cast<uint64_t>(magic) * static_cast<uint32_t>(n)) >> shift);
  }
};

// n / d for a non-negative index: by the multiply where Index is 32-bit.
template <typename Index>
DLBATCH_HOST_DEVICE Index Quotient(Index n, const Divisor& d) {
  if constexpr (sizeof(Index) == 4) {
    return d.Of(n);
  } else {
    return n / d.value;
  }
}

// Coordinates by divisors: the same, dividing by multiplying where Index
// is 32-bit.
template <typename Index>
DLBATCH_HOST_DEVICE Nhwc<Index> Coordinates(Index j, const Divisor& h,
                                            const Divisor& w,
                                            const Divisor& c) {
  Nhwc<Index> at;
  const Index pixel = Quotient(j, c);
  at.channel = static_cast<int>(j - pixel * c.value);
  const Index line = Quotient(pixel, w);
  at.x = static_cast<int>(pixel - line * w.value);
  at.sample = Quotient(line, h);
  at.y = static_cast<int>(line - at.sample * h.value);
  return at;
}

// a * b and a + b, each rounded to nearest (never fused into one
// multiply-add, on the device as on the host: the host's loader rounds
// both, and files that call these on the host build with
// -ffp-contract=off).
DLBATCH_HOST_DEVICE inline float MulRounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DLBATCH_HOST_DEVICE inline float AddRounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// A pooling window over NHWC samples of h x w x c: kh x kw, moved by
// (sh, sw), the first one starting at (-top, -left); the output is
// oh x ow x c. Tiled pooling: sh = kh, sw = kw, no padding.
// MakePoolGeometry fills in the divisors.
struct PoolGeometry {
  int h, w, c, kh, kw, sh, sw, top, left, oh, ow;
  Divisor by_h, by_w, by_c, by_kh, by_kw, by_sh, by_sw, by_oh, by_ow;
};
inline PoolGeometry MakePoolGeometry(int h, int w, int c, int kh, int kw,
                                     int sh, int sw, int top, int left, int oh,
                                     int ow) {
  return PoolGeometry{h,           w,           c,           kh,
                      kw,          sh,          sw,          top,
                      left,        oh,          ow,          Divisor(h),
                      Divisor(w),  Divisor(c),  Divisor(kh), Divisor(kw),
                      Divisor(sh), Divisor(sw), Divisor(oh), Divisor(ow)};
}

// A window's result: its value and, for max pooling, the position of the
// first maximum in window order (row-major, as the CPU backend picks).
struct Pooled {
  float value;
  int where;
};

// Tiled max pooling, output element i.
template <typename Index>
DLBATCH_HOST_DEVICE Pooled MaxPoolTiledAt(Index i, const PoolGeometry& g,
                                          const float* x) {
  const auto [sample, oy, ox, channel] =
      Coordinates(i, g.by_oh, g.by_ow, g.by_c);
  const float* base =
      x + ((sample * g.h + Index{oy} * g.kh) * g.w + Index{ox} * g.kw) * g.c +
      channel;
  Pooled best{base[0], 0};
  for (int dy = 0; dy < g.kh; ++dy) {
    for (int dx = 0; dx < g.kw; ++dx) {
      const float v = base[(Index{dy} * g.w + dx) * g.c];
      if (v > best.value) best = Pooled{v, dy * g.kw + dx};
    }
  }
  return best;
}

// Tiled max pooling's input gradient, element i: the output's gradient
// where i was its window's argmax, else 0 (also in rows and columns no
// window covers).
template <typename Index>
DLBATCH_HOST_DEVICE float MaxPoolTiledGradAt(Index i, const PoolGeometry& g,
                                             const uint8_t* argmax,
                                             const float* dy) {
  const auto [sample, iy, ix, channel] = Coordinates(i, g.by_h, g.by_w, g.by_c);
  const int oy = Quotient(iy, g.by_kh), ox = Quotient(ix, g.by_kw);
  if (oy >= g.oh || ox >= g.ow) return 0;
  const Index o = ((sample * g.oh + oy) * g.ow + ox) * g.c + channel;
  return argmax[o] == (iy - oy * g.kh) * g.kw + (ix - ox * g.kw) ? dy[o] : 0;
}

// The input elements of a window along one dimension: [begin, end) of
// [start, start + k) clipped to [0, size).
struct Span {
  int begin, end;
};
DLBATCH_HOST_DEVICE inline Span Clip(int start, int k, int size) {
  return Span{std::max(start, 0), std::min(start + k, size)};
}

// The windows along one dimension that contain padded position p (>= 0),
// of `count` windows k wide moved by `stride`: window o covers
// [o * stride, o * stride + k), so those with p - k < o * stride <= p, as
// the span [begin, end).
DLBATCH_HOST_DEVICE inline Span Covering(int p, int k, const Divisor& stride,
                                         int count) {
  return Span{p >= k ? Quotient(p - k, stride) + 1 : 0,
              std::min(Quotient(p, stride), count - 1) + 1};
}

// Padded pooling (max or average over the window's elements inside the
// input), output element i. A window with no element inside (which `same`
// padding never makes) gives 0 and position -1.
template <typename Index>
DLBATCH_HOST_DEVICE Pooled PoolPaddedAt(Index i, bool is_max,
                                        const PoolGeometry& g, const float* x) {
  const auto [sample, oy, ox, channel] =
      Coordinates(i, g.by_oh, g.by_ow, g.by_c);
  const int y0 = oy * g.sh - g.top, x0 = ox * g.sw - g.left;
  const Span rows = Clip(y0, g.kh, g.h), cols = Clip(x0, g.kw, g.w);
  const float* plane = x + sample * g.h * g.w * g.c + channel;
  if (is_max) {
    Pooled best{0, -1};
    for (int iy = rows.begin; iy < rows.end; ++iy) {
      for (int ix = cols.begin; ix < cols.end; ++ix) {
        const float v = plane[(Index{iy} * g.w + ix) * g.c];
        if (best.where < 0 || v > best.value) {
          best = Pooled{v, (iy - y0) * g.kw + (ix - x0)};
        }
      }
    }
    return best;
  }
  float sum = 0;
  for (int iy = rows.begin; iy < rows.end; ++iy) {
    for (int ix = cols.begin; ix < cols.end; ++ix) {
      sum += plane[(Index{iy} * g.w + ix) * g.c];
    }
  }
  const int elements = (rows.end - rows.begin) * (cols.end - cols.begin);
  return Pooled{elements > 0 ? sum / static_cast<float>(elements) : 0, -1};
}

// Padded pooling's input gradient, element i: the sum, over the windows
// that contain it (in order of oy, then ox), of the window's gradient where
// i is the window's recorded argmax (max) or of the gradient divided by the
// window's elements inside the input (average).
template <typename Index>
DLBATCH_HOST_DEVICE float PoolPaddedGradAt(Index i, bool is_max,
                                           const PoolGeometry& g,
                                           const int32_t* argmax,
                                           const float* dy) {
  const auto [sample, iy, ix, channel] = Coordinates(i, g.by_h, g.by_w, g.by_c);
  const int py = iy + g.top, px = ix + g.left;  // padded coordinates
  const Span oys = Covering(py, g.kh, g.by_sh, g.oh);
  const Span oxs = Covering(px, g.kw, g.by_sw, g.ow);
  float sum = 0;
  for (int oy = oys.begin; oy < oys.end; ++oy) {
    for (int ox = oxs.begin; ox < oxs.end; ++ox) {
      const Index o = ((sample * g.oh + oy) * g.ow + ox) * g.c + channel;
      if (is_max) {
        if (argmax[o] == (py - oy * g.sh) * g.kw + (px - ox * g.sw)) {
          sum += dy[o];
        }
      } else {
        const Span rows = Clip(oy * g.sh - g.top, g.kh, g.h);
        const Span cols = Clip(ox * g.sw - g.left, g.kw, g.w);
        const int elements = (rows.end - rows.begin) * (cols.end - cols.begin);
        sum += dy[o] / static_cast<float>(elements);
      }
    }
  }
  return sum;
}

// Element (sample, iy, ix, channel) of NHWC samples of h x w x c, or 0
// where (iy, ix) lies outside them.
template <typename Index>
DLBATCH_HOST_DEVICE float ElementOrZero(const float* x, Index sample, int iy,
                                        int ix, int channel, int h, int w,
                                        int c) {
  if (iy < 0 || iy >= h || ix < 0 || ix >= w) return 0;
  return x[((sample * h + iy) * w + ix) * c + channel];
}

// A zero-padded copy of NHWC samples of h x w x c, ph x pw x c each, the
// samples' (0, 0) at (top, left).
struct PadGeometry {
  int h, w, c, top, left, ph, pw;
};

// The padded copy's element i: x's element at (py - top, px - left) where
// that lies inside x, else 0.
template <typename Index>
DLBATCH_HOST_DEVICE float PaddedAt(Index i, const PadGeometry& g,
                                   const float* x) {
  const auto [sample, py, px, channel] = Coordinates(i, g.ph, g.pw, g.c);
  return ElementOrZero(x, sample, py - g.top, px - g.left, channel, g.h, g.w,
                       g.c);
}

// The crop of a padded copy back to x's shape, element i.
template <typename Index>
DLBATCH_HOST_DEVICE float CroppedAt(Index i, const PadGeometry& g,
                                    const float* padded) {
  const auto [sample, iy, ix, channel] = Coordinates(i, g.h, g.w, g.c);
  return padded[((sample * g.ph + iy + g.top) * g.pw + ix + g.left) * g.c +
                channel];
}

// A convolution lowered to matrix products (trainer/cuda/conv_lowering.h): NHWC
// samples of h x w x c, kh x kw windows moved by (sh, sw), the first at
// (-top, -left), an output of oh x ow. A sample's patches are a row-major
// matrix of oh * ow rows (the output positions, row-major) by kh * kw * c
// columns, column (ky * kw + kx) * c + channel: the filters' OHWI order.
// The window's geometry is a pooling's (kh x kw over c channels).
struct ConvGeometry : PoolGeometry {
  Divisor by_columns;  // kh * kw * c
};
inline ConvGeometry MakeConvGeometry(int h, int w, int c, int kh, int kw,
                                     int sh, int sw, int top, int left, int oh,
                                     int ow) {
  return ConvGeometry{
      MakePoolGeometry(h, w, c, kh, kw, sh, sw, top, left, oh, ow),
      Divisor(kh * kw * c)};
}

// The patches of the samples of x, element i: x's element under window
// position (ky, kx) of output position (oy, ox), or 0 in the padding.
template <typename Index>
DLBATCH_HOST_DEVICE float PatchAt(Index i, const ConvGeometry& g,
                                  const float* x) {
  const int columns = g.kh * g.kw * g.c;
  const Index row = Quotient(i, g.by_columns);
  const int column = static_cast<int>(i - row * columns);
  const int tap = Quotient(column, g.by_c);
  const int channel = column - tap * g.c;
  const int ky = Quotient(tap, g.by_kw);
  const int kx = tap - ky * g.kw;
  const Index rest = Quotient(row, g.by_ow);
  const int ox = static_cast<int>(row - rest * g.ow);
  const Index sample = Quotient(rest, g.by_oh);
  const int oy = static_cast<int>(rest - sample * g.oh);
  return ElementOrZero(x, sample, oy * g.sh - g.top + ky,
                       ox * g.sw - g.left + kx, channel, g.h, g.w, g.c);
}

// The input gradient from the patches' gradient, element i (NHWC): the sum
// of the patch elements that hold x's element i (PatchAt's inverse), in
// order of oy, then ox, over the windows that cover it.
template <typename Index>
DLBATCH_HOST_DEVICE float FoldedAt(Index i, const ConvGeometry& g,
                                   const float* patches) {
  const auto [sample, iy, ix, channel] = Coordinates(i, g.by_h, g.by_w, g.by_c);
  const int py = iy + g.top, px = ix + g.left;  // padded coordinates
  const Span oys = Covering(py, g.kh, g.by_sh, g.oh);
  const Span oxs = Covering(px, g.kw, g.by_sw, g.ow);
  const int columns = g.kh * g.kw * g.c;
  float sum = 0;
  for (int oy = oys.begin; oy < oys.end; ++oy) {
    const int ky = py - oy * g.sh;
    for (int ox = oxs.begin; ox < oxs.end; ++ox) {
      const int kx = px - ox * g.sw;
      sum += patches[((sample * g.oh + oy) * g.ow + ox) * columns +
                     (ky * g.kw + kx) * g.c + channel];
    }
  }
  return sum;
}

// Element i of the sum of `parts` arrays of `size` elements laid one after
// another in `partial`, added in the parts' order.
template <typename Index>
DLBATCH_HOST_DEVICE float SumOfPartsAt(Index i, int parts, Index size,
                                       const float* partial) {
  float sum = 0;
  for (int g = 0; g < parts; ++g) sum += partial[g * size + i];
  return sum;
}

// A batch's image element i (NHWC samples of h x w x c) from the data set's
// bytes: the byte the sample's placement names (placed may be null: every
// sample as it is), times the channel's scale plus its bias, or the bias
// where the position is fill. scale_bias: c scales, then c biases
// (ScaleAndBias in data.h).
template <typename Index>
DLBATCH_HOST_DEVICE float ImageAt(Index i, int h, int w, int c,
                                  const uint8_t* pixels,
                                  const SamplePlacement* placed,
                                  const float* scale_bias) {
  const auto [sample, y, x, channel] = Coordinates(i, h, w, c);
  int sy = y, sx = x;
  if (placed != nullptr) {
    sy = SourceAt(placed[sample].y, y, h);
    sx = SourceAt(placed[sample].x, x, w);
    if (sy < 0 || sx < 0) return scale_bias[c + channel];
  }
  const float v = pixels[((sample * h + sy) * w + sx) * c + channel];
  return AddRounded(MulRounded(v, scale_bias[channel]),
                    scale_bias[c + channel]);
}

// --- mixed precision: the casts to and from bf16/fp16 copies
// (gpu_cast_kernels.cu, gpu_conv_low.cc, gpu_fc.cc) ---

// A float32 NHWC array of samples h x w x c and its low-precision copy of
// samples ph x pw x pc (pc >= c, ph >= h + top, pw >= w + left), where the
// float sample sits at (top, left): a zero border, zero channels c..pc.
struct CastGeometry {
  int h, w, c;
  int ph, pw, pc;
  int top = 0, left = 0;
};

// The element of x (n samples) that element i of the copy holds, or -1
// where it holds a zero (the border, channels from c, samples from n).
template <typename Index>
DLBATCH_HOST_DEVICE Index CastSource(Index i, const CastGeometry& g, int n) {
  const auto [sample, py, px, channel] = Coordinates(i, g.ph, g.pw, g.pc);
  const int iy = py - g.top, ix = px - g.left;
  if (sample >= n || channel >= g.c || iy < 0 || iy >= g.h || ix < 0 ||
      ix >= g.w) {
    return -1;
  }
  return ((sample * g.h + iy) * g.w + ix) * g.c + channel;
}

// The element of the copy that element i of the float array (samples of
// h x w x c) is cast back from: the crop of the border and the padded
// channels.
template <typename Index>
DLBATCH_HOST_DEVICE Index CastBackSource(Index i, const CastGeometry& g) {
  const auto [sample, iy, ix, channel] = Coordinates(i, g.h, g.w, g.c);
  return ((sample * g.ph + iy + g.top) * g.pw + ix + g.left) * g.pc + channel;
}

}  // namespace dlbatch::trainer::gpu

#endif  // DLBATCH_TRAINER_CUDA_GPU_ELEMENTS_H_
