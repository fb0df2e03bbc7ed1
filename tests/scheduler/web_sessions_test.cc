// The web face's pure parts with a fake clock: sessions (expiry, logout,
// revocation of a credential), one-time codes (once, two minutes), the
// login limit per address, cookies, request targets and byte ranges; and
// WebRoutes' login, CSRF and page rules against a real CredentialTable.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "scheduler/rpc/credentials.h"
#include "scheduler/web/sessions.h"
#include "scheduler/web/static_files.h"
#include "scheduler/web/web_face.h"
#include "scheduler/web/web_routes.h"
#include "scheduler/web/web_server.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::scheduler::web {
namespace {

Caller User(const std::string& name) {
  Caller c;
  c.user = name;
  c.credential = "user:" + name;
  return c;
}

TEST(SessionsTest, ExpireAfterTheirLifetime) {
  FakeClock clock;
  Sessions sessions(&clock, 1000);
  auto s = sessions.Create(User("ada"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id.size(), 64u);
  EXPECT_EQ(s->csrf.size(), 64u);
  EXPECT_NE(s->id, s->csrf);
  ASSERT_TRUE(sessions.Find(s->id));
  EXPECT_EQ(sessions.Find(s->id)->caller.user, "ada");
  clock.Advance(999);
  EXPECT_TRUE(sessions.Find(s->id));
  clock.Advance(1);
  EXPECT_FALSE(sessions.Find(s->id));
  EXPECT_EQ(sessions.size(), 0u);
}

TEST(SessionsTest, LogoutAndRevokeEndThem) {
  FakeClock clock;
  Sessions sessions(&clock, 60000);
  auto a = sessions.Create(User("ada"), 7);
  auto b = sessions.Create(User("ada"), 8);
  auto c = sessions.Create(User("bob"), 9);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(sessions.Revoke(a->id), std::optional<int64_t>(7));
  EXPECT_FALSE(sessions.Find(a->id));
  EXPECT_FALSE(sessions.Revoke(a->id));
  EXPECT_EQ(sessions.RevokeCredential("user:ada"), std::vector<int64_t>{8});
  EXPECT_FALSE(sessions.Find(b->id));
  EXPECT_TRUE(sessions.Find(c->id));
  EXPECT_FALSE(sessions.Find(""));
  EXPECT_FALSE(sessions.Find(std::string(64, 'a')));
}

TEST(SessionsTest, CsrfMustMatchExactly) {
  FakeClock clock;
  Sessions sessions(&clock, 60000);
  auto s = sessions.Create(User("ada"));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(Sessions::CsrfMatches(*s, s->csrf));
  EXPECT_FALSE(Sessions::CsrfMatches(*s, ""));
  EXPECT_FALSE(Sessions::CsrfMatches(*s, s->csrf.substr(1)));
  std::string wrong = s->csrf;
  wrong[10] = wrong[10] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(Sessions::CsrfMatches(*s, wrong));
}

TEST(SessionsTest, OnceCodesWorkOnceWithinTwoMinutes) {
  FakeClock clock;
  Sessions sessions(&clock, 60000);
  auto code = sessions.CreateOnceCode(User("ada"));
  ASSERT_TRUE(code.ok());
  auto caller = sessions.RedeemOnceCode(*code);
  ASSERT_TRUE(caller);
  EXPECT_EQ(caller->user, "ada");
  EXPECT_FALSE(sessions.RedeemOnceCode(*code));
  auto late = sessions.CreateOnceCode(User("ada"));
  ASSERT_TRUE(late.ok());
  clock.Advance(Sessions::kOnceCodeMs);
  EXPECT_FALSE(sessions.RedeemOnceCode(*late));
  auto revoked = sessions.CreateOnceCode(User("bob"));
  ASSERT_TRUE(revoked.ok());
  sessions.RevokeCredential("user:bob");
  EXPECT_FALSE(sessions.RedeemOnceCode(*revoked));
}

TEST(SessionsTest, PruneHandsBackTheExpiredTags) {
  FakeClock clock;
  Sessions sessions(&clock, 1000);
  ASSERT_TRUE(sessions.Create(User("ada"), 3).ok());
  clock.Advance(500);
  ASSERT_TRUE(sessions.Create(User("bob"), 4).ok());
  clock.Advance(600);
  EXPECT_EQ(sessions.Prune(), std::vector<int64_t>{3});
  EXPECT_EQ(sessions.size(), 1u);
}

TEST(LoginLimiterTest, TenFailuresAMinuteThenWait) {
  FakeClock clock;
  LoginLimiter limiter(&clock, 10, 60000);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(limiter.RetryAfterSeconds("10.0.0.1"), 0) << i;
    limiter.RecordFailure("10.0.0.1");
    clock.Advance(1000);
  }
  // The first failure was 10 s ago: free again in 50 s.
  EXPECT_EQ(limiter.RetryAfterSeconds("10.0.0.1"), 50);
  EXPECT_EQ(limiter.RetryAfterSeconds("10.0.0.2"), 0);
  clock.Advance(50000);
  EXPECT_EQ(limiter.RetryAfterSeconds("10.0.0.1"), 0);
}

TEST(LoginLimiterTest, ForgetsAddressesPastItsCap) {
  FakeClock clock;
  LoginLimiter limiter(&clock, 1, 60000, /*max_addresses=*/2);
  limiter.RecordFailure("a");
  limiter.RecordFailure("b");
  limiter.RecordFailure("c");
  EXPECT_GT(limiter.RetryAfterSeconds("c"), 0);
}

TEST(CookieTest, FindsTheNamedValue) {
  EXPECT_EQ(CookieValue("a=1; dlbatch_session=xyz; b=2", "dlbatch_session"),
            "xyz");
  EXPECT_EQ(CookieValue("dlbatch_session=\"q\"", "dlbatch_session"), "q");
  EXPECT_EQ(CookieValue("xdlbatch_session=1", "dlbatch_session"), "");
  EXPECT_EQ(CookieValue("", "dlbatch_session"), "");
  EXPECT_EQ(CookieValue(";;=;dlbatch_session", "dlbatch_session"), "");
}

TEST(TargetTest, DecodesPathAndQuery) {
  HttpRequest r;
  ASSERT_TRUE(ParseTarget("/api/v1/jobs%2F1?q=a+b%21&mine=1&flag", &r));
  EXPECT_EQ(r.path, "/api/v1/jobs/1");
  EXPECT_EQ(r.Query("q"), "a b!");
  EXPECT_EQ(r.Query("mine"), "1");
  EXPECT_TRUE(r.HasQuery("flag"));
  EXPECT_FALSE(ParseTarget("http://x/", &r));
  EXPECT_FALSE(ParseTarget("/a%00b", &r));
  EXPECT_FALSE(ParseTarget("/a%4", &r));
  EXPECT_FALSE(ParseTarget("/a%zz", &r));
  EXPECT_FALSE(ParseTarget("", &r));
}

TEST(RangeTest, ParsesTheThreeForms) {
  ByteRange r = ParseRange("bytes=0-9", 100);
  EXPECT_EQ(r.kind, ByteRange::kPartial);
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.last, 9);
  r = ParseRange("bytes=90-", 100);
  EXPECT_EQ(r.kind, ByteRange::kPartial);
  EXPECT_EQ(r.first, 90);
  EXPECT_EQ(r.last, 99);
  r = ParseRange("bytes=-10", 100);
  EXPECT_EQ(r.first, 90);
  EXPECT_EQ(r.last, 99);
  r = ParseRange("bytes=-1000", 100);
  EXPECT_EQ(r.first, 0);
  r = ParseRange("bytes=50-5000", 100);
  EXPECT_EQ(r.last, 99);
  EXPECT_EQ(ParseRange("bytes=100-", 100).kind, ByteRange::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=-0", 100).kind, ByteRange::kUnsatisfiable);
  EXPECT_EQ(ParseRange("", 100).kind, ByteRange::kWhole);
  EXPECT_EQ(ParseRange("bytes=9-1", 100).kind, ByteRange::kWhole);
  EXPECT_EQ(ParseRange("bytes=0-1,5-6", 100).kind, ByteRange::kWhole);
  EXPECT_EQ(ParseRange("items=0-1", 100).kind, ByteRange::kWhole);
  EXPECT_EQ(ParseRange("bytes=x-1", 100).kind, ByteRange::kWhole);
  EXPECT_EQ(ParseRange("bytes=99999999999999999999-", 100).kind,
            ByteRange::kWhole);
}

TEST(StaticFilesTest, TypesAndUnsafeNames) {
  EXPECT_EQ(ContentTypeFor("app.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(ContentTypeFor("a.WOFF2"), "font/woff2");
  EXPECT_EQ(ContentTypeFor("a.map"), "application/json");
  EXPECT_EQ(ContentTypeFor("noext"), "application/octet-stream");
  StaticFiles files("/nonexistent-folder");
  EXPECT_EQ(files.Asset("../../etc/passwd").status, 404);
  // No index.html: the built-in page, never an error.
  HttpResponse index = files.Index();
  EXPECT_EQ(index.status, 200);
  EXPECT_NE(index.body.find("were not built"), std::string::npos);
}

// An API that says who called.
class EchoApi final : public ApiHandler {
 public:
  HttpResponse Handle(const HttpRequest& request,
                      const Caller& caller) override {
    HttpResponse r;
    r.body =
        nlohmann::json{{"user", caller.user}, {"path", request.path}}.dump();
    return r;
  }
};

class RoutesTest : public ::testing::Test {
 protected:
  RoutesTest()
      : sessions_(&clock_, 3600 * 1000),
        limiter_(&clock_),
        files_("/nonexistent-folder"),
        routes_(&api_, &sessions_, &limiter_, &credentials_, &calls_, &files_) {
    CredentialRecord ada;
    ada.name = "ada";
    ada.token_sha256 = TokenSha256("dlbu_ada");
    CredentialRecord worker;
    worker.name = "w";
    worker.worker = true;
    worker.token_sha256 = TokenSha256("dlbw_w");
    credentials_.Reset({ada, worker});
  }
  HttpResponse Do(const std::string& method, const std::string& path,
                  std::map<std::string, std::string> headers = {},
                  const std::string& body = "") {
    HttpRequest r;
    r.method = method;
    EXPECT_TRUE(ParseTarget(path, &r));
    r.headers = std::move(headers);
    r.body = body;
    r.peer = "10.1.1.1";
    return routes_.Handle(r).response;
  }
  static std::string Header(const HttpResponse& r, const std::string& name) {
    for (const auto& [k, v] : r.headers)
      if (k == name) return v;
    return "";
  }
  // Logs in as ada: the cookie header and the CSRF token.
  std::pair<std::string, std::string> LogIn() {
    HttpResponse r =
        Do("POST", "/api/v1/login", {}, R"({"token": "dlbu_ada"})");
    EXPECT_EQ(r.status, 200) << r.body;
    std::string cookie = Header(r, "Set-Cookie");
    auto body = nlohmann::json::parse(r.body);
    return {cookie.substr(0, cookie.find(';')), body["csrf"]};
  }

  FakeClock clock_;
  CredentialTable credentials_;
  OpenCalls calls_;
  EchoApi api_;
  Sessions sessions_;
  LoginLimiter limiter_;
  StaticFiles files_;
  WebRoutes routes_;
};

TEST_F(RoutesTest, LoginSetsAStrictCookie) {
  HttpResponse r = Do("POST", "/api/v1/login", {}, R"({"token":"dlbu_ada"})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string cookie = Header(r, "Set-Cookie");
  EXPECT_NE(cookie.find("dlbatch_session="), std::string::npos);
  for (const char* attr :
       {"HttpOnly", "Secure", "SameSite=Strict", "Path=/", "Max-Age=3600"}) {
    EXPECT_NE(cookie.find(attr), std::string::npos) << attr;
  }
  auto body = nlohmann::json::parse(r.body);
  EXPECT_EQ(body["user"], "ada");
  EXPECT_EQ(body["admin"], false);
  EXPECT_EQ(body["expires"], "2023-11-14T23:13:20Z");
}

TEST_F(RoutesTest, BadTokensWorkersAndBadBodiesAreRefused) {
  EXPECT_EQ(Do("POST", "/api/v1/login", {}, R"({"token":"nope"})").status, 401);
  EXPECT_EQ(Do("POST", "/api/v1/login", {}, R"({"token":"dlbw_w"})").status,
            403);
  EXPECT_EQ(Do("POST", "/api/v1/login", {}, "not json").status, 400);
  EXPECT_EQ(Do("POST", "/api/v1/login", {}, R"({"token":5})").status, 400);
  EXPECT_EQ(Do("GET", "/api/v1/login").status, 400);
}

TEST_F(RoutesTest, TheEleventhBadLoginWaits) {
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(Do("POST", "/api/v1/login", {}, R"({"token":"x"})").status, 401);
  }
  HttpResponse r = Do("POST", "/api/v1/login", {}, R"({"token":"dlbu_ada"})");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(Header(r, "Retry-After"), "60");
  clock_.Advance(60000);
  EXPECT_EQ(Do("POST", "/api/v1/login", {}, R"({"token":"dlbu_ada"})").status,
            200);
}

TEST_F(RoutesTest, CookieNeedsCsrfToChangeState) {
  auto [cookie, csrf] = LogIn();
  HttpResponse get = Do("GET", "/api/v1/jobs", {{"cookie", cookie}});
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(nlohmann::json::parse(get.body)["user"], "ada");
  EXPECT_EQ(Do("POST", "/api/v1/jobs/1/cancel", {{"cookie", cookie}}).status,
            403);
  EXPECT_EQ(Do("POST", "/api/v1/jobs/1/cancel",
               {{"cookie", cookie}, {"x-csrf-token", "0" + csrf.substr(1)}})
                .status,
            csrf[0] == '0' ? 200 : 403);
  EXPECT_EQ(Do("POST", "/api/v1/jobs/1/cancel",
               {{"cookie", cookie}, {"x-csrf-token", csrf}})
                .status,
            200);
  auto session = Do("GET", "/api/v1/session", {{"cookie", cookie}});
  EXPECT_EQ(nlohmann::json::parse(session.body)["csrf"], csrf);
  EXPECT_EQ(Do("POST", "/api/v1/logout", {{"cookie", cookie}}).status, 403);
  EXPECT_EQ(
      Do("POST", "/api/v1/logout", {{"cookie", cookie}, {"x-csrf-token", csrf}})
          .status,
      204);
  EXPECT_EQ(Do("GET", "/api/v1/jobs", {{"cookie", cookie}}).status, 401);
}

TEST_F(RoutesTest, BearerNeedsNoCsrfAndWorkersNoEntry) {
  EXPECT_EQ(Do("POST", "/api/v1/jobs/1/cancel",
               {{"authorization", "Bearer dlbu_ada"}})
                .status,
            200);
  EXPECT_EQ(
      Do("GET", "/api/v1/jobs", {{"authorization", "Bearer dlbw_w"}}).status,
      401);
  EXPECT_EQ(
      Do("GET", "/api/v1/jobs", {{"authorization", "Bearer nope"}}).status,
      401);
}

TEST_F(RoutesTest, RevokingTheCredentialEndsItsSessions) {
  auto [cookie, csrf] = LogIn();
  EXPECT_EQ(Do("GET", "/api/v1/jobs", {{"cookie", cookie}}).status, 200);
  EXPECT_EQ(calls_.EndAll("user:ada"), 1);
  EXPECT_EQ(Do("GET", "/api/v1/jobs", {{"cookie", cookie}}).status, 401);
}

TEST_F(RoutesTest, ExpiredSessionsAreRefused) {
  auto [cookie, csrf] = LogIn();
  clock_.Advance(3600 * 1000);
  EXPECT_EQ(Do("GET", "/api/v1/session", {{"cookie", cookie}}).status, 401);
}

TEST_F(RoutesTest, PagesNeedALoginAssetsDoNot) {
  // Without a login every page is the login page (here the built-in one).
  HttpResponse page = Do("GET", "/some/page");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(Do("GET", "/assets/app.js").status, 404);  // none built
  EXPECT_EQ(Do("POST", "/some/page").status, 405);
}

TEST_F(RoutesTest, OnceCodeLogsInOnce) {
  auto code = sessions_.CreateOnceCode(
      CallerFromCredential(*credentials_.FindByToken("dlbu_ada")));
  ASSERT_TRUE(code.ok());
  HttpResponse r = Do("GET", "/login?once=" + *code);
  EXPECT_EQ(r.status, 303);
  EXPECT_EQ(Header(r, "Location"), "/");
  EXPECT_NE(Header(r, "Set-Cookie").find("HttpOnly"), std::string::npos);
  EXPECT_EQ(Do("GET", "/login?once=" + *code).status, 401);
}

TEST(SecurityHeadersTest, EveryResponseCarriesThem) {
  HttpResponse r;
  r.headers.emplace_back("Cache-Control", "max-age=60");
  AddSecurityHeaders("/api/v1/jobs", &r);
  std::map<std::string, std::string> h(r.headers.begin(), r.headers.end());
  EXPECT_EQ(h["Content-Security-Policy"],
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
            "form-action 'self'");
  EXPECT_EQ(h["X-Content-Type-Options"], "nosniff");
  EXPECT_EQ(h["Referrer-Policy"], "no-referrer");
  EXPECT_EQ(h["X-Frame-Options"], "DENY");
  EXPECT_EQ(h["Cache-Control"], "no-store");
  EXPECT_FALSE(h["Strict-Transport-Security"].empty());
}

}  // namespace
}  // namespace dlbatch::scheduler::web
