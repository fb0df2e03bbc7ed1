// The web dashboard against a real dlbatch-scheduler (--web-listen
// 127.0.0.1:0), a real worker and the real CLI, in one run:
//
// 1. A page of 100 jobs with N (default 100,000) in the store: HTTPS GET
//    /api/v1/jobs?limit=100 with a bearer token over one kept-alive
//    connection (the default order, by name, a state filter, a deep
//    offset), median and p95; baseline: GET /api/v1/session on the same
//    connection (the web face's floor: TLS, routing, the token), and
//    `dlbatch jobs --json --limit 100` (a fresh CLI over gRPC) beside it.
//    The store is filled through gRPC SubmitJob from 4 clients; all but 1%
//    are then cancelled (CancelJobs), the rest held, before a worker joins.
// 2. The jobs page in headless chromium: navigation start to its table's
//    first rows painted, logged in by cookie first (bench/web/pages.mjs).
// 3. An ended job whose diary has 1,000,000 lines (`seq`): its page opened,
//    scrolled to the end as soon as its diary shows, to its last line
//    painted.
// 4. Event to pixel: a command job reporting its own wall-clock time as a
//    metric through $DLBATCH_PROGRESS every 100 ms; the page's chart marks
//    each draw (data-drawn); drawn time - reported time per point.
// 5. 200 open event streams (GET /api/v1/events over TLS, raw C++ clients
//    on one thread; 200 headless pages would not fit on 2 cores) while K
//    jobs report progress every 50 ms (the worker forwards at most one
//    report per job per 200 ms: K=20 gives ~100 job events/s): the
//    scheduler's CPU (utime+stime) with the streams open against none open
//    before and after, over windows of the same length; placement passes
//    and a burst of submits in each phase.
//
//   web_bench [--jobs N] [--repeats R] [--loads L] [--lines N]
//             [--chart-seconds S] [--streams N] [--stream-jobs K]
//             [--window S] [--only list,paint,diary,chart,streams]
//             [--bin DIR] [--keep 1]
//
// Medians (p95 where said); prints a markdown table and asserts nothing.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_args.h"
#include "bench/bench_proc.h"
#include "common/endpoint.h"
#include "common/tls_client.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace {

namespace fs = std::filesystem;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using dlbatch::bench::Capture;
using dlbatch::bench::ExecOrExit;
using dlbatch::bench::Median;
using dlbatch::bench::SpawnLogged;
using Json = nlohmann::json;

constexpr char kUsage[] =
    "usage: web_bench [--jobs N] [--repeats R] [--loads L] [--lines N]\n"
    "                 [--chart-seconds S] [--streams N] [--stream-jobs K]\n"
    "                 [--window S] [--only list,paint,diary,chart,streams]\n"
    "                 [--bin DIR] [--keep 1]\n"
    "  The web dashboard against the real scheduler, worker and CLI: a page\n"
    "  of 100 jobs of N in the store, the jobs page's first paint, a long\n"
    "  diary's last line, event to pixel, and the scheduler's CPU with N\n"
    "  open event streams. Defaults: 100000 jobs, 60 repeats, 10 loads,\n"
    "  1000000 lines, 20 s of chart, 200 streams, 20 reporting jobs, 15 s\n"
    "  windows; about 3 minutes here.\n";

// The job of (4) and (5): its own wall-clock time as a metric, every
// argv[2] s, for argv[1] s.
constexpr char kReporter[] =
    "import json, os, sys, time\n"
    "f = open(os.environ['DLBATCH_PROGRESS'], 'w', buffering=1)\n"
    "end, period, i = time.time() + float(sys.argv[1]), float(sys.argv[2]), 0\n"
    "while time.time() < end:\n"
    "    i += 1\n"
    "    f.write(json.dumps({'iteration': i, 'wall_ms': time.time() * 1000})"
    " + '\\n')\n"
    "    time.sleep(period)\n";

std::string SelfDir() {
  return fs::read_symlink("/proc/self/exe").parent_path().string();
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The p-th percentile (nearest rank) of `v`; 0 if empty.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100 * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

bool WaitUntil(const std::function<bool()>& ready, int timeout_ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ready();
}

// CPU seconds (utime + stime, all threads) of `pid`, from /proc; 0 if gone.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  double ticks = 0;
  // After the name: state is field 3; utime and stime are 14 and 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::atof(field.c_str());
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One kept-alive HTTPS connection to the web face (loopback; the
// certificate is not checked).
class HttpsClient {
 public:
  explicit HttpsClient(int port)
      : ctx_(ssl::context::tls_client), stream_(ioc_, ctx_) {
    ctx_.set_verify_mode(ssl::verify_none);
    beast::get_lowest_layer(stream_).connect(
        tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    stream_.handshake(ssl::stream_base::client);
  }
  // GET `target` with the bearer token; the status (0 on a broken
  // connection) and the body.
  int Get(const std::string& target, const std::string& token,
          std::string* body) {
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::authorization, "Bearer " + token);
    req.keep_alive(true);
    beast::error_code ec;
    http::write(stream_, req, ec);
    if (ec) return 0;
    http::response_parser<http::string_body> parser;
    parser.body_limit(256 << 20);
    http::read(stream_, buffer_, parser, ec);
    if (ec) return 0;
    *body = std::move(parser.get().body());
    return parser.get().result_int();
  }
  Json GetJson(const std::string& target, const std::string& token) {
    std::string body;
    if (Get(target, token, &body) != 200) return Json();
    return Json::parse(body, nullptr, false);
  }

 private:
  asio::io_context ioc_;
  ssl::context ctx_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
};

// `n` event streams (GET /api/v1/events) on one io thread, counting the
// `job` events each reads after its snapshot (`ready`).
class EventStreams {
 public:
  EventStreams(int port, const std::string& token, int n)
      : ctx_(ssl::context::tls_client), work_(asio::make_work_guard(ioc_)) {
    ctx_.set_verify_mode(ssl::verify_none);
    request_ = absl::StrCat(
        "GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
        "Bearer ",
        token, "\r\nAccept: text/event-stream\r\n\r\n");
    const tcp::endpoint at(asio::ip::make_address("127.0.0.1"), port);
    for (int i = 0; i < n; ++i) {
      streams_.push_back(std::make_unique<Stream>(ioc_, ctx_));
      Start(streams_.back().get(), at);
    }
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~EventStreams() {
    work_.reset();
    ioc_.stop();
    thread_.join();
  }
  int ready() const { return ready_; }
  int failed() const { return failed_; }
  int64_t job_events() const { return job_events_; }
  int64_t bytes() const { return bytes_; }

 private:
  struct Stream {
    Stream(asio::io_context& ioc, ssl::context& ctx) : s(ioc, ctx) {}
    beast::ssl_stream<beast::tcp_stream> s;
    char buf[16384];
    std::string carry;
    bool ready = false;
  };
  void Start(Stream* st, const tcp::endpoint& at) {
    beast::get_lowest_layer(st->s).async_connect(
        at, [this, st](beast::error_code ec) {
          if (ec) return Fail();
          st->s.async_handshake(
              ssl::stream_base::client, [this, st](beast::error_code ec) {
                if (ec) return Fail();
                asio::async_write(st->s, asio::buffer(request_),
                                  [this, st](beast::error_code ec, size_t) {
                                    if (ec) return Fail();
                                    Read(st);
                                  });
              });
        });
  }
  void Read(Stream* st) {
    st->s.async_read_some(
        asio::buffer(st->buf), [this, st](beast::error_code ec, size_t n) {
          if (ec) return Fail();
          // Whole lines only; a partial one waits for the next read.
          bytes_ += static_cast<int64_t>(n);
          st->carry.append(st->buf, n);
          size_t from = 0;
          for (size_t nl;
               (nl = st->carry.find('\n', from)) != std::string::npos;
               from = nl + 1) {
            absl::string_view line(st->carry.data() + from, nl - from);
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (line == "event: job" && st->ready) {
              ++job_events_;
            } else if (line == "event: ready" && !st->ready) {
              st->ready = true;
              ++ready_;
            }
          }
          st->carry.erase(0, from);
          Read(st);
        });
  }
  void Fail() { ++failed_; }

  asio::io_context ioc_;
  ssl::context ctx_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::string request_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::atomic<int> ready_{0}, failed_{0};
  std::atomic<int64_t> job_events_{0}, bytes_{0};
  std::thread thread_;
};

// The node script with `args`: its stdout parsed as JSON (null on failure),
// its stderr into `log`; *rc its exit status (77: no browser here).
Json RunNode(const std::vector<std::string>& args, const std::string& log,
             int* rc) {
  int fds[2];
  if (pipe(fds) != 0) return Json();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<std::string> argv = {
        "/usr/bin/env", "node",
        std::string(DLBATCH_BENCH_SOURCE_DIR) + "/web/pages.mjs"};
    argv.insert(argv.end(), args.begin(), args.end());
    ExecOrExit(argv);
  }
  close(fds[1]);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return *rc == 0 ? Json::parse(out, nullptr, false) : Json();
}

struct Row {
  std::string figure, value, baseline, ratio, goal, met;
};

std::string Verdict(bool ok) { return ok ? "met" : "**missed**"; }

std::string CurrentUser() {
  const struct passwd* pw = getpwuid(geteuid());
  return pw ? pw->pw_name : "root";
}

}  // namespace

int main(int argc, char** argv) {
  int rc = 0;
  if (dlbatch::bench::HelpOrBadPairs(argc, argv, kUsage, true, &rc)) return rc;
  int64_t jobs = 100000;
  int repeats = 60, loads = 10, streams = 200, stream_jobs = 20;
  int64_t lines = 1000000;
  double chart_seconds = 20, window = 15;
  std::set<std::string> only;
  std::string bin = SelfDir();
  bool keep = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--jobs") {
      jobs = std::atoll(v.c_str());
    } else if (a == "--repeats") {
      repeats = std::atoi(v.c_str());
    } else if (a == "--loads") {
      loads = std::atoi(v.c_str());
    } else if (a == "--lines") {
      lines = std::atoll(v.c_str());
    } else if (a == "--chart-seconds") {
      chart_seconds = std::atof(v.c_str());
    } else if (a == "--streams") {
      streams = std::atoi(v.c_str());
    } else if (a == "--stream-jobs") {
      stream_jobs = std::atoi(v.c_str());
    } else if (a == "--window") {
      window = std::atof(v.c_str());
    } else if (a == "--only") {
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        const std::string p(part);
        if (p != "list" && p != "paint" && p != "diary" && p != "chart" &&
            p != "streams") {
          std::cerr << "--only " << p
                    << ": give list, paint, diary, chart or streams (a comma "
                       "list)\n";
          return 2;
        }
        only.insert(p);
      }
    } else if (a == "--bin") {
      bin = v;
    } else if (a == "--keep") {
      keep = v == "1";
    } else {
      std::cerr << "unknown flag " << a << "\n" << kUsage;
      return 2;
    }
  }
  if (jobs < 0 || repeats < 1 || loads < 1 || lines < 1 || chart_seconds <= 0 ||
      streams < 1 || stream_jobs < 1 || window <= 0) {
    std::cerr << "--repeats, --loads, --lines, --streams and --stream-jobs "
                 "must be at least 1, --jobs at least 0, --chart-seconds and "
                 "--window above 0\n";
    return 2;
  }
  auto run = [&](const char* part) { return only.empty() || only.count(part); };

  char tmpl[] = "/tmp/dlbatch-web-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string sock = "unix:" + dir + "/sched.sock";
  const pid_t scheduler = SpawnLogged(
      {bin + "/dlbatch-scheduler", "--state-dir", dir + "/state", "--listen",
       sock, "--ready-file", dir + "/ready", "--web-listen", "127.0.0.1:0",
       "--heartbeat-timeout", "120s"},
      dir + "/scheduler.log");
  pid_t worker = 0;
  auto stop = [&](const std::string& why) {
    if (!why.empty()) std::cerr << why << "; logs in " << dir << "\n";
    if (worker > 0) kill(worker, SIGTERM);
    kill(scheduler, SIGTERM);
    if (worker > 0) waitpid(worker, nullptr, 0);
    waitpid(scheduler, nullptr, 0);
    if (why.empty() && !keep) fs::remove_all(dir);
    return why.empty() ? 0 : 1;
  };
  if (!WaitUntil([&] { return fs::exists(dir + "/ready"); }, 30000)) {
    return stop("the scheduler did not start");
  }
  int port = 0;
  WaitUntil(
      [&] {
        const std::string log = ReadAll(dir + "/scheduler.log");
        const std::string mark = "web face on https://127.0.0.1:";
        const size_t at = log.find(mark);
        if (at != std::string::npos)
          port = std::atoi(log.c_str() + at + mark.size());
        return port > 0;
      },
      10000);
  if (port == 0) return stop("the scheduler serves no web face");
  // The CLI's stdout ("" where it failed); *code its exit status.
  auto cli = [&](std::vector<std::string> args, int* code = nullptr) {
    std::vector<std::string> argv = {bin + "/dlbatch", "--scheduler", sock};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string text;
    const int c = Capture(argv, &text);
    if (code) *code = c;
    return c == 0 ? text : std::string();
  };
  const std::string user = CurrentUser();
  std::string token = cli({"admin", "user", "add", user});
  while (!token.empty() && std::isspace(token.back())) token.pop_back();
  if (token.empty()) return stop("`dlbatch admin user add` gave no token");
  const std::string modules = DLBATCH_BENCH_WEB_MODULES;
  setenv("DLBATCH_WEB_URL", absl::StrCat("https://127.0.0.1:", port).c_str(),
         1);
  setenv("DLBATCH_TOKEN", token.c_str(), 1);
  setenv("DLBATCH_WEB_TEST_MODULES", modules.c_str(), 1);

  dlbatch::ChannelConfig config;
  config.endpoint = *dlbatch::ParseEndpoint(sock);
  auto channel = dlbatch::MakeChannel(config);
  auto stub = dlbatch::v1::Scheduler::NewStub(channel);
  auto stats = [&] {
    grpc::ClientContext ctx;
    dlbatch::v1::Stats s;
    (void)stub->GetStats(&ctx, dlbatch::v1::GetStatsRequest(), &s);
    return s;
  };
  // Submits `total` jobs from `clients` clients (a channel each), as
  // arrays of `per` jobs (`per` 1: plain jobs), the jobs all `true`; their
  // ids, and the seconds it took.
  auto submit_many = [&](int64_t total, int clients, int64_t per,
                         const std::string& tag, std::vector<int64_t>* ids) {
    std::atomic<int64_t> next{0};
    std::vector<std::vector<int64_t>> got(clients);
    std::atomic<int> errors{0};
    const int64_t groups = (total + per - 1) / per;
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    static const char* kNames[] = {"train", "eval", "sweep", "prep", "export"};
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        auto own =
            dlbatch::v1::Scheduler::NewStub(dlbatch::MakeChannel(config));
        for (int64_t g; (g = next.fetch_add(1)) < groups;) {
          dlbatch::v1::SubmitJobRequest req;
          req.set_request_id(absl::StrCat(tag, "-", getpid(), "-", g));
          req.set_user(user);
          auto* spec = req.mutable_spec();
          // Names that do not follow the ids, so that a sort by name is one.
          spec->set_name(absl::StrCat(kNames[g % 5], "-", (g * 7919) % groups));
          spec->set_pool(1);
          spec->mutable_command()->add_argv("true");
          const int64_t n = std::min(per, total - g * per);
          if (per > 1) spec->set_array(absl::StrCat("0-", n - 1));
          grpc::ClientContext ctx;
          dlbatch::v1::SubmitJobReply reply;
          if (!own->SubmitJob(&ctx, req, &reply).ok()) {
            ++errors;
          } else if (reply.job_ids_size() > 0) {
            got[c].insert(got[c].end(), reply.job_ids().begin(),
                          reply.job_ids().end());
          } else {
            got[c].push_back(reply.job_id());
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& g : got) ids->insert(ids->end(), g.begin(), g.end());
    if (errors > 0) std::cerr << tag << ": " << errors << " submits failed\n";
    return Ms(t0, Clock::now()) / 1000;
  };
  auto cancel_all = [&](const std::vector<int64_t>& ids) {
    for (size_t i = 0; i < ids.size(); i += 1000) {
      dlbatch::v1::CancelJobsRequest req;
      for (size_t j = i; j < std::min(ids.size(), i + 1000); ++j)
        req.add_job_ids(ids[j]);
      grpc::ClientContext ctx;
      dlbatch::v1::CancelJobsReply reply;
      (void)stub->CancelJobs(&ctx, req, &reply);
    }
  };
  // The worker: a slot per reporting job of (5); (3) and (4) take one each
  // before.
  HttpsClient https(port);
  worker = SpawnLogged(
      {bin + "/dlbatch-worker", "--scheduler", sock, "--work-dir",
       dir + "/work", "--name", "w", "--cpu-slots",
       std::to_string(std::max(2, stream_jobs)), "--host", "127.0.0.1"},
      dir + "/worker.log");
  if (!WaitUntil(
          [&] {
            Json w = https.GetJson("/api/v1/workers", token);
            return w.is_object() && w["workers"].is_array() &&
                   !w["workers"].empty() &&
                   w["workers"][0].value("online", false);
          },
          20000)) {
    return stop("the worker did not come online");
  }
  // Drained while the store fills: the scheduler takes jobs only for
  // profiles some worker has joined, and none of them must run.
  if (cli({"admin", "drain", "w"}).empty()) return stop("the drain failed");
  std::vector<Row> rows;
  std::vector<std::string> notes;

  // ---- 1. the store, and a page of it ----
  std::vector<int64_t> filled;
  const double fill_s = submit_many(jobs, 2, 1000, "fill", &filled);
  std::sort(filled.begin(), filled.end());
  std::vector<int64_t> to_cancel, to_hold;
  for (size_t i = 0; i < filled.size(); ++i)
    (i % 100 == 0 ? to_hold : to_cancel).push_back(filled[i]);
  auto t0 = Clock::now();
  {
    dlbatch::v1::ControlJobsRequest req;
    req.set_action(dlbatch::v1::JOB_CONTROL_HOLD);
    for (int64_t id : to_hold) req.add_job_ids(id);
    grpc::ClientContext ctx;
    dlbatch::v1::ControlJobsReply reply;
    (void)stub->ControlJobs(&ctx, req, &reply);
  }
  cancel_all(to_cancel);
  const double settle_s = Ms(t0, Clock::now()) / 1000;
  if (cli({"admin", "resume", "w"}).empty()) return stop("the resume failed");
  notes.push_back(absl::StrFormat(
      "store: %d jobs submitted through gRPC SubmitJob as arrays of 1,000 "
      "(2 clients, Unix socket) in %.1f s (%.0f jobs/s); %d cancelled "
      "(CancelJobs, 1,000 a call) and %d held in %.1f s",
      filled.size(), fill_s, filled.size() / std::max(fill_s, 1e-9),
      to_cancel.size(), to_hold.size(), settle_s));

  if (run("list")) {
    const std::vector<std::pair<std::string, std::string>> pages = {
        {"default order (id, newest first)", "/api/v1/jobs?limit=100"},
        {"by name", "/api/v1/jobs?limit=100&sort=name&order=asc"},
        {"state filter (queued,running)",
         "/api/v1/jobs?limit=100&state=queued,running"},
        {"deep offset (90,000)", "/api/v1/jobs?limit=100&offset=90000"},
        {"baseline: /api/v1/session", "/api/v1/session"},
    };
    std::vector<std::vector<double>> ms(pages.size());
    std::vector<size_t> bytes(pages.size());
    std::vector<int64_t> totals(pages.size());
    std::vector<int> bad(pages.size());
    std::string body;
    for (int r = -3; r < repeats; ++r) {  // 3 warm-ups, then measured
      for (size_t p = 0; p < pages.size(); ++p) {
        const auto a = Clock::now();
        const int status = https.Get(pages[p].second, token, &body);
        const double t = Ms(a, Clock::now());
        if (status != 200) ++bad[p];
        if (r >= 0) ms[p].push_back(t);
        bytes[p] = body.size();
        if (r == -1) {
          Json j = Json::parse(body, nullptr, false);
          if (j.is_object()) totals[p] = j.value("total", int64_t{0});
        }
      }
    }
    const double floor = Median(ms.back());
    for (size_t p = 0; p + 1 < pages.size(); ++p) {
      const double med = Median(ms[p]), p95 = Percentile(ms[p], 95);
      rows.push_back({absl::StrCat("GET a page of 100 jobs of ", jobs, ", ",
                                   pages[p].first, bad[p] ? " (errors!)" : ""),
                      absl::StrFormat("%.2f ms (p95 %.2f; %d KB, %d match)",
                                      med, p95, bytes[p] / 1024, totals[p]),
                      absl::StrFormat("session %.2f ms", floor),
                      absl::StrFormat("%.1fx", med / floor), "<= 20 ms",
                      Verdict(med <= 20 && p95 <= 20)});
    }
    std::vector<double> cli_ms;
    for (int r = 0; r < std::min(repeats, 20); ++r) {
      const auto a = Clock::now();
      cli({"jobs", "--json", "--limit", "100"});
      cli_ms.push_back(Ms(a, Clock::now()));
    }
    rows.push_back({"`dlbatch jobs --json --limit 100` (a fresh CLI, gRPC)",
                    absl::StrFormat("%.1f ms (p95 %.1f)", Median(cli_ms),
                                    Percentile(cli_ms, 95)),
                    absl::StrFormat("session %.2f ms", floor),
                    absl::StrFormat("%.1fx", Median(cli_ms) / floor), "-",
                    "-"});
  }

  const std::string node_log = dir + "/node.log";
  auto skipped = [&](const char* what, int code) {
    rows.push_back({what,
                    code == 77
                        ? "skipped: no chromium or puppeteer-core"
                        : absl::StrCat("failed (", code, "; ", node_log, ")"),
                    "-", "-", "-", "-"});
  };

  // ---- 2. the jobs page's first paint ----
  if (run("paint")) {
    int code = 0;
    Json r = RunNode({"paint", std::to_string(loads)}, node_log, &code);
    if (!r.is_object()) {
      skipped("jobs page, first rows painted", code);
    } else {
      std::vector<double> painted, fcp;
      for (const Json& l : r["loads"]) {
        painted.push_back(l.value("painted", 0.0));
        fcp.push_back(l.value("first_contentful_paint", 0.0));
      }
      const double med = Median(painted);
      rows.push_back(
          {absl::StrFormat("jobs page: navigation start -> first rows painted "
                           "(%d loads, cached assets)",
                           loads),
           absl::StrFormat("%.0f ms (p95 %.0f)", med, Percentile(painted, 95)),
           absl::StrFormat("first contentful paint %.0f ms", Median(fcp)),
           absl::StrFormat("%.1fx", med / std::max(Median(fcp), 1e-9)),
           "<= 500 ms", Verdict(med <= 500)});
      rows.push_back(
          {"the same, the first load (empty cache)",
           absl::StrFormat("%.0f ms", r["first"].value("painted", 0.0)), "-",
           "-", "-", "-"});
    }
  }

  // ---- 3. a 1,000,000-line diary ----
  if (run("diary")) {
    const int64_t id = std::atoll(
        cli({"submit", "-q", "--", "/usr/bin/seq", std::to_string(lines)})
            .c_str());
    t0 = Clock::now();
    int64_t last = 0;
    int waited = 1;
    if (id > 0) cli({"wait", "--timeout", "900s", std::to_string(id)}, &waited);
    const bool ended =
        waited == 0 &&
        WaitUntil(
            [&] {
              Json d = https.GetJson(
                  absl::StrCat("/api/v1/jobs/", id, "/diary?tail=1"), token);
              if (!d.is_object() || !d.value("ended", false) ||
                  d["lines"].empty())
                return false;
              last = d["lines"].back().value("n", int64_t{0});
              return true;
            },
            60000);
    const double write_s = Ms(t0, Clock::now()) / 1000;
    if (!ended) return stop("the diary job did not end well");
    notes.push_back(absl::StrFormat(
        "diary: `seq %d` ran and its %d lines were stored in %.1f s", lines,
        last, write_s));
    // What the page asks the API for, timed alone: the first block it
    // shows, and the block at the end it scrolls to.
    for (const auto& [what, target] :
         std::vector<std::pair<std::string, std::string>>{
             {"the diary's first 200 lines",
              absl::StrCat("/api/v1/jobs/", id, "/diary?after=0&limit=200")},
             {"its last 200 lines",
              absl::StrCat("/api/v1/jobs/", id, "/diary?after=",
                           std::max<int64_t>(0, last - 200), "&limit=200")},
             {"the job", absl::StrCat("/api/v1/jobs/", id)}}) {
      std::vector<double> ms;
      std::string body;
      for (int r = 0; r < std::min(repeats, 20); ++r) {
        const auto a = Clock::now();
        https.Get(target, token, &body);
        ms.push_back(Ms(a, Clock::now()));
      }
      rows.push_back({absl::StrCat("GET ", what, " (API alone)"),
                      absl::StrFormat("%.1f ms (p95 %.1f)", Median(ms),
                                      Percentile(ms, 95)),
                      "-", "-", "-", "-"});
    }
    int code = 0;
    Json r = RunNode({"diary", std::to_string(loads), std::to_string(id),
                      std::to_string(last)},
                     node_log, &code);
    if (!r.is_object()) {
      skipped("diary: open -> last line", code);
    } else {
      std::vector<double> painted, first;
      for (const Json& l : r["loads"]) {
        painted.push_back(l.value("painted", 0.0));
        first.push_back(l.value("first_lines", 0.0));
      }
      const double med = Median(painted);
      rows.push_back(
          {absl::StrFormat("job page of a %d-line diary: navigation start -> "
                           "its last line painted (scrolled to the end at its "
                           "first lines; %d loads)",
                           last, loads),
           absl::StrFormat("%.0f ms (p95 %.0f)", med, Percentile(painted, 95)),
           absl::StrFormat("first lines %.0f ms", Median(first)),
           absl::StrFormat("%.1fx", med / std::max(Median(first), 1e-9)),
           "<= 300 ms", Verdict(med <= 300)});
    }
  }

  // ---- 4. event to pixel ----
  if (run("chart")) {
    const int64_t id =
        std::atoll(cli({"submit", "-q", "--", "/usr/bin/python3", "-c",
                        kReporter, absl::StrCat(chart_seconds + 60), "0.1"})
                       .c_str());
    if (id <= 0 ||
        !WaitUntil(
            [&] {
              Json j = https.GetJson(absl::StrCat("/api/v1/jobs/", id), token);
              return j.is_object() && j.value("state", "") == "running";
            },
            30000)) {
      return stop("the reporting job did not start");
    }
    int code = 0;
    Json r = RunNode({"chart", absl::StrCat(chart_seconds), std::to_string(id)},
                     node_log, &code);
    cli({"cancel", std::to_string(id)});
    if (!r.is_object()) {
      skipped("event to pixel", code);
    } else {
      std::vector<double> drawn, frame;
      for (const Json& l : r["latencies"]) {
        drawn.push_back(l.value("drawn", 0.0));
        if (l.value("frame", 0.0) > 0) frame.push_back(l.value("frame", 0.0));
      }
      const double med = Median(drawn), p95 = Percentile(drawn, 95);
      rows.push_back(
          {absl::StrFormat("event to pixel: a point reported every 100 ms -> "
                           "drawn on the job page's chart (%d points)",
                           drawn.size()),
           absl::StrFormat("%.0f ms (p95 %.0f)", med, p95), "-", "-",
           "<= 250 ms", Verdict(med <= 250)});
      rows.push_back({"the same, to the frame after the draw",
                      absl::StrFormat("%.0f ms (p95 %.0f)", Median(frame),
                                      Percentile(frame, 95)),
                      "-", "-", "-", "-"});
      notes.push_back(absl::StrFormat(
          "chart: %d points in the job's history over %.0f s at 10 reports/s; "
          "the worker forwards the latest report at most every 200 ms",
          r.value("points", 0), chart_seconds));
    }
  }

  // ---- 5. open event streams under job events ----
  if (run("streams")) {
    std::vector<int64_t> reporters;
    for (int k = 0; k < stream_jobs; ++k) {
      reporters.push_back(
          std::atoll(cli({"submit", "-q", "--", "/usr/bin/python3", "-c",
                          kReporter, "3600", "0.05"})
                         .c_str()));
    }
    if (!WaitUntil(
            [&] {
              Json j =
                  https.GetJson("/api/v1/jobs?state=running&limit=1", token);
              return j.is_object() && j.value("total", 0) >= stream_jobs;
            },
            60000)) {
      return stop("the reporting jobs did not all start");
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    struct Phase {
      double cpu_pct = 0, passes = 0, submit_rate = 0, burst_passes = 0,
             events_per_s = 0, bytes_per_s = 0;
    };
    // `events`: the streams' job events and bytes so far (none open: null).
    auto phase =
        [&](Phase* p,
            const std::function<std::pair<int64_t, int64_t>()>& events) {
          const auto a = Clock::now();
          const double c0 = CpuSeconds(scheduler);
          const int64_t n0 = stats().placement_passes();
          const auto e0 = events ? events() : std::pair<int64_t, int64_t>();
          std::this_thread::sleep_for(std::chrono::duration<double>(window));
          const double secs = Ms(a, Clock::now()) / 1000;
          if (events) {
            const auto e1 = events();
            p->events_per_s = (e1.first - e0.first) / secs;
            p->bytes_per_s = (e1.second - e0.second) / secs;
          }
          p->cpu_pct = (CpuSeconds(scheduler) - c0) / secs * 100;
          p->passes = static_cast<double>(stats().placement_passes() - n0);
          // A burst of submits (they wait: every slot is taken), then away.
          std::vector<int64_t> ids;
          const int64_t b0 = stats().placement_passes();
          const double s =
              submit_many(1000, 2, 1, absl::StrCat("burst", rand()), &ids);
          p->burst_passes =
              static_cast<double>(stats().placement_passes() - b0);
          p->submit_rate = ids.size() / std::max(s, 1e-9);
          cancel_all(ids);
          std::this_thread::sleep_for(std::chrono::seconds(1));
        };
    Phase before, open, after;
    phase(&before, nullptr);
    double events_per_s = 0, kb_per_s = 0;
    int ready = 0, failed = 0;
    {
      EventStreams es(port, token, streams);
      WaitUntil([&] { return es.ready() + es.failed() >= streams; }, 60000);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      phase(&open, [&] { return std::make_pair(es.job_events(), es.bytes()); });
      events_per_s = open.events_per_s / std::max(1, es.ready());
      kb_per_s = open.bytes_per_s / 1024 / std::max(1, es.ready());
      ready = es.ready();
      failed = es.failed();
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    phase(&after, nullptr);
    cancel_all(reporters);
    const double none = (before.cpu_pct + after.cpu_pct) / 2;
    const double added = open.cpu_pct - none;
    rows.push_back(
        {absl::StrFormat("scheduler CPU, %d event streams open (%d ready, %d "
                         "failed), %.0f job events/s (%.0f KB/s) each, %.0f s "
                         "window",
                         streams, ready, failed, events_per_s, kb_per_s,
                         window),
         absl::StrFormat("%.1f %% of a core (+%.1f)", open.cpu_pct, added),
         absl::StrFormat("none open %.1f / %.1f %%", before.cpu_pct,
                         after.cpu_pct),
         absl::StrFormat("%.2fx", open.cpu_pct / std::max(none, 1e-9)),
         "<= +5 % of a core", Verdict(added <= 5)});
    const double rate_none = (before.submit_rate + after.submit_rate) / 2;
    rows.push_back(
        {"submit rate, 1,000 jobs from 2 gRPC clients, streams open",
         absl::StrFormat("%.0f jobs/s (%.0f passes)", open.submit_rate,
                         open.burst_passes),
         absl::StrFormat("none open %.0f / %.0f jobs/s (%.0f / %.0f passes)",
                         before.submit_rate, after.submit_rate,
                         before.burst_passes, after.burst_passes),
         absl::StrFormat("%.2fx", open.submit_rate / std::max(rate_none, 1e-9)),
         "within noise", "-"});
    rows.push_back(
        {"placement passes in the window (progress only, no submits)",
         absl::StrFormat("%.0f", open.passes),
         absl::StrFormat("none open %.0f / %.0f", before.passes, after.passes),
         "-", "within noise", "-"});
  }
  stop("");

  char host[256] = {};
  gethostname(host, sizeof host - 1);
  double load[3] = {};
  getloadavg(load, 3);
  std::printf(
      "\nweb_bench: %lld jobs in the store, %d repeats, %d loads; "
      "load average %.1f at the end\n\n",
      static_cast<long long>(jobs), repeats, loads, load[0]);
  for (const std::string& n : notes) std::printf("- %s\n", n.c_str());
  std::printf("\n| figure | value | baseline, same run | ratio | goal | |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s | %s | %s | %s |\n", r.figure.c_str(),
                r.value.c_str(), r.baseline.c_str(), r.ratio.c_str(),
                r.goal.c_str(), r.met.c_str());
  }
  return 0;
}
