#include "common/version.h"

#include <cctype>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

// The GPU libraries' versions come from the headers this file is compiled
// against; common/CMakeLists.txt adds their folders only where the GPU
// backend is built.
#if DLBATCH_GPU_BACKEND
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#endif
#if __has_include(<cudnn_version.h>)
#include <cudnn_version.h>
#elif __has_include(<cudnn.h>)
#include <cudnn.h>
#endif
#if DLBATCH_NCCL && __has_include(<nccl.h>)
#include <nccl.h>
#endif
#endif

namespace dlbatch {
namespace {

std::vector<int> Parts(std::string_view v) {
  if (!v.empty() && (v[0] == 'v' || v[0] == 'V')) v.remove_prefix(1);
  std::vector<int> parts;
  while (!v.empty() && std::isdigit(static_cast<unsigned char>(v[0]))) {
    size_t end = 0;
    while (end < v.size() && std::isdigit(static_cast<unsigned char>(v[end])))
      ++end;
    int n = 0;
    if (!absl::SimpleAtoi(std::string(v.substr(0, end)), &n)) break;
    parts.push_back(n);
    v.remove_prefix(end);
    if (v.empty() || v[0] != '.') break;
    v.remove_prefix(1);
  }
  return parts;
}

}  // namespace

std::string_view Version() { return DLBATCH_VERSION_STRING; }
std::string_view GitCommit() { return DLBATCH_GIT_COMMIT_STRING; }
std::string_view BuildType() { return DLBATCH_BUILD_TYPE_STRING; }
bool GpuBackendBuilt() { return DLBATCH_GPU_BACKEND != 0; }

std::string CudaVersion() {
#if defined(CUDART_VERSION)
  return absl::StrCat(CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10);
#else
  return "";
#endif
}

std::string CudnnVersion() {
#if defined(CUDNN_MAJOR)
  return absl::StrCat(CUDNN_MAJOR, ".", CUDNN_MINOR, ".", CUDNN_PATCHLEVEL);
#else
  return "";
#endif
}

std::string NcclVersion() {
#if defined(NCCL_MAJOR)
  return absl::StrCat(NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH);
#else
  return "";
#endif
}

std::string BuildText(std::string_view program) {
  return absl::StrCat(std::string(program), " ", std::string(Version()),
                      "\ncommit: ", std::string(GitCommit()),
                      "\nbuild type: ", std::string(BuildType()));
}

std::string VersionText(std::string_view program) {
  auto or_none = [](const std::string& v) {
    return v.empty() ? std::string("not built") : v;
  };
  std::string text = BuildText(program);
  if (!GpuBackendBuilt()) return text + "\nGPU backend: not built (CPU only)";
  return absl::StrCat(
      text, "\nGPU backend: built\nCUDA: ", or_none(CudaVersion()),
      "\ncuDNN: ", or_none(CudnnVersion()), "\nNCCL: ", or_none(NcclVersion()));
}

int CompareVersions(std::string_view a, std::string_view b) {
  std::vector<int> x = Parts(a), y = Parts(b);
  for (size_t i = 0; i < std::max(x.size(), y.size()); ++i) {
    int p = i < x.size() ? x[i] : 0, q = i < y.size() ? y[i] : 0;
    if (p != q) return p < q ? -1 : 1;
  }
  return 0;
}

absl::Status CheckWorkerVersion(std::string_view worker_version,
                                std::string_view minimum,
                                std::string_view scheduler_version) {
  std::string_view worker =
      worker_version.empty() ? std::string_view("0.1.0") : worker_version;
  if (CompareVersions(worker, minimum) >= 0) return absl::OkStatus();
  const std::string w(worker_version.empty() ? "(none)" : worker_version);
  const std::string m(minimum), s(scheduler_version);
  return absl::FailedPreconditionError(absl::StrCat(
      "worker version ", w, " is older than ", m,
      ", the oldest that scheduler version ", s, " accepts; install dlbatch ",
      s, " (or at least ", m, ") on this worker's machine"));
}

}  // namespace dlbatch
