// Casts between the backend's float32 tensors and the bf16 or fp16 copies
// that mixed-precision convolutions and fully connected layers compute on
// (gpu_conv_low.cc, gpu_fc.cc). A cast may pad as it goes: channels up to a
// multiple of 8 (what tensor cores take whole), rows of zeros (a filter
// count padded the same way), and a border of zeros (a convolution's
// asymmetric padding, which cuDNN cannot describe); the cast back crops the
// same and may add a bias. Each is one pass over the larger side, so the
// padding costs no extra traversal.
//
// Rounding is to nearest even (__float2bfloat16_rn, __float2half_rn); fp16
// saturates to infinity beyond 65504, which the loss scaler then sees.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/cuda/backend_cuda_grid.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/cuda/gpu_elements.h"

namespace dlbatch::trainer::gpu {
namespace {

__device__ inline void Store(float v, __nv_bfloat16* out) {
  *out = __float2bfloat16_rn(v);
}
__device__ inline void Store(float v, __half* out) {
  *out = __float2half_rn(v);
}
__device__ inline float Load(const __nv_bfloat16* in) {
  return __bfloat162float(*in);
}
__device__ inline float Load(const __half* in) { return __half2float(*in); }

// Element e of the padded low-precision copy (gpu_elements.h's
// CastSource).
template <typename Index, typename Low>
__global__ void ToLowKernel(int64_t count, int n, CastGeometry g,
                            const float* __restrict__ x,
                            Low* __restrict__ low) {
  DLBATCH_GRID_STRIDE(e, count) {
    const Index source = CastSource(static_cast<Index>(e), g, n);
    Store(source < 0 ? 0.0f : x[source], low + e);
  }
}

// Element e of float y (CastBackSource), plus bias[channel] if any.
template <typename Index, typename Low>
__global__ void FromLowKernel(int64_t count, CastGeometry g,
                              const Low* __restrict__ low,
                              const float* __restrict__ bias,
                              float* __restrict__ y) {
  DLBATCH_GRID_STRIDE(e, count) {
    const Index i = static_cast<Index>(e);
    float v = Load(low + CastBackSource(i, g));
    if (bias != nullptr) v += bias[static_cast<int>(i % g.c)];
    y[e] = v;
  }
}

template <typename Index>
void ToLow(cudaStream_t stream, LowType type, int64_t count, int n,
           const CastGeometry& g, const float* x, void* low) {
  if (type == LowType::kBf16) {
    ToLowKernel<Index><<<Blocks(count), kThreads, 0, stream>>>(
        count, n, g, x, static_cast<__nv_bfloat16*>(low));
  } else {
    ToLowKernel<Index><<<Blocks(count), kThreads, 0, stream>>>(
        count, n, g, x, static_cast<__half*>(low));
  }
  DLBATCH_CUDA_CHECK_LAUNCH("ToLowKernel");
}

template <typename Index>
void FromLow(cudaStream_t stream, LowType type, int64_t count,
             const CastGeometry& g, const void* low, const float* bias,
             float* y) {
  if (type == LowType::kBf16) {
    FromLowKernel<Index><<<Blocks(count), kThreads, 0, stream>>>(
        count, g, static_cast<const __nv_bfloat16*>(low), bias, y);
  } else {
    FromLowKernel<Index><<<Blocks(count), kThreads, 0, stream>>>(
        count, g, static_cast<const __half*>(low), bias, y);
  }
  DLBATCH_CUDA_CHECK_LAUNCH("FromLowKernel");
}

}  // namespace

void LaunchToLow(cudaStream_t stream, LowType type, int n, int padded_n,
                 const CastGeometry& g, const float* x, void* low) {
  const int64_t count = int64_t{padded_n} * g.ph * g.pw * g.pc;
  if (count <= 0) return;
  // The low side is the larger: its indices bound x's.
  if (count <= INT32_MAX) {
    ToLow<int32_t>(stream, type, count, n, g, x, low);
  } else {
    ToLow<int64_t>(stream, type, count, n, g, x, low);
  }
}

void LaunchFromLow(cudaStream_t stream, LowType type, int n,
                   const CastGeometry& g, const void* low, const float* bias,
                   float* y) {
  const int64_t count = int64_t{n} * g.h * g.w * g.c;
  if (count <= 0) return;
  if (int64_t{n} * g.ph * g.pw * g.pc <= INT32_MAX) {
    FromLow<int32_t>(stream, type, count, g, low, bias, y);
  } else {
    FromLow<int64_t>(stream, type, count, g, low, bias, y);
  }
}

}  // namespace dlbatch::trainer::gpu
