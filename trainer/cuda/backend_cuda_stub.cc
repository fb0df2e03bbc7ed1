// MakeCudaBackend of a CPU-only build: CMake found no CUDA toolkit with
// cuDNN and cuBLAS, so there is no GPU backend to make.
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/cuda/backend_cuda.h"

namespace dlbatch::trainer {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, const CudaBackendOptions& /*options*/) {
  return absl::UnavailableError(absl::StrCat(
      "GPU ", device,
      ": this dlbatch-train was built without CUDA, cuDNN and cuBLAS (a "
      "CPU-only build); use execution_environment: cpu, or rebuild where "
      "CMake finds them"));
}

int CudaDeviceCount() { return 0; }

std::vector<CudaDeviceInfo> ListCudaDevices() { return {}; }

}  // namespace dlbatch::trainer
