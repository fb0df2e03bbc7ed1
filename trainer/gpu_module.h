// The GPU module: the CUDA backend (trainer/cuda/) and the NCCL
// communicator (trainer/comm/communicator_nccl.h) in a shared object of
// their own, libdlbatch-gpu.so, the one part of dlbatch that links CUDA's
// runtime, cuDNN and NCCL. dlbatch-train loads it only where a run may use
// a GPU (backend_select.h says when), so that it starts, and trains on the
// CPU, on a machine without CUDA, and a GPU run there is refused saying
// what to install.
//
// The module exports one function, kGpuModuleEntry, returning its table.
// The table passes C++ types (absl::Status, std::unique_ptr, std::vector)
// across, so a program takes a module of its own build's version only.
#ifndef DLBATCH_TRAINER_GPU_MODULE_H_
#define DLBATCH_TRAINER_GPU_MODULE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/cuda/backend_cuda.h"

namespace dlbatch::trainer {

// What the module offers: backend_cuda.h's and communicator_nccl.h's
// functions, of the same contracts.
struct GpuModuleTable {
  // DLBATCH_VERSION of the build that made the module.
  const char* version;
  absl::StatusOr<std::unique_ptr<Backend>> (*make_backend)(
      int device, const CudaBackendOptions& options);
  int (*device_count)();
  std::vector<CudaDeviceInfo> (*list_devices)();
  bool (*nccl_built)();
  absl::StatusOr<std::unique_ptr<Communicator>> (*make_nccl_communicator)(
      Rendezvous* rendezvous, int rank, int size, int device,
      absl::Duration timeout);
  // The libraries it runs on, one a line, for --version: "CUDA runtime:
  // 13.0\ncuDNN: 9.13.0\nNCCL: 2.27.7" (no newline after the last).
  std::string (*libraries)();
};

inline constexpr char kGpuModuleFile[] = "libdlbatch-gpu.so";
// extern "C" const GpuModuleTable* dlbatch_gpu_module_v1();
inline constexpr char kGpuModuleEntry[] = "dlbatch_gpu_module_v1";

struct LoadedGpuModule {
  const GpuModuleTable* table = nullptr;
  std::string path;  // the file it was loaded from
};

// Loads the module, once per process (later calls return the first
// answer); thread-safe; never unloaded. Looked for at $DLBATCH_GPU_MODULE
// where that is set (and there only), else beside this program (a build's
// bin/, a bundle's), else where the package installs it relative to this
// program (/usr/lib/<triplet>/dlbatch from /usr/bin). NOT_FOUND where it is in
// neither: the message says which package to install, or that this build
// has no GPU backend. FAILED_PRECONDITION where it is there but does not
// load (CUDA's libraries are missing: the message names the one and what
// to install), or is not this build's.
absl::StatusOr<const LoadedGpuModule*> LoadGpuModule();

// The CUDA devices the NVIDIA driver (libcuda.so.1) sees, without loading
// the module or CUDA's runtime: 0 where there is no driver (a machine
// without NVIDIA GPUs) or CUDA_VISIBLE_DEVICES hides them all. Cached after
// the first call; thread-safe.
int DriverDeviceCount();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_GPU_MODULE_H_
