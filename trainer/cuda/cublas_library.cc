#include "trainer/cuda/cublas_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// Set by CMake: the soname of the toolkit's cuBLAS (libcublas.so.MAJOR)
// and the file the build linked against, tried second.
#ifndef DLBATCH_CUBLAS_SONAME
#error "DLBATCH_CUBLAS_SONAME names libcublas (trainer/CMakeLists.txt)"
#endif
#ifndef DLBATCH_CUBLAS_PATH
#define DLBATCH_CUBLAS_PATH ""
#endif

namespace dlbatch::trainer::gpu {
namespace {

struct Loaded {
  CublasLibrary library{};
  absl::Status status;
};

Loaded Load() {
  Loaded out;
  // By soname first, as the dynamic linker would find a linked library
  // (LD_LIBRARY_PATH, this program's run path, the system's cache); then
  // the build's own file. RTLD_LOCAL: nothing else should bind to it.
  void* handle = dlopen(DLBATCH_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  std::string why = handle == nullptr ? dlerror() : "";
  if (handle == nullptr && DLBATCH_CUBLAS_PATH[0] != '\0') {
    handle = dlopen(DLBATCH_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    out.status = absl::FailedPreconditionError(
        absl::StrCat("cannot load cuBLAS (", why,
                     "); install the CUDA toolkit's cuBLAS of this build (",
                     DLBATCH_CUBLAS_SONAME,
                     ") or name its folder in LD_LIBRARY_PATH, or use "
                     "execution_environment: cpu"));
    return out;
  }
  CublasLibrary& l = out.library;
  const char* missing = nullptr;  // the first function not found
  auto resolve = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
        dlsym(handle, name));
    if (*fn == nullptr && missing == nullptr) missing = name;
  };
  resolve("cublasCreate_v2", &l.Create);
  resolve("cublasDestroy_v2", &l.Destroy);
  resolve("cublasSetStream_v2", &l.SetStream);
  resolve("cublasSetMathMode", &l.SetMathMode);
  resolve("cublasSetWorkspace_v2", &l.SetWorkspace);
  resolve("cublasSgemm_v2", &l.Sgemm);
  resolve("cublasSgemmStridedBatched", &l.SgemmStridedBatched);
  resolve("cublasSgemv_v2", &l.Sgemv);
  resolve("cublasGemmEx", &l.GemmEx);
  resolve("cublasGetStatusString", &l.GetStatusString);
  if (missing != nullptr) {
    out.status = absl::FailedPreconditionError(absl::StrCat(
        "the cuBLAS loaded (", DLBATCH_CUBLAS_SONAME, ") has no ", missing,
        ": it is older than the toolkit this dlbatch-train was built with"));
    dlclose(handle);
  }
  // Otherwise loaded for the rest of the process: never closed.
  return out;
}

const Loaded& Once() {
  static const Loaded* const loaded = new Loaded(Load());
  return *loaded;
}

}  // namespace

absl::StatusOr<const CublasLibrary*> LoadCublas() {
  const Loaded& loaded = Once();
  if (!loaded.status.ok()) return loaded.status;
  return &loaded.library;
}

const char* CublasStatusString(cublasStatus_t status) {
  // A status comes from a call into the library, so it is loaded already.
  static thread_local char number[32];
  const absl::StatusOr<const CublasLibrary*> library = LoadCublas();
  if (library.ok()) return (*library)->GetStatusString(status);
  std::snprintf(number, sizeof number, "cuBLAS status %d",
                static_cast<int>(status));
  return number;
}

}  // namespace dlbatch::trainer::gpu
