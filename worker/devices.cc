#include "worker/devices.h"

#include <sched.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#ifdef DLBATCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dlbatch::worker {

std::vector<v1::Device> DiscoverGpus(std::string* note) {
  std::vector<v1::Device> gpus;
#ifdef DLBATCH_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (note) *note = absl::StrCat("no GPU usable: ", cudaGetErrorString(err));
    return gpus;
  }
  std::string skipped;  // GPUs the runtime counts but cannot describe
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "GPU ", i,
                      " left out: ", cudaGetErrorString(e));
      continue;
    }
    v1::Device d;
    d.set_index(i);
    d.set_kind("gpu");
    d.set_name(prop.name);
    d.set_memory_bytes(static_cast<int64_t>(prop.totalGlobalMem));
    d.set_compute_capability(absl::StrCat(prop.major, ".", prop.minor));
    gpus.push_back(std::move(d));
  }
  if (note) {
    if (!skipped.empty()) {
      *note = skipped;
    } else if (gpus.empty()) {
      *note = "the CUDA runtime found no GPU";
    }
  }
#else
  if (note) *note = "built without CUDA";
#endif
  return gpus;
}

std::vector<v1::Device> CpuSlots(int count) {
  std::vector<v1::Device> slots;
  for (int i = 0; i < count; ++i) {
    v1::Device d;
    d.set_index(i);
    d.set_kind("cpu");
    d.set_name(absl::StrCat("cpu slot ", i));
    slots.push_back(std::move(d));
  }
  return slots;
}

absl::StatusOr<std::string> ChildVisibleDevices(
    absl::Span<const int32_t> indices, const char* inherited) {
  if (inherited == nullptr) return absl::StrJoin(indices, ",");
  std::vector<std::string> entries;
  for (absl::string_view e : absl::StrSplit(inherited, ',')) {
    entries.emplace_back(absl::StripAsciiWhitespace(e));
  }
  std::vector<std::string> chosen;
  for (int32_t i : indices) {
    if (i < 0 || static_cast<size_t>(i) >= entries.size() ||
        entries[i].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this worker's GPU ", i,
          " is not in its own CUDA_VISIBLE_DEVICES (\"", inherited,
          "\"); restart the worker with the GPUs it should offer"));
    }
    chosen.push_back(entries[i]);
  }
  return absl::StrJoin(chosen, ",");
}

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace dlbatch::worker
