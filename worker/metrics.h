// The worker's Prometheus metrics: its slots (busy and free) and, where
// NVML can be loaded (libnvidia-ml.so.1, at run time, as the trainer loads
// cuBLAS), each GPU's utilisation, memory and temperature. Read when
// scraped; without NVML the GPU series are absent, quietly. The same
// readings go to the scheduler (ReadGpus).
#ifndef DLBATCH_WORKER_METRICS_H_
#define DLBATCH_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlbatch/v1/scheduler.pb.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace dlbatch::worker {

// `busy` is called at each scrape (it must not block); `slots`: how many
// the worker offers, of `kind` ("gpu" or "cpu").
std::shared_ptr<prometheus::Collectable> MakeWorkerMetrics(
    const std::string& worker, const std::string& profile,
    const std::string& kind, int slots, std::function<int()> busy);

// Every GPU NVML sees, read now (utilisation and memory; a reading NVML
// refuses is left unset), for the scheduler's view of the worker
// (Heartbeat.gpus); empty without NVML. NVML is loaded once per process,
// for these and the metrics alike. Thread-safe.
std::vector<v1::GpuReading> ReadGpus();

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_METRICS_H_
