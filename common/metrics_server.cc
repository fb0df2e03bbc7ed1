#include "common/metrics_server.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <atomic>
#include <exception>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace dlbatch {
namespace {

// civetweb's callbacks carry no pointer of ours (its user data is the
// Exposer's CivetServer), so the one server of the process is found here.
std::atomic<const MetricsServer*> g_server{nullptr};

void Reply(mg_connection* conn, int code, const char* status,
           const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n",
            code, status, body.size());
  mg_write(conn, body.data(), body.size());
}

// Answers /healthz and /readyz itself; anything else goes on to the
// Exposer's handlers (/metrics) or civetweb's 404.
int BeginRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const MetricsServer* server = g_server.load();
  if (info == nullptr || info->local_uri == nullptr || server == nullptr) {
    return 0;
  }
  std::string_view uri = info->local_uri;
  if (uri == "/healthz") {
    Reply(conn, 200, "OK", "ok\n");
    return 200;
  }
  if (uri == "/readyz") {
    std::string why = server->NotReadyReason();
    if (why.empty()) {
      Reply(conn, 200, "OK", "ready\n");
      return 200;
    }
    Reply(conn, 503, "Service Unavailable", absl::StrCat(why, "\n"));
    return 503;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
    ReadyFn ready) {
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint(listen);
  if (!endpoint.ok() || endpoint->is_unix) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen,
                     ": write HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any "
                     "free port)"));
  }
  const bool v6 = endpoint->host.find(':') != std::string::npos;
  const std::string host =
      v6 ? absl::StrCat("[", endpoint->host, "]") : endpoint->host;
  if (g_server.load() != nullptr) {
    return absl::FailedPreconditionError("a metrics listener already runs");
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer);
  server->collectables_ = std::move(collectables);
  server->ready_ = std::move(ready);
  g_server.store(server.get());
  static const CivetCallbacks callbacks = [] {
    CivetCallbacks c{};
    c.begin_request = BeginRequest;
    // civetweb's own error log would go to stderr unstructured.
    c.log_message = [](const mg_connection*, const char*) { return 1; };
    return c;
  }();
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{
            "listening_ports", absl::StrCat(host, ":", endpoint->port),
            "num_threads", "2", "request_timeout_ms", "10000"},
        &callbacks);
  } catch (const std::exception& e) {
    g_server.store(nullptr);
    return absl::UnavailableError(absl::StrCat(
        "--metrics-listen ", listen, ": cannot listen (", e.what(),
        "); the port may be in use or the address not this machine's"));
  }
  for (const auto& c : server->collectables_) {
    server->exposer_->RegisterCollectable(c);
  }
  std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? endpoint->port : ports.front();
  server->address_ = absl::StrCat(host, ":", server->port_);
  return server;
}

MetricsServer::~MetricsServer() {
  exposer_.reset();  // stops civetweb's threads first
  g_server.store(nullptr);
}

}  // namespace dlbatch
