// Element-wise loops of the CPU backend: activations, dropout, softmax
// cross-entropy and the solvers. Plain loops the compiler vectorises, split
// across the OpenMP team where the count makes that pay.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "trainer/cpu/backend_cpu_internal.h"
#include "trainer/rng.h"

namespace dlbatch::trainer::cpu {
namespace {

// Below this many elements a loop runs on the calling thread alone: waking
// the team costs more than it saves. The element-wise loops' `if` names
// `parallel:`, so that only the team is left out: an `if` without a name
// on `parallel for simd` applies to its simd part as well (OpenMP 5.0), and
// GCC then ran every loop under this size one element at a time (LeNet's
// relu on its 64 x 500 fc output was a scalar loop branching on each sign,
// about 60 us a call where the vector loop takes a few).
constexpr int64_t kParallelMin = 1 << 15;

bool Team(int64_t count) { return count > kParallelMin; }

}  // namespace

// The selects below are vector blends because this file is built with
// -fno-trapping-math (trainer/CMakeLists.txt): with traps kept, GCC may not
// run the multiply on the other side speculatively and leaves a scalar loop
// that branches on each element's sign, mispredicted half the time on a
// relu's inputs (9.6% of a small ResNet's samples on two cores before).
void ActivationForward(float alpha, int64_t count, const float* x, float* y) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    const float scaled = alpha * v;
    y[i] = v > 0 ? v : scaled;
  }
}

void ActivationBackward(float alpha, int64_t count, const float* x,
                        const float* dy, float* dx) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) {
    const float g = dy[i];
    const float scaled = alpha * g;
    dx[i] = x[i] > 0 ? g : scaled;
  }
}

// Phi(x) and x * phi(x) in double, rounded once: the reference the GPU's
// float kernels are held to.
void GeluForward(int64_t count, const float* x, float* y) {
#pragma omp parallel for schedule(static) if (count > kParallelMin / 8)
  for (int64_t i = 0; i < count; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * M_SQRT1_2)));
  }
}

void GeluBackward(int64_t count, const float* x, const float* dy, float* dx) {
  // d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
  constexpr double kInvSqrt2Pi = 0.3989422804014327;
#pragma omp parallel for schedule(static) if (count > kParallelMin / 8)
  for (int64_t i = 0; i < count; ++i) {
    const double v = x[i];
    const double cdf = 0.5 * (1.0 + std::erf(v * M_SQRT1_2));
    const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
    dx[i] = static_cast<float>(dy[i] * (cdf + v * pdf));
  }
}

void Add(int64_t count, const float* a, const float* b, float* out) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void AddActivation(float alpha, int64_t count, const float* a, const float* b,
                   float* out) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) {
    const float v = a[i] + b[i];
    const float scaled = alpha * v;
    out[i] = v > 0 ? v : scaled;
  }
}

namespace {

float FromBf16(uint16_t v) {
  const uint32_t bits = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even; a NaN stays a (quiet) NaN.
uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffff) > 0x7f800000) return (bits >> 16) | 0x40;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

void AddBf16(bool relu, int64_t count, const float* a, const uint16_t* b16,
             float* out) {
  if (relu) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
    for (int64_t i = 0; i < count; ++i) {
      const float v = a[i] + FromBf16(b16[i]);
      out[i] = v > 0 ? v : 0.0f * v;
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
    for (int64_t i = 0; i < count; ++i) out[i] = a[i] + FromBf16(b16[i]);
  }
}

// The loops of a split batch's batch norm run on one thread each: built
// for AVX-512 and AVX2 as well where the compiler can, picked at load time
// (the rest of this file is baseline x86-64: 4 floats a vector).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DLBATCH_WIDE_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define DLBATCH_WIDE_CLONES
#endif

namespace {

// ChannelSums over x of one type (`load(i)` reads element i as float).
template <typename Load>
__attribute__((always_inline)) inline void SumChannels(int64_t rows, int c,
                                                       const float* shift,
                                                       float* sums,
                                                       const Load& load) {
  // Rows are summed in float over blocks of 64, and the blocks in double:
  // each channel's total over a batch's positions loses no more than a
  // float sum of 64.
  std::vector<double> total(2 * c, 0.0);
  std::vector<float> s1(c), s2(c);
  for (int64_t first = 0; first < rows; first += 64) {
    const int64_t end = std::min<int64_t>(rows, first + 64);
    std::fill(s1.begin(), s1.end(), 0.0f);
    std::fill(s2.begin(), s2.end(), 0.0f);
    for (int64_t r = first; r < end; ++r) {
#pragma omp simd
      for (int ch = 0; ch < c; ++ch) {
        const float d = load(r * c + ch) - shift[ch];
        s1[ch] += d;
        s2[ch] += d * d;
      }
    }
    for (int ch = 0; ch < c; ++ch) {
      total[ch] += s1[ch];
      total[c + ch] += s2[ch];
    }
  }
  for (int ch = 0; ch < 2 * c; ++ch) sums[ch] = static_cast<float>(total[ch]);
}

}  // namespace

DLBATCH_WIDE_CLONES
void ChannelSums(int64_t rows, int c, const void* x, bool bf16,
                 const float* shift, float* sums) {
  if (bf16) {
    const auto* x16 = static_cast<const uint16_t*>(x);
    SumChannels(rows, c, shift, sums,
                [x16](int64_t i) { return FromBf16(x16[i]); });
  } else {
    const auto* x32 = static_cast<const float*>(x);
    SumChannels(rows, c, shift, sums, [x32](int64_t i) { return x32[i]; });
  }
}

DLBATCH_WIDE_CLONES
void ChannelAffineAdd(int64_t rows, int c, const void* x, bool bf16,
                      const float* a, const float* b, void* dx) {
  // dx[i] = put(get(dx, i) + a + b * get(x, i)) over one element type.
  const auto add = [&](auto* d, const auto* in, auto get, auto put) {
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (int ch = 0; ch < c; ++ch) {
        const int64_t i = r * c + ch;
        d[i] = put(get(d[i]) + (a[ch] + b[ch] * get(in[i])));
      }
    }
  };
  if (bf16) {
    add(
        static_cast<uint16_t*>(dx), static_cast<const uint16_t*>(x),
        [](uint16_t v) { return FromBf16(v); },
        [](float v) { return ToBf16(v); });
  } else {
    add(
        static_cast<float*>(dx), static_cast<const float*>(x),
        [](float v) { return v; }, [](float v) { return v; });
  }
}

void GradientToBf16(int64_t count, const float* y, const float* g,
                    uint16_t* out16) {
  if (y != nullptr) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
    for (int64_t i = 0; i < count; ++i) {
      out16[i] = ToBf16(y[i] > 0 ? g[i] : 0.0f * g[i]);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
    for (int64_t i = 0; i < count; ++i) out16[i] = ToBf16(g[i]);
  }
}

void CopyStrided(int64_t rows, int64_t cols, const float* src,
                 int64_t src_stride, float* dst, int64_t dst_stride) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride,
                static_cast<size_t>(cols) * sizeof(float));
  }
}

void DropoutForward(float p, uint64_t seed, int64_t count, const float* x,
                    float* mask, float* y) {
  const float keep = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (count > kParallelMin / 8)
  for (int64_t i = 0; i < count; ++i) {
    const float m = UniformAt(seed, static_cast<uint64_t>(i)) >= p ? keep : 0;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

void Multiply(int64_t count, const float* a, const float* b, float* out) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] * b[i];
}

void Fill(float* x, int64_t count, float value) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) x[i] = value;
}

void Scale(int64_t count, float alpha, float* x) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(count))
  for (int64_t i = 0; i < count; ++i) x[i] *= alpha;
}

void PrepareImages(int n, const Shape& shape, const uint8_t* pixels,
                   const SamplePlacement* placements, const float* scale_bias,
                   float* out) {
  const int h = shape.h, w = shape.w, c = shape.c;
  const float* scale = scale_bias;
  const float* bias = scale_bias + c;
#pragma omp parallel for schedule(static) if (int64_t{n} * shape.size() > \
                                              kParallelMin)
  for (int i = 0; i < n; ++i) {
    const uint8_t* src = pixels + i * shape.size();
    float* dst = out + i * shape.size();
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x, dst += c) {
        const int sy = placements ? SourceAt(placements[i].y, y, h) : y;
        const int sx = placements ? SourceAt(placements[i].x, x, w) : x;
        if (sy < 0 || sx < 0) {
          for (int k = 0; k < c; ++k) dst[k] = bias[k];
          continue;
        }
        const uint8_t* v = src + (int64_t{sy} * w + sx) * c;
        for (int k = 0; k < c; ++k) {
          const float scaled = static_cast<float>(v[k]) * scale[k];
          dst[k] = scaled + bias[k];
        }
      }
    }
  }
}

double SumSquares(int64_t count, const float* x) {
  double sum = 0;
  // The `if` here applies to the simd part too: below the size, the sum is
  // made in element order, as it always was.
#pragma omp parallel for simd schedule(static) reduction(+ : sum) \
    if (count > kParallelMin)
  for (int64_t i = 0; i < count; ++i) {
    const double v = x[i];
    sum += v * v;
  }
  return sum;
}

void SoftmaxCrossEntropy(int n, int classes, const float* logits,
                         const int32_t* labels, float smoothing, float* probs,
                         float* stats) {
  double loss = 0;
  int64_t correct = 0;
  for (int r = 0; r < n; ++r) {
    const float* z = logits + int64_t{r} * classes;
    float* p = probs + int64_t{r} * classes;
    int argmax = 0;
    for (int k = 1; k < classes; ++k) {
      if (z[k] > z[argmax]) argmax = k;
    }
    const float max = z[argmax];
    double sum = 0, sum_z = 0;
    for (int k = 0; k < classes; ++k) {
      p[k] = std::exp(z[k] - max);
      sum += p[k];
      sum_z += static_cast<double>(z[k]) - max;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int k = 0; k < classes; ++k) p[k] *= inv;
    const int label = labels[r];
    // -log(softmax) computed from the logits stays finite where the
    // probability itself underflows.
    const double log_sum = std::log(sum);
    const double nll = log_sum - (static_cast<double>(z[label]) - max);
    if (smoothing == 0) {
      loss += nll;
    } else {
      // The mean over classes of -log(p_k): log_sum - mean(z - max).
      loss += (1.0 - smoothing) * nll + smoothing * (log_sum - sum_z / classes);
    }
    correct += argmax == label;
  }
  stats[0] += static_cast<float>(loss);
  stats[1] += static_cast<float>(correct);
}

void SoftmaxCrossEntropyBackward(int n, int classes, const float* probs,
                                 const int32_t* labels, float smoothing,
                                 float scale, float* dlogits) {
  // q * scale for the label and for the other classes, each rounded once.
  const float other = smoothing / static_cast<float>(classes) * scale;
  const float label = (1 - smoothing) * scale + other;
  for (int r = 0; r < n; ++r) {
    const float* p = probs + int64_t{r} * classes;
    float* d = dlogits + int64_t{r} * classes;
    if (smoothing == 0) {
      for (int k = 0; k < classes; ++k) d[k] = p[k] * scale;
      d[labels[r]] -= scale;
      continue;
    }
    for (int k = 0; k < classes; ++k) {
      d[k] = p[k] * scale - (k == labels[r] ? label : other);
    }
  }
}

// The solvers below run twice over the buffer: [0, decayed) with L2 added
// to the gradient and [decayed, count) without.

namespace {

template <bool kDecay, bool kNesterov>
void SgdmRange(int64_t begin, int64_t end, float lr, float momentum, float l2,
               float* params, const float* grads, float* velocity) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(end - begin))
  for (int64_t i = begin; i < end; ++i) {
    const float g = kDecay ? grads[i] + l2 * params[i] : grads[i];
    const float v = momentum * velocity[i] - lr * g;
    velocity[i] = v;
    params[i] += kNesterov ? momentum * v - lr * g : v;
  }
}

template <bool kDecay>
void AdamRange(int64_t begin, int64_t end, float lr, float beta1, float beta2,
               float epsilon, float correction1, float correction2, float l2,
               float* params, const float* grads, float* m, float* v) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(end - begin))
  for (int64_t i = begin; i < end; ++i) {
    const float g = kDecay ? grads[i] + l2 * params[i] : grads[i];
    const float mi = beta1 * m[i] + (1 - beta1) * g;
    const float vi = beta2 * v[i] + (1 - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] -=
        lr * (mi * correction1) / (std::sqrt(vi * correction2) + epsilon);
  }
}

template <bool kDecay>
void RmspropRange(int64_t begin, int64_t end, float lr, float beta2,
                  float epsilon, float l2, float* params, const float* grads,
                  float* v) {
#pragma omp parallel for simd schedule(static) if (parallel : Team(end - begin))
  for (int64_t i = begin; i < end; ++i) {
    const float g = kDecay ? grads[i] + l2 * params[i] : grads[i];
    const float vi = beta2 * v[i] + (1 - beta2) * g * g;
    v[i] = vi;
    params[i] -= lr * g / (std::sqrt(vi) + epsilon);
  }
}

}  // namespace

void SgdmUpdate(int64_t count, int64_t decayed, float lr, float momentum,
                float l2, float* params, const float* grads, float* velocity) {
  decayed = std::clamp<int64_t>(decayed, 0, count);
  SgdmRange<true, false>(0, decayed, lr, momentum, l2, params, grads, velocity);
  SgdmRange<false, false>(decayed, count, lr, momentum, l2, params, grads,
                          velocity);
}

void SgdmNesterovUpdate(int64_t count, int64_t decayed, float lr,
                        float momentum, float l2, float* params,
                        const float* grads, float* velocity) {
  decayed = std::clamp<int64_t>(decayed, 0, count);
  SgdmRange<true, true>(0, decayed, lr, momentum, l2, params, grads, velocity);
  SgdmRange<false, true>(decayed, count, lr, momentum, l2, params, grads,
                         velocity);
}

void AdamUpdate(int64_t count, int64_t decayed, float lr, float beta1,
                float beta2, float epsilon, int64_t t, float l2, float* params,
                const float* grads, float* m, float* v) {
  decayed = std::clamp<int64_t>(decayed, 0, count);
  const double tt = static_cast<double>(std::max<int64_t>(t, 1));
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(beta1, tt)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(beta2, tt)));
  AdamRange<true>(0, decayed, lr, beta1, beta2, epsilon, c1, c2, l2, params,
                  grads, m, v);
  AdamRange<false>(decayed, count, lr, beta1, beta2, epsilon, c1, c2, l2,
                   params, grads, m, v);
}

void RmspropUpdate(int64_t count, int64_t decayed, float lr, float beta2,
                   float epsilon, float l2, float* params, const float* grads,
                   float* v) {
  decayed = std::clamp<int64_t>(decayed, 0, count);
  RmspropRange<true>(0, decayed, lr, beta2, epsilon, l2, params, grads, v);
  RmspropRange<false>(decayed, count, lr, beta2, epsilon, l2, params, grads, v);
}

}  // namespace dlbatch::trainer::cpu
