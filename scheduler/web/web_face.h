// The web face as the scheduler runs it (--web-listen): the HTTPS server
// with its sessions, login limit and the dashboard's files, answering
// /api/v1/ through an ApiHandler; and the one-time login URLs that
// `dlbatch web` asks the scheduler for.
#ifndef DLBATCH_SCHEDULER_WEB_WEB_FACE_H_
#define DLBATCH_SCHEDULER_WEB_WEB_FACE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/rpc/identity.h"
#include "scheduler/web/http_message.h"
#include "scheduler/web/sessions.h"
#include "scheduler/web/static_files.h"
#include "scheduler/web/web_routes.h"
#include "scheduler/web/web_server.h"

namespace dlbatch::scheduler::web {

struct WebFaceOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string cert_file;
  std::string key_file;
  std::string ca_file;  // what a browser trusts; "": the operator's CA
  std::string assets_dir;
  int64_t session_ms = 12 * 3600 * 1000;
  WebServerOptions server;  // its host, port and files are set from above
};

class WebFace {
 public:
  // Everything borrowed must outlive the result. Logs the address.
  static absl::StatusOr<std::unique_ptr<WebFace>> Start(
      const WebFaceOptions& options, ApiHandler* api,
      const CredentialTable* credentials, OpenCalls* open_calls,
      const Clock* clock);
  ~WebFace();

  // "https://127.0.0.1:PORT" (a wildcard listen address as 127.0.0.1).
  std::string address() const;
  const std::string& ca_file() const { return options_.ca_file; }
  // ADDRESS/login?once=CODE: logs `caller` in once, within two minutes.
  absl::StatusOr<std::string> LoginUrl(const Caller& caller);
  void Stop();

 private:
  WebFace(const WebFaceOptions& options, ApiHandler* api,
          const CredentialTable* credentials, OpenCalls* open_calls,
          const Clock* clock);

  const WebFaceOptions options_;
  Sessions sessions_;
  LoginLimiter limiter_;
  StaticFiles files_;
  WebRoutes routes_;
  std::unique_ptr<WebServer> server_;
};

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_WEB_FACE_H_
