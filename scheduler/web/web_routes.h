// What the web face answers, before any socket: the server's own
// endpoints (login, logout, session, the one-time login URL), who a
// request comes from (the session cookie or a bearer token), the CSRF
// check of state-changing requests, the pages and assets, and the
// security headers of every response. The rest of /api/v1/ goes to the
// ApiHandler with the caller. Runs on the server's handler pool; called
// from several threads at once.
#ifndef DLBATCH_SCHEDULER_WEB_WEB_ROUTES_H_
#define DLBATCH_SCHEDULER_WEB_WEB_ROUTES_H_

#include <string>

#include "scheduler/rpc/credentials.h"
#include "scheduler/web/http_message.h"
#include "scheduler/web/sessions.h"
#include "scheduler/web/static_files.h"

namespace dlbatch::scheduler::web {

inline constexpr char kSessionCookie[] = "dlbatch_session";

// A response and the credential (Caller::credential) of whom it answers,
// so that an event stream ends when that credential is revoked; "" for an
// unauthenticated request.
struct RoutedResponse {
  HttpResponse response;
  std::string credential;
};

class WebRoutes {
 public:
  // Everything borrowed. `open_calls` (may be null) learns each session
  // under its credential, so a revoke of the credential ends it.
  WebRoutes(ApiHandler* api, Sessions* sessions, LoginLimiter* limiter,
            const CredentialTable* credentials, OpenCalls* open_calls,
            const StaticFiles* files);

  // The security headers are not added here (AddSecurityHeaders).
  RoutedResponse Handle(const HttpRequest& request);

 private:
  struct Who {
    bool known = false;
    Caller caller;
    std::optional<Session> session;  // set when by cookie
  };
  Who Identify(const HttpRequest& request);
  HttpResponse Login(const HttpRequest& request);
  HttpResponse LoginOnce(const HttpRequest& request);
  HttpResponse Logout(const HttpRequest& request, const Who& who);
  // A session for `caller`, with its Set-Cookie, and `body` its JSON.
  absl::StatusOr<Session> Open(const Caller& caller, HttpResponse* response);
  void ForgetExpired();

  ApiHandler* const api_;
  Sessions* const sessions_;
  LoginLimiter* const limiter_;
  const CredentialTable* const credentials_;
  OpenCalls* const open_calls_;
  const StaticFiles* const files_;
};

// The headers every response carries (CSP, nosniff, no referrer, no
// framing, HSTS; no-store under /api/), added to `response` for a request
// of `path`.
void AddSecurityHeaders(const std::string& path, HttpResponse* response);

// The JSON of a session as login and GET /api/v1/session answer it.
std::string SessionJson(const Session& session);

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_WEB_ROUTES_H_
