#include "trainer/gpu_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"

// Set by CMake (trainer/CMakeLists.txt): whether this build makes the
// module; the folder it is installed in, relative to the programs'; and
// what it needs of CUDA, for the messages.
#ifndef DLBATCH_GPU_MODULE_BUILT
#define DLBATCH_GPU_MODULE_BUILT 0
#endif
#ifndef DLBATCH_GPU_MODULE_RELATIVE_DIR
#define DLBATCH_GPU_MODULE_RELATIVE_DIR "../lib/dlbatch"
#endif
#ifndef DLBATCH_GPU_MODULE_NEEDS
#define DLBATCH_GPU_MODULE_NEEDS "CUDA runtime, cuBLAS, cuDNN and NCCL"
#endif

namespace dlbatch::trainer {
namespace {

using GpuModuleEntry = const GpuModuleTable* (*)();

// The folder of this program's file; "" where /proc is not there.
std::filesystem::path ProgramDir() {
  std::error_code ec;
  std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

absl::StatusOr<LoadedGpuModule> Open(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "the GPU backend ", path, " cannot be loaded (",
        why != nullptr ? why : "dlopen failed", "): install NVIDIA's ",
        DLBATCH_GPU_MODULE_NEEDS,
        " (not Debian packages) and make their folder known to the dynamic "
        "linker (a file in /etc/ld.so.conf.d, then ldconfig; or "
        "LD_LIBRARY_PATH)"));
  }
  auto entry = reinterpret_cast<GpuModuleEntry>(dlsym(handle, kGpuModuleEntry));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is no dlbatch GPU module (it has no ",
                     kGpuModuleEntry, "); unset DLBATCH_GPU_MODULE or name ",
                     kGpuModuleFile, " of this dlbatch"));
  }
  const GpuModuleTable* table = entry();
  if (table == nullptr || table->version == nullptr ||
      Version() != table->version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the GPU backend ", path, " is of dlbatch ",
        table != nullptr && table->version != nullptr ? table->version : "?",
        ", this program of dlbatch ", std::string(Version()),
        "; install dlbatch-gpu of the same version as dlbatch"));
  }
  return LoadedGpuModule{table, path};
}

absl::StatusOr<LoadedGpuModule> Load() {
  if (const char* given = std::getenv("DLBATCH_GPU_MODULE");
      given != nullptr && *given != '\0') {
    if (access(given, F_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "DLBATCH_GPU_MODULE names ", given,
          ", which does not exist; unset it or name the GPU backend's ",
          kGpuModuleFile));
    }
    return Open(given);
  }
  const std::filesystem::path dir = ProgramDir();
  const std::filesystem::path beside = dir / kGpuModuleFile;
  const std::filesystem::path installed =
      (dir / DLBATCH_GPU_MODULE_RELATIVE_DIR / kGpuModuleFile)
          .lexically_normal();
  for (const std::filesystem::path& p : {beside, installed}) {
    if (!dir.empty() && access(p.c_str(), F_OK) == 0) return Open(p.string());
  }
  if (!DLBATCH_GPU_MODULE_BUILT) {
    return absl::NotFoundError(
        "this dlbatch-train was built without the GPU backend (CMake found "
        "no CUDA toolkit with cuDNN and cuBLAS: a CPU-only build)");
  }
  return absl::NotFoundError(absl::StrCat(
      "the GPU backend is not installed (no ", kGpuModuleFile, " in ",
      dir.string(), " or ", installed.parent_path().string(),
      "): install the dlbatch-gpu package, and NVIDIA's ",
      DLBATCH_GPU_MODULE_NEEDS, " that it needs"));
}

// The driver API's cuInit and cuDeviceGetCount (CUresult is an int, 0 is
// CUDA_SUCCESS), without CUDA's headers.
int CountDriverDevices() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return 0;
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(driver, "cuInit"));
  auto count =
      reinterpret_cast<int (*)(int*)>(dlsym(driver, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) {
    return 0;
  }
  // Kept loaded: CUDA's runtime loads it again for a GPU run.
  return n;
}

}  // namespace

absl::StatusOr<const LoadedGpuModule*> LoadGpuModule() {
  static const absl::StatusOr<LoadedGpuModule>* const loaded =
      new absl::StatusOr<LoadedGpuModule>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

int DriverDeviceCount() {
  static const int count = CountDriverDevices();
  return count;
}

}  // namespace dlbatch::trainer
