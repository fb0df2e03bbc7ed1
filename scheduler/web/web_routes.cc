#include "scheduler/web/web_routes.h"

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler::web {
namespace {

bool ChangesState(const std::string& method) {
  return method != "GET" && method != "HEAD" && method != "OPTIONS";
}

HttpResponse Error(absl::StatusCode code, std::string message) {
  return ErrorResponse(absl::Status(code, message));
}

std::string Rfc3339(int64_t ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(ms),
                          absl::UTCTimeZone());
}

std::string Cookie(const std::string& value, int64_t max_age_s) {
  return absl::StrCat(
      kSessionCookie, "=", value,
      "; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=", max_age_s);
}

// The token of "Authorization: Bearer TOKEN"; "" if none.
std::string BearerToken(const HttpRequest& request) {
  std::string value = request.Header("authorization");
  absl::string_view v = absl::StripAsciiWhitespace(value);
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer "))
    return "";
  return std::string(absl::StripAsciiWhitespace(v.substr(7)));
}

constexpr char kBadToken[] =
    "the token is not valid (revoked, or never issued); paste a token an "
    "admin made with `dlbatch admin user add NAME`, or run `dlbatch web`";
constexpr char kWorkerToken[] =
    "a worker credential cannot log in to the web face; use a user's token";

}  // namespace

void AddSecurityHeaders(const std::string& path, HttpResponse* response) {
  auto& h = response->headers;
  h.emplace_back("Content-Security-Policy",
                 "default-src 'self'; frame-ancestors 'none'; base-uri "
                 "'none'; form-action 'self'");
  h.emplace_back("X-Content-Type-Options", "nosniff");
  h.emplace_back("Referrer-Policy", "no-referrer");
  h.emplace_back("X-Frame-Options", "DENY");
  h.emplace_back("Strict-Transport-Security", "max-age=31536000");
  if (absl::StartsWith(path, "/api/")) {
    for (auto it = h.begin(); it != h.end();) {
      it = absl::EqualsIgnoreCase(it->first, "Cache-Control") ? h.erase(it)
                                                              : it + 1;
    }
    h.emplace_back("Cache-Control", "no-store");
  }
}

std::string SessionJson(const Session& session) {
  nlohmann::json body = {{"user", session.caller.user},
                         {"admin", session.caller.admin},
                         {"csrf", session.csrf}};
  if (session.expires_ms > 0) {
    body["expires"] = Rfc3339(session.expires_ms);
  } else {
    body["expires"] = nullptr;
  }
  return body.dump();
}

WebRoutes::WebRoutes(ApiHandler* api, Sessions* sessions, LoginLimiter* limiter,
                     const CredentialTable* credentials, OpenCalls* open_calls,
                     const StaticFiles* files)
    : api_(api),
      sessions_(sessions),
      limiter_(limiter),
      credentials_(credentials),
      open_calls_(open_calls),
      files_(files) {}

WebRoutes::Who WebRoutes::Identify(const HttpRequest& request) {
  Who who;
  std::string bearer = BearerToken(request);
  if (!bearer.empty()) {
    std::optional<CredentialRecord> found = credentials_->FindByToken(bearer);
    if (!found) return who;
    Caller caller = CallerFromCredential(*found);
    if (caller.worker) return who;
    who.known = true;
    who.caller = std::move(caller);
    return who;
  }
  std::string id = CookieValue(request.Header("cookie"), kSessionCookie);
  if (id.empty()) return who;
  who.session = sessions_->Find(id);
  if (!who.session) return who;
  who.known = true;
  who.caller = who.session->caller;
  return who;
}

void WebRoutes::ForgetExpired() {
  for (int64_t tag : sessions_->Prune()) {
    if (open_calls_ != nullptr && tag != 0) open_calls_->Remove(tag);
  }
}

absl::StatusOr<Session> WebRoutes::Open(const Caller& caller,
                                        HttpResponse* response) {
  ForgetExpired();
  int64_t tag = 0;
  if (open_calls_ != nullptr) {
    // A revoke of the credential (dlbatch admin user revoke) ends every
    // session of it, as it ends the credential's gRPC streams.
    Sessions* sessions = sessions_;
    OpenCalls* calls = open_calls_;
    std::string key = caller.credential;
    tag = open_calls_->Add(key, [sessions, calls, key] {
      for (int64_t t : sessions->RevokeCredential(key)) calls->Remove(t);
    });
  }
  absl::StatusOr<Session> session = sessions_->Create(caller, tag);
  if (!session.ok()) {
    if (tag != 0) open_calls_->Remove(tag);
    return session.status();
  }
  response->headers.emplace_back(
      "Set-Cookie", Cookie(session->id, sessions_->lifetime_ms() / 1000));
  return session;
}

HttpResponse WebRoutes::Login(const HttpRequest& request) {
  if (request.method != "POST") {
    return Error(absl::StatusCode::kInvalidArgument,
                 "log in with POST /api/v1/login and {\"token\": \"...\"}");
  }
  if (int64_t wait = limiter_->RetryAfterSeconds(request.peer); wait > 0) {
    HttpResponse r =
        Error(absl::StatusCode::kResourceExhausted,
              absl::StrCat("too many failed logins from ", request.peer,
                           "; try again in ", wait, " s"));
    r.headers.emplace_back("Retry-After", absl::StrCat(wait));
    return r;
  }
  auto body = nlohmann::json::parse(request.body, nullptr,
                                    /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object() || !body.contains("token") ||
      !body["token"].is_string()) {
    return Error(absl::StatusCode::kInvalidArgument,
                 "the body must be JSON {\"token\": \"...\"}");
  }
  std::optional<CredentialRecord> found =
      credentials_->FindByToken(body["token"].get<std::string>());
  if (!found) {
    limiter_->RecordFailure(request.peer);
    spdlog::info("web login refused from {}: not a valid token", request.peer);
    return Error(absl::StatusCode::kUnauthenticated, kBadToken);
  }
  Caller caller = CallerFromCredential(*found);
  if (caller.worker) {
    limiter_->RecordFailure(request.peer);
    return Error(absl::StatusCode::kPermissionDenied, kWorkerToken);
  }
  HttpResponse r;
  absl::StatusOr<Session> session = Open(caller, &r);
  if (!session.ok()) return ErrorResponse(session.status());
  spdlog::info("web login of {} from {}", caller.user, request.peer);
  r.body = SessionJson(*session);
  return r;
}

HttpResponse WebRoutes::LoginOnce(const HttpRequest& request) {
  if (int64_t wait = limiter_->RetryAfterSeconds(request.peer); wait > 0) {
    HttpResponse r = files_->LoginPage();
    r.status = 429;
    r.headers.emplace_back("Retry-After", absl::StrCat(wait));
    return r;
  }
  std::optional<Caller> caller =
      sessions_->RedeemOnceCode(request.Query("once"));
  if (!caller) {
    limiter_->RecordFailure(request.peer);
    spdlog::info("web login refused from {}: a used or expired login URL",
                 request.peer);
    // The login page, saying nothing of why: run `dlbatch web` again.
    HttpResponse r = files_->LoginPage();
    r.status = 401;
    return r;
  }
  HttpResponse r;
  absl::StatusOr<Session> session = Open(*caller, &r);
  if (!session.ok()) return ErrorResponse(session.status());
  spdlog::info("web login of {} from {} (dlbatch web)", caller->user,
               request.peer);
  r.status = 303;
  r.content_type = "text/plain; charset=utf-8";
  r.headers.emplace_back("Location", "/");
  return r;
}

HttpResponse WebRoutes::Logout(const HttpRequest& request, const Who& who) {
  if (request.method != "POST") {
    return Error(absl::StatusCode::kInvalidArgument,
                 "log out with POST /api/v1/logout");
  }
  HttpResponse r;
  r.status = 204;
  r.content_type.clear();
  if (who.session) {
    std::optional<int64_t> tag = sessions_->Revoke(
        CookieValue(request.Header("cookie"), kSessionCookie));
    if (tag && *tag != 0 && open_calls_ != nullptr) open_calls_->Remove(*tag);
  }
  r.headers.emplace_back("Set-Cookie", Cookie("", 0));
  return r;
}

RoutedResponse WebRoutes::Handle(const HttpRequest& request) {
  RoutedResponse out;
  const std::string& path = request.path;
  if (absl::StartsWith(path, "/api/")) {
    if (path == "/api/v1/login") {
      out.response = Login(request);
      return out;
    }
    Who who = Identify(request);
    if (!who.known) {
      out.response =
          Error(absl::StatusCode::kUnauthenticated,
                "log in first: POST /api/v1/login with a token, or send "
                "Authorization: Bearer TOKEN");
      return out;
    }
    // A cookie rides along with any request the browser makes, a forged
    // one's included; the CSRF token only the page's own script can read.
    if (who.session && ChangesState(request.method) &&
        !Sessions::CsrfMatches(*who.session, request.Header("x-csrf-token"))) {
      out.response = Error(absl::StatusCode::kPermissionDenied,
                           "missing or wrong X-CSRF-Token header (the csrf "
                           "value of GET /api/v1/session)");
      return out;
    }
    out.credential = who.caller.credential;
    if (path == "/api/v1/logout") {
      out.response = Logout(request, who);
    } else if (path == "/api/v1/session") {
      Session shown;
      if (who.session) {
        shown = *who.session;
      } else {
        shown.caller = who.caller;
      }
      out.response.body = SessionJson(shown);
    } else {
      out.response = api_->Handle(request, who.caller);
    }
    return out;
  }
  if (path == "/login" && request.HasQuery("once")) {
    out.response = LoginOnce(request);
    return out;
  }
  if (absl::StartsWith(path, "/assets/")) {
    out.response = files_->Asset(path.substr(8));
    return out;
  }
  if (request.method != "GET" && request.method != "HEAD") {
    out.response = Error(absl::StatusCode::kInvalidArgument,
                         "pages are read with GET; the API is under /api/v1/");
    out.response.status = 405;
    return out;
  }
  // Every other path is a page of the single-page app, for those logged
  // in; the others get the login page.
  Who who = Identify(request);
  out.response =
      who.known && path != "/login" ? files_->Index() : files_->LoginPage();
  return out;
}

}  // namespace dlbatch::scheduler::web
