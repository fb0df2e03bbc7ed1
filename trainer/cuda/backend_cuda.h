// The GPU backend: one CUDA device, one stream, cuDNN for convolution and
// pooling, cuBLAS for fully connected layers, our own kernels for the rest
// (backend.h's contract throughout). Built where CMake finds CUDA, cuDNN
// and cuBLAS; elsewhere MakeCudaBackend returns UNAVAILABLE, so callers
// need no #if.
#ifndef DLBATCH_TRAINER_CUDA_BACKEND_CUDA_H_
#define DLBATCH_TRAINER_CUDA_BACKEND_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"

namespace dlbatch::trainer {

struct CudaBackendOptions {
  // `precision: tf32`: convolutions and matrix products may use tensor
  // cores on TF32 inputs. Off: plain float32 arithmetic, as MATLAB and
  // Caffe train (cuDNN's default math would otherwise allow TF32).
  bool tf32 = false;

  // `precision: bf16 | fp16`: convolutions (cuDNN, NHWC) and fully
  // connected layers (cuBLAS) compute on tensor cores in that type with
  // float32 accumulation. Fully connected layers write float32 results;
  // convolutions write theirs (y, dx, dw) in that type, which cuDNN's
  // convolution calls take for x, w and y alike, and they are cast to
  // float32 after (so an fp16 output above 65504 is inf). Every buffer of
  // backend.h stays float32, and so do pooling, batch normalisation, the
  // element-wise layers, the loss and the solvers (the weights are float32
  // masters, cast for each step). bf16 needs compute capability 8.0 or later,
  // fp16 7.0 (MakeCudaBackend says so otherwise); fp16 asks for loss scaling
  // (Backend::scales_loss). kNone: fp32, or tf32 above.
  enum class LowPrecision { kNone, kBf16, kFp16 };
  LowPrecision low_precision = LowPrecision::kNone;

  // Convolutions may also run as matrix products over their unfolded
  // patches (cuBLAS; trainer/cuda/conv_lowering.h). kTimed: per layer,
  // direction and batch size, whichever of that and cuDNN's fastest algorithm
  // runs faster when the kernel is made (the choice is tuning, kept as cuDNN's
  // are). kAlways and kNever are for tests and comparisons; with kTimed,
  // DLBATCH_CONV_LOWERED=1 or 0 in the environment means them.
  enum class Lowering { kTimed, kAlways, kNever };
  Lowering lowering = Lowering::kTimed;
  // The most device memory a lowered convolution's patches take at once:
  // larger batches go in chunks.
  size_t lowered_bytes = size_t{256} << 20;
  // With kAlways: lowered backward weights in (at most) this many groups of
  // samples (conv_lowering.h); kTimed times a few.
  int lowered_groups = 1;
};

// A backend on CUDA device `device` (an index among the visible ones).
// UNAVAILABLE where this build has no GPU backend or the machine has no such
// device; FAILED_PRECONDITION, saying why, where the device cannot compute
// in options.low_precision; INTERNAL where the device cannot be set up
// (driver, cuDNN).
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, const CudaBackendOptions& options = {});

// The number of CUDA devices visible to this process; 0 in a CPU-only
// build or where the driver finds none.
int CudaDeviceCount();

// What gpuDevice shows of each visible CUDA device.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
  std::string compute_capability;  // "9.0"
  // "GPU-8f3c2d1e-…" as nvidia-smi -L shows it: a name for the device in
  // CUDA_VISIBLE_DEVICES that holds whatever the ordinals.
  std::string uuid;
};
std::vector<CudaDeviceInfo> ListCudaDevices();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_CUDA_BACKEND_CUDA_H_
