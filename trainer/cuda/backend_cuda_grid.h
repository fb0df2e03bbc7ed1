// Launch shapes shared by the GPU backend's .cu files: a block size and
// grid-stride loops over element counts. nvcc only (uses blockIdx).
#ifndef DLBATCH_TRAINER_CUDA_BACKEND_CUDA_GRID_H_
#define DLBATCH_TRAINER_CUDA_BACKEND_CUDA_GRID_H_

#include <algorithm>
#include <cstdint>

namespace dlbatch::trainer::gpu {

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `count` elements: enough to fill the
// device, never more than the elements need.
inline int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 16));
}

}  // namespace dlbatch::trainer::gpu

#define DLBATCH_GRID_STRIDE(i, count)                              \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; \
       i < (count); i += int64_t{gridDim.x} * blockDim.x)

#endif  // DLBATCH_TRAINER_CUDA_BACKEND_CUDA_GRID_H_
