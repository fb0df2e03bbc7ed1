#include "trainer/cublas_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>

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

// dlsym into `*fn`, or false.
template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return *fn != nullptr;
}

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
  const char* missing = nullptr;
  if (!Resolve(handle, "cublasCreate_v2", &l.Create))
    missing = "cublasCreate_v2";
  else if (!Resolve(handle, "cublasDestroy_v2", &l.Destroy))
    missing = "cublasDestroy_v2";
  else if (!Resolve(handle, "cublasSetStream_v2", &l.SetStream))
    missing = "cublasSetStream_v2";
  else if (!Resolve(handle, "cublasSetMathMode", &l.SetMathMode))
    missing = "cublasSetMathMode";
  else if (!Resolve(handle, "cublasSetWorkspace_v2", &l.SetWorkspace))
    missing = "cublasSetWorkspace_v2";
  else if (!Resolve(handle, "cublasSgemm_v2", &l.Sgemm))
    missing = "cublasSgemm_v2";
  else if (!Resolve(handle, "cublasSgemv_v2", &l.Sgemv))
    missing = "cublasSgemv_v2";
  else if (!Resolve(handle, "cublasGetStatusString", &l.GetStatusString))
    missing = "cublasGetStatusString";
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
