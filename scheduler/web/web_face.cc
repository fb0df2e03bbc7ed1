#include "scheduler/web/web_face.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler::web {

WebFace::WebFace(const WebFaceOptions& options, ApiHandler* api,
                 const CredentialTable* credentials, OpenCalls* open_calls,
                 const Clock* clock)
    : options_(options),
      sessions_(clock, options.session_ms),
      limiter_(clock),
      files_(options.assets_dir),
      routes_(api, &sessions_, &limiter_, credentials, open_calls, &files_) {}

WebFace::~WebFace() { Stop(); }

absl::StatusOr<std::unique_ptr<WebFace>> WebFace::Start(
    const WebFaceOptions& options, ApiHandler* api,
    const CredentialTable* credentials, OpenCalls* open_calls,
    const Clock* clock) {
  std::unique_ptr<WebFace> face(
      new WebFace(options, api, credentials, open_calls, clock));
  WebServerOptions server = options.server;
  server.host = options.host;
  server.port = options.port;
  server.cert_file = options.cert_file;
  server.key_file = options.key_file;
  WebRoutes* routes = &face->routes_;
  auto started = WebServer::Start(
      server, [routes](const HttpRequest& r) { return routes->Handle(r); },
      open_calls);
  if (!started.ok()) return started.status();
  face->server_ = *std::move(started);
  spdlog::info(
      "web face on {}{}", face->address(),
      face->files_.Index().file_path.empty()
          ? absl::StrCat(" (no dashboard in ", options.assets_dir,
                         ": its assets were not built)")
          : absl::StrCat(" (dashboard from ", options.assets_dir, ")"));
  return face;
}

std::string WebFace::address() const {
  std::string host = options_.host;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  return absl::StrCat("https://", host, ":",
                      server_ ? server_->port() : options_.port);
}

absl::StatusOr<std::string> WebFace::LoginUrl(const Caller& caller) {
  absl::StatusOr<std::string> code = sessions_.CreateOnceCode(caller);
  if (!code.ok()) return code.status();
  return absl::StrCat(address(), "/login?once=", *code);
}

void WebFace::Stop() {
  if (server_) server_->Stop();
}

}  // namespace dlbatch::scheduler::web
