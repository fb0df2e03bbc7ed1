// The web face of a real dlbatch-scheduler (--web-listen 127.0.0.1:0),
// talked to over HTTPS with curl trusting the scheduler's own CA: the
// security headers, login with a real token (a strict cookie), refusals
// (a wrong token, the eleventh bad login, a missing CSRF token, a logged
// out cookie), pages and assets for those not logged in, no path out of
// the assets folder, a body over the limit, garbage on the socket, a file
// served by ranges, and `dlbatch web`'s one-time URL (used once), or its
// message where the scheduler serves no web face; and the REST API's rules
// of who sees and does what, through the server.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

std::string Trim(std::string s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.pop_back();
  return s;
}

class WebServerTest : public ::testing::Test {
 protected:
  // Where the scheduler's gRPC listens: "" a Unix socket, else TCP.
  virtual std::string Listen() const { return ""; }

  void SetUp() override {
    assets_ = c_.dir() + "/web";
    std::filesystem::create_directories(assets_ + "/assets");
    WriteAll(assets_ + "/index.html", "<!doctype html><p>the app</p>");
    WriteAll(assets_ + "/login.html", "<!doctype html><p>please log in</p>");
    std::string big;
    for (int i = 0; i < 100000; ++i) big += static_cast<char>('a' + i % 26);
    WriteAll(assets_ + "/assets/app.js", big);
    std::filesystem::create_symlink("/etc/passwd", assets_ + "/assets/out.js");
    c_.StartScheduler({"--web-listen", "127.0.0.1:0", "--web-assets", assets_},
                      Listen());
    port_ = WebPort();
    ASSERT_GT(port_, 0) << c_.Logs();
  }

  // The port of the log's "web face on https://127.0.0.1:PORT".
  int WebPort() {
    std::string log = ReadAll(c_.dir() + "/scheduler.log");
    const std::string mark = "web face on https://127.0.0.1:";
    size_t at = log.find(mark);
    if (at == std::string::npos) return 0;
    return std::atoi(log.c_str() + at + mark.size());
  }
  std::string Url(const std::string& path) const {
    return "https://127.0.0.1:" + std::to_string(port_) + path;
  }

  // curl with the scheduler's CA; `args` before the URL.
  Reply Curl(const std::string& url, std::vector<std::string> args = {}) {
    std::vector<std::string> argv = {"curl",     "-s",
                                     "--cacert", c_.ca_file(),
                                     "-D",       c_.dir() + "/headers",
                                     "-o",       c_.dir() + "/body",
                                     "-w",       "%{http_code}"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(url);
    std::remove((c_.dir() + "/headers").c_str());
    std::remove((c_.dir() + "/body").c_str());
    Result r = Exec(argv, {}, 30000);
    Reply reply;
    reply.status = std::atoi(r.out.c_str());
    reply.body = ReadAll(c_.dir() + "/body");
    std::string head = ReadAll(c_.dir() + "/headers");
    size_t pos = 0;
    while (pos < head.size()) {
      size_t end = head.find("\r\n", pos);
      if (end == std::string::npos) end = head.size();
      std::string line = head.substr(pos, end - pos);
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& ch : name) ch = static_cast<char>(tolower(ch));
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value[0] == ' ') value.erase(0, 1);
        reply.headers[name] = value;
      }
      pos = end + 2;
    }
    return reply;
  }
  Reply Login(const std::string& token) {
    return Curl(Url("/api/v1/login"),
                {"-X", "POST", "-H", "Content-Type: application/json",
                 "--data-binary", nlohmann::json{{"token", token}}.dump()});
  }
  // A user's token, made by the scheduler's user on its socket.
  std::string NewToken(const std::string& name) {
    Result r = c_.Cli({"admin", "user", "add", name});
    EXPECT_EQ(r.code, 0) << r.err;
    return Trim(r.out);
  }

  Cluster c_;
  std::string assets_;
  int port_ = 0;
};

TEST_F(WebServerTest, EveryResponseCarriesTheSecurityHeaders) {
  for (const std::string path : {"/", "/api/v1/jobs", "/assets/app.js"}) {
    Reply r = Curl(Url(path));
    ASSERT_NE(r.status, 0) << path << c_.Logs();
    EXPECT_EQ(r.headers["content-security-policy"],
              "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
              "form-action 'self'")
        << path;
    EXPECT_EQ(r.headers["x-content-type-options"], "nosniff") << path;
    EXPECT_EQ(r.headers["referrer-policy"], "no-referrer") << path;
    EXPECT_EQ(r.headers["x-frame-options"], "DENY") << path;
    EXPECT_FALSE(r.headers["strict-transport-security"].empty()) << path;
  }
  EXPECT_EQ(Curl(Url("/api/v1/jobs")).headers["cache-control"], "no-store");
}

TEST_F(WebServerTest, LoginLogoutAndTheirRefusals) {
  std::string token = NewToken("ada");
  ASSERT_FALSE(token.empty());
  Reply in = Login(token);
  ASSERT_EQ(in.status, 200) << in.body;
  std::string cookie = in.headers["set-cookie"];
  for (const char* attr : {"dlbatch_session=", "HttpOnly", "Secure",
                           "SameSite=Strict", "Path=/", "Max-Age=43200"}) {
    EXPECT_NE(cookie.find(attr), std::string::npos) << attr << " in " << cookie;
  }
  auto body = nlohmann::json::parse(in.body);
  EXPECT_EQ(body["user"], "ada");
  std::string csrf = body["csrf"];
  std::string jar = "Cookie: " + cookie.substr(0, cookie.find(';'));
  // The token never reaches the log.
  EXPECT_EQ(ReadAll(c_.dir() + "/scheduler.log").find(token),
            std::string::npos);

  Reply session = Curl(Url("/api/v1/session"), {"-H", jar});
  EXPECT_EQ(session.status, 200);
  EXPECT_EQ(nlohmann::json::parse(session.body)["csrf"], csrf);
  // Logged in, a page is the app; a bearer token reaches the API too.
  EXPECT_EQ(Curl(Url("/jobs/12"), {"-H", jar}).body,
            "<!doctype html><p>the app</p>");
  Reply jobs =
      Curl(Url("/api/v1/jobs"), {"-H", "Authorization: Bearer " + token});
  EXPECT_EQ(jobs.status, 200) << jobs.body;
  EXPECT_EQ(nlohmann::json::parse(jobs.body)["total"], 0);

  EXPECT_EQ(Curl(Url("/api/v1/logout"), {"-X", "POST", "-H", jar}).status, 403);
  EXPECT_EQ(Curl(Url("/api/v1/logout"),
                 {"-X", "POST", "-H", jar, "-H", "X-CSRF-Token: " + csrf})
                .status,
            204);
  EXPECT_EQ(Curl(Url("/api/v1/session"), {"-H", jar}).status, 401);

  // A revoke ends the sessions of the token.
  Reply again = Login(token);
  ASSERT_EQ(again.status, 200);
  std::string jar2 = "Cookie: " + again.headers["set-cookie"].substr(
                                      0, again.headers["set-cookie"].find(';'));
  EXPECT_EQ(Curl(Url("/api/v1/session"), {"-H", jar2}).status, 200);
  ASSERT_EQ(c_.Cli({"admin", "user", "revoke", "ada"}).code, 0);
  EXPECT_EQ(Curl(Url("/api/v1/session"), {"-H", jar2}).status, 401);

  EXPECT_EQ(Login("dlbu_wrong").status, 401);
  int status = 0;
  for (int i = 0; i < 11 && status != 429; ++i) status = Login("bad").status;
  EXPECT_EQ(status, 429);
  Reply limited = Login(NewToken("bob"));
  EXPECT_EQ(limited.status, 429);
  EXPECT_FALSE(limited.headers["retry-after"].empty());
}

TEST_F(WebServerTest, StrangersGetTheLoginPageAndAssetsOnly) {
  Reply api = Curl(Url("/api/v1/jobs"));
  EXPECT_EQ(api.status, 401);
  EXPECT_EQ(nlohmann::json::parse(api.body)["error"]["code"],
            "UNAUTHENTICATED");
  Reply page = Curl(Url("/some/page"));
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.body, "<!doctype html><p>please log in</p>");
  Reply js = Curl(Url("/assets/app.js"));
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.body.size(), 100000u);
  EXPECT_EQ(js.headers["content-type"], "text/javascript; charset=utf-8");
  EXPECT_EQ(js.headers["accept-ranges"], "bytes");
  for (const std::string path :
       {"/assets/../../etc/passwd", "/assets/%2e%2e/%2e%2e/etc/passwd",
        "/assets/out.js", "/assets/", "/assets/%00x"}) {
    Reply r = Curl(Url(path), {"--path-as-is"});
    EXPECT_TRUE(r.status == 404 || r.status == 400) << path << " " << r.status;
    EXPECT_EQ(r.body.find("root:"), std::string::npos) << path;
  }
}

TEST_F(WebServerTest, FilesAreServedByRanges) {
  Reply part = Curl(Url("/assets/app.js"), {"-H", "Range: bytes=26-51"});
  EXPECT_EQ(part.status, 206);
  EXPECT_EQ(part.body, "abcdefghijklmnopqrstuvwxyz");
  EXPECT_EQ(part.headers["content-range"], "bytes 26-51/100000");
  Reply tail = Curl(Url("/assets/app.js"), {"-H", "Range: bytes=-4"});
  EXPECT_EQ(tail.status, 206);
  EXPECT_EQ(tail.body.size(), 4u);
  Reply past = Curl(Url("/assets/app.js"), {"-H", "Range: bytes=100000-"});
  EXPECT_EQ(past.status, 416);
  EXPECT_EQ(past.headers["content-range"], "bytes */100000");
}

TEST_F(WebServerTest, BadRequestsNeverStopIt) {
  std::string big(2 << 20, 'x');
  WriteAll(c_.dir() + "/big", big);
  Reply r = Curl(Url("/api/v1/login"),
                 {"-X", "POST", "--data-binary", "@" + c_.dir() + "/big"});
  EXPECT_EQ(r.status, 413);
  // Garbage in place of a TLS handshake, and garbage inside TLS.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string junk(5000, '\x16');
  for (size_t i = 0; i < junk.size(); i += 7) junk[i] = static_cast<char>(i);
  (void)!::write(fd, junk.data(), junk.size());
  ::close(fd);
  Result garbage =
      Exec({"sh", "-c",
            "printf 'GARBAGE \\001\\002 nonsense\\r\\n\\r\\n' | timeout 10 "
            "openssl s_client -quiet -connect 127.0.0.1:" +
                std::to_string(port_) + " 2>/dev/null"},
           {}, 20000);
  EXPECT_NE(garbage.out.find("400 Bad Request"), std::string::npos)
      << garbage.out;
  EXPECT_EQ(Curl(Url("/")).status, 200) << c_.Logs();
}

TEST_F(WebServerTest, DlbatchWebLogsInOnce) {
  Result web = c_.Cli({"web", "--json"});
  ASSERT_EQ(web.code, 0) << web.err;
  auto j = nlohmann::json::parse(web.out);
  std::string url = j["url"];
  EXPECT_EQ(j["ca_file"], c_.ca_file());
  EXPECT_EQ(url.rfind(Url("/login?once="), 0), 0u) << url;
  Reply first = Curl(url);
  EXPECT_EQ(first.status, 303);
  EXPECT_EQ(first.headers["location"], "/");
  EXPECT_NE(first.headers["set-cookie"].find("HttpOnly"), std::string::npos);
  std::string jar = "Cookie: " + first.headers["set-cookie"].substr(
                                     0, first.headers["set-cookie"].find(';'));
  EXPECT_EQ(Curl(Url("/api/v1/session"), {"-H", jar}).status, 200);
  Reply second = Curl(url);
  EXPECT_EQ(second.status, 401);
  EXPECT_TRUE(second.headers["set-cookie"].empty());

  Result plain = c_.Cli({"web"});
  EXPECT_EQ(plain.code, 0);
  EXPECT_EQ(plain.out.rfind(Url("/login?once="), 0), 0u) << plain.out;
}

// The REST API's rules through the real HTTPS server, users by their
// tokens (TCP; nobody owns the job, daemon is the other user): a job, its
// outputs, diary and progress for its owner and an admin, 403 for another user;
// one job's action refused to the other user (bearer token or session and CSRF
// token alike) and the job unchanged, taken by its owner's session and by an
// admin; the bulk form answering the other user per job.
class WebApiOverHttpsTest : public WebServerTest {
 protected:
  std::string Listen() const override { return "127.0.0.1:0"; }
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root: the job's owner and the other user are "
                      "nobody and daemon, whose jobs a root worker takes";
    }
    WebServerTest::SetUp();
    if (HasFatalFailure()) return;
    admin_ = Trim(ReadAll(c_.scheduler_state() + "/token"));
    // The CLI and the worker present the first admin's token.
    setenv("DLBATCH_TOKEN", admin_.c_str(), 1);
  }
  void TearDown() override { unsetenv("DLBATCH_TOKEN"); }

  Reply Bearer(const std::string& token, const std::string& path,
               std::vector<std::string> args = {}) {
    args.insert(args.end(), {"-H", "Authorization: Bearer " + token});
    return Curl(Url(path), args);
  }
  std::string State(int64_t id) {
    Reply r = Bearer(admin_, "/api/v1/jobs/" + std::to_string(id));
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("state")) return r.body;
    return std::string(j["state"]) + (j.value("held", false) ? ",held" : "");
  }

  std::string admin_;
};

TEST_F(WebApiOverHttpsTest, OwnerOtherUserAndAdmin) {
  const std::string ada = NewToken("nobody");
  const std::string bob = NewToken("daemon");
  ASSERT_FALSE(ada.empty());
  ASSERT_FALSE(bob.empty());
  // A drained worker: the job stays queued, whoever may run it.
  c_.StartWorker("parked", 1);
  ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
  ASSERT_EQ(c_.Cli({"admin", "drain", "parked", "--reason", "test"}).code, 0);
  Result submit = c_.Cli(
      {"submit", "-q",
       c_.JobFile(
           "job.yaml",
           "name: nobodys-job\ncommand: [true]\nenv: {SECRET: s3cret}\n")},
      {{"DLBATCH_TOKEN", ada}});
  ASSERT_EQ(submit.code, 0) << submit.err;
  const int64_t id = std::stoll(submit.out);
  const std::string job = "/api/v1/jobs/" + std::to_string(id);

  for (const std::string path :
       {job, job + "/outputs", job + "/diary", job + "/progress"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(Bearer(ada, path).status, 200);
    EXPECT_EQ(Bearer(admin_, path).status, 200);
    Reply other = Bearer(bob, path);
    EXPECT_EQ(other.status, 403) << other.body;
    EXPECT_NE(other.body.find("belongs to nobody"), std::string::npos)
        << other.body;
  }
  EXPECT_EQ(
      nlohmann::json::parse(Bearer(ada, job).body)["spec"]["env"]["SECRET"],
      "s3cret");

  // Another user's action: 403 with a token, and with a session and its
  // CSRF token; the job is as it was.
  EXPECT_EQ(Bearer(bob, job + "/hold", {"-X", "POST"}).status, 403);
  Reply in = Login(bob);
  ASSERT_EQ(in.status, 200) << in.body;
  const std::string bob_jar =
      "Cookie: " +
      in.headers["set-cookie"].substr(0, in.headers["set-cookie"].find(';'));
  const std::string bob_csrf = nlohmann::json::parse(in.body)["csrf"];
  Reply cancel = Curl(Url(job + "/cancel"), {"-X", "POST", "-H", bob_jar, "-H",
                                             "X-CSRF-Token: " + bob_csrf});
  EXPECT_EQ(cancel.status, 403) << cancel.body;
  Reply bulk =
      Curl(Url("/api/v1/jobs/cancel"),
           {"-X", "POST", "-H", bob_jar, "-H", "X-CSRF-Token: " + bob_csrf,
            "--data-binary", "{\"ids\":[" + std::to_string(id) + "]}"});
  ASSERT_EQ(bulk.status, 200) << bulk.body;
  EXPECT_EQ(nlohmann::json::parse(bulk.body)["results"][0]["ok"], false);
  EXPECT_EQ(State(id), "queued");

  // The owner's session holds it (not without the CSRF token); an admin
  // releases it.
  Reply ada_in = Login(ada);
  ASSERT_EQ(ada_in.status, 200) << ada_in.body;
  const std::string ada_jar =
      "Cookie: " + ada_in.headers["set-cookie"].substr(
                       0, ada_in.headers["set-cookie"].find(';'));
  const std::string ada_csrf = nlohmann::json::parse(ada_in.body)["csrf"];
  EXPECT_EQ(Curl(Url(job + "/hold"), {"-X", "POST", "-H", ada_jar}).status,
            403);
  EXPECT_EQ(State(id), "queued");
  Reply hold = Curl(Url(job + "/hold"), {"-X", "POST", "-H", ada_jar, "-H",
                                         "X-CSRF-Token: " + ada_csrf});
  ASSERT_EQ(hold.status, 200) << hold.body;
  EXPECT_EQ(nlohmann::json::parse(hold.body)["results"][0]["ok"], true);
  EXPECT_EQ(State(id), "queued,held");
  Reply release = Bearer(admin_, job + "/release", {"-X", "POST"});
  ASSERT_EQ(release.status, 200) << release.body;
  EXPECT_EQ(nlohmann::json::parse(release.body)["results"][0]["ok"], true);
  EXPECT_EQ(State(id), "queued");
}

TEST(WebServerOffTest, DlbatchWebSaysHowToTurnItOn) {
  Cluster c;
  c.StartScheduler();
  Result web = c.Cli({"web"});
  EXPECT_EQ(web.code, 1);
  EXPECT_NE(web.err.find("the scheduler serves no web face; start it with "
                         "--web-listen 127.0.0.1:8443 (or web_listen: in "
                         "scheduler.yaml)"),
            std::string::npos)
      << web.err;
}

// The embedded local cluster serves the web face on a loopback port of its
// own: `dlbatch web` just works.
TEST(WebLocalTest, TheLocalClusterServesIt) {
  Cluster c;  // only for its temp folder
  std::map<std::string, std::string> env = {
      {"XDG_STATE_HOME", c.dir() + "/xdg"}, {"DLBATCH_SCHEDULER", ""}};
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), BinDir() + "/dlbatch");
    return Exec(args, env, 60000);
  };
  Result web = cli({"web", "--json"});
  ASSERT_EQ(web.code, 0) << web.err;
  auto j = nlohmann::json::parse(web.out);
  std::string url = j["url"];
  EXPECT_EQ(url.rfind("https://127.0.0.1:", 0), 0u) << url;
  Result login = Exec({"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                       "--cacert", j["ca_file"], url},
                      {}, 30000);
  EXPECT_EQ(login.out, "303");
  EXPECT_EQ(cli({"local", "stop", "--force"}).code, 0);
}

}  // namespace
}  // namespace dlbatch::testing
