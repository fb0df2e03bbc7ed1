// The worker's Prometheus metrics: its slots (busy and free) and, where
// NVML can be loaded (libnvidia-ml.so.1, at run time, as the trainer loads
// cuBLAS), each GPU's utilisation, memory and temperature. Read when
// scraped; without NVML the GPU series are absent, quietly.
#ifndef DLBATCH_WORKER_METRICS_H_
#define DLBATCH_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace dlbatch::worker {

// `busy` is called at each scrape (it must not block); `slots`: how many
// the worker offers, of `kind` ("gpu" or "cpu").
std::shared_ptr<prometheus::Collectable> MakeWorkerMetrics(
    const std::string& worker, const std::string& profile,
    const std::string& kind, int slots, std::function<int()> busy);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_METRICS_H_
