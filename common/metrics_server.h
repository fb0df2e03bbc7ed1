// The metrics listener of a daemon (--metrics-listen): Prometheus's
// /metrics, plus /healthz (the process answers) and /readyz (it can do its
// work: 200, or 503 with the reason). Served by prometheus-cpp's Exposer
// (civetweb threads of its own); what a scrape reads is built by the
// collectables passed in, never under a daemon's own locks.
#ifndef DLBATCH_COMMON_METRICS_SERVER_H_
#define DLBATCH_COMMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace dlbatch {

class MetricsServer {
 public:
  // Empty when ready; else why not (the body of /readyz's 503).
  using ReadyFn = std::function<std::string()>;

  // Listens on HOST:PORT ("127.0.0.1:9464"; port 0: any free one). At most
  // one server per process (its health handlers are process-wide).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
      ReadyFn ready);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // The address as bound, e.g. "127.0.0.1:41234".
  const std::string& address() const { return address_; }
  // What /readyz answers now (empty: ready).
  std::string NotReadyReason() const { return ready_ ? ready_() : ""; }

 private:
  MetricsServer() = default;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  ReadyFn ready_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_METRICS_SERVER_H_
