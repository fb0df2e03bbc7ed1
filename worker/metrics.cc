#include "worker/metrics.h"

#include <dlfcn.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "spdlog/spdlog.h"

namespace dlbatch::worker {
namespace {

// The few NVML entry points used, declared here so that building needs no
// NVML header: their C signatures are stable since NVML's v2 API.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of time a kernel ran
  unsigned int memory;  // percent of time memory was read or written
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlTemperatureGpu = 0;

struct Nvml {
  nvmlReturn_t (*Init)();
  nvmlReturn_t (*DeviceGetCount)(unsigned int*);
  nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, NvmlUtilization*);
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, NvmlMemory*);
  nvmlReturn_t (*DeviceGetTemperature)(nvmlDevice_t, int, unsigned int*);
};

// NVML loaded and initialised once, or null (no driver: no GPU series).
// Never unloaded.
const Nvml* LoadNvml() {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  auto* n = new Nvml{};
  bool all = true;
  auto resolve = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
        dlsym(handle, name));
    all = all && *fn != nullptr;
  };
  resolve("nvmlInit_v2", &n->Init);
  resolve("nvmlDeviceGetCount_v2", &n->DeviceGetCount);
  resolve("nvmlDeviceGetHandleByIndex_v2", &n->DeviceGetHandleByIndex);
  resolve("nvmlDeviceGetUUID", &n->DeviceGetUUID);
  resolve("nvmlDeviceGetUtilizationRates", &n->DeviceGetUtilizationRates);
  resolve("nvmlDeviceGetMemoryInfo", &n->DeviceGetMemoryInfo);
  resolve("nvmlDeviceGetTemperature", &n->DeviceGetTemperature);
  if (!all || n->Init() != kNvmlSuccess) {
    spdlog::info("NVML found but not usable: no GPU metrics");
    delete n;
    return nullptr;
  }
  return n;
}

// The process's NVML: loaded at the first call, by whichever reader comes
// first (a function-local static: thread-safe).
const Nvml* SharedNvml() {
  static const Nvml* const nvml = LoadNvml();
  return nvml;
}

prometheus::MetricFamily Family(const char* name, const char* help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

void Add(prometheus::MetricFamily& f,
         std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

class WorkerMetrics : public prometheus::Collectable {
 public:
  WorkerMetrics(std::string worker, std::string profile, std::string kind,
                int slots, std::function<int()> busy, const Nvml* nvml)
      : worker_(std::move(worker)),
        profile_(std::move(profile)),
        kind_(std::move(kind)),
        slots_(slots),
        busy_(std::move(busy)),
        nvml_(nvml) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    const int busy = std::clamp(busy_(), 0, slots_);
    auto slots = Family("dlbatch_worker_slots",
                        "This worker's slots (GPUs or CPU slots) by state");
    for (const auto& [state, n] :
         {std::pair{"busy", busy}, std::pair{"free", slots_ - busy}}) {
      Add(slots,
          {{"kind", kind_},
           {"profile", profile_},
           {"state", state},
           {"worker", worker_}},
          n);
    }
    out.push_back(std::move(slots));
    if (nvml_ != nullptr) CollectGpus(out);
    return out;
  }

 private:
  void CollectGpus(std::vector<prometheus::MetricFamily>& out) const {
    unsigned int count = 0;
    if (nvml_->DeviceGetCount(&count) != kNvmlSuccess || count == 0) return;
    auto util = Family("dlbatch_gpu_utilization_ratio",
                       "Fraction of the last sample period a kernel ran on "
                       "the GPU (NVML)");
    auto used =
        Family("dlbatch_gpu_memory_used_bytes", "GPU memory in use (NVML)");
    auto total =
        Family("dlbatch_gpu_memory_total_bytes", "GPU memory in all (NVML)");
    auto temp = Family("dlbatch_gpu_temperature_celsius",
                       "GPU core temperature (NVML)");
    for (unsigned int i = 0; i < count; ++i) {
      nvmlDevice_t device = nullptr;
      if (nvml_->DeviceGetHandleByIndex(i, &device) != kNvmlSuccess) continue;
      char uuid[96] = {0};
      if (nvml_->DeviceGetUUID(device, uuid, sizeof uuid - 1) != kNvmlSuccess) {
        uuid[0] = '\0';
      }
      std::vector<prometheus::ClientMetric::Label> labels = {
          {"gpu", absl::StrCat(i)}, {"uuid", uuid}, {"worker", worker_}};
      NvmlUtilization u{};
      if (nvml_->DeviceGetUtilizationRates(device, &u) == kNvmlSuccess) {
        Add(util, labels, u.gpu / 100.0);
      }
      NvmlMemory m{};
      if (nvml_->DeviceGetMemoryInfo(device, &m) == kNvmlSuccess) {
        Add(used, labels, static_cast<double>(m.used));
        Add(total, labels, static_cast<double>(m.total));
      }
      unsigned int celsius = 0;
      if (nvml_->DeviceGetTemperature(device, kNvmlTemperatureGpu, &celsius) ==
          kNvmlSuccess) {
        Add(temp, labels, celsius);
      }
    }
    for (auto* f : {&util, &used, &total, &temp}) {
      if (!f->metric.empty()) out.push_back(std::move(*f));
    }
  }

  const std::string worker_, profile_, kind_;
  const int slots_;
  const std::function<int()> busy_;
  const Nvml* const nvml_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> MakeWorkerMetrics(
    const std::string& worker, const std::string& profile,
    const std::string& kind, int slots, std::function<int()> busy) {
  return std::make_shared<WorkerMetrics>(worker, profile, kind, slots,
                                         std::move(busy), SharedNvml());
}

std::vector<v1::GpuReading> ReadGpus() {
  std::vector<v1::GpuReading> out;
  const Nvml* nvml = SharedNvml();
  unsigned int count = 0;
  if (nvml == nullptr || nvml->DeviceGetCount(&count) != kNvmlSuccess)
    return out;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    if (nvml->DeviceGetHandleByIndex(i, &device) != kNvmlSuccess) continue;
    v1::GpuReading& r = out.emplace_back();
    r.set_index(static_cast<int32_t>(i));
    char uuid[96] = {0};
    if (nvml->DeviceGetUUID(device, uuid, sizeof uuid - 1) == kNvmlSuccess)
      r.set_uuid(uuid);
    NvmlUtilization u{};
    if (nvml->DeviceGetUtilizationRates(device, &u) == kNvmlSuccess)
      r.set_utilization_percent(static_cast<int32_t>(std::min(u.gpu, 100u)));
    NvmlMemory m{};
    if (nvml->DeviceGetMemoryInfo(device, &m) == kNvmlSuccess) {
      r.set_memory_used_bytes(static_cast<int64_t>(m.used));
      r.set_memory_total_bytes(static_cast<int64_t>(m.total));
    }
  }
  return out;
}

}  // namespace dlbatch::worker
