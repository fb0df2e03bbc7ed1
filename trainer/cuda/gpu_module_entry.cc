// libdlbatch-gpu.so's one exported function (gpu_module.h): the table of
// the CUDA backend and the NCCL communicator, which the module links in.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "trainer/comm/communicator_nccl.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/gpu_module.h"

// Set by CMake (trainer/cuda/CMakeLists.txt): the build's DLBATCH_VERSION.
#ifndef DLBATCH_MODULE_VERSION
#error "DLBATCH_MODULE_VERSION names the build's version"
#endif

namespace dlbatch::trainer {
namespace {

// "13.0" of 13000: CUDA's runtime numbers its versions 1000 * major + 10 *
// minor.
std::string CudaVersionText(int v) {
  return absl::StrCat(v / 1000, ".", v % 1000 / 10);
}

std::string Libraries() {
  int runtime = 0;
  std::string cuda = cudaRuntimeGetVersion(&runtime) == cudaSuccess
                         ? CudaVersionText(runtime)
                         : std::string("?");
  // cuDNN 9 numbers its versions 10000 * major + 100 * minor + patch.
  const size_t dnn = cudnnGetVersion();
  return absl::StrCat("CUDA runtime: ", cuda, " (built with ",
                      CudaVersionText(CUDART_VERSION),
                      ")\ncuDNN: ", dnn / 10000, ".", dnn % 10000 / 100, ".",
                      dnn % 100, " (built with ", CUDNN_MAJOR, ".", CUDNN_MINOR,
                      ".", CUDNN_PATCHLEVEL, ")\nNCCL: ", NcclLibraryVersion());
}

constexpr GpuModuleTable kTable = {
    .version = DLBATCH_MODULE_VERSION,
    .make_backend = &MakeCudaBackend,
    .device_count = &CudaDeviceCount,
    .list_devices = &ListCudaDevices,
    .nccl_built = &NcclBuilt,
    .make_nccl_communicator = &MakeNcclCommunicator,
    .libraries = &Libraries,
};

}  // namespace
}  // namespace dlbatch::trainer

extern "C" const dlbatch::trainer::GpuModuleTable* dlbatch_gpu_module_v1() {
  return &dlbatch::trainer::kTable;
}
