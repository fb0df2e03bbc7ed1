// Watching the daemons: the real scheduler and worker with --metrics-listen,
// scraped over HTTP, checked with promtool and read back
// through Debian's real Prometheus server; /healthz and /readyz; and
// --log-format json lines that parse.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

bool Installed(const std::string& program) {
  return Exec({"sh", "-c", "command -v " + program}).code == 0;
}

// Whether job `id` finished within 30 s. (Either spelling of the state:
// the CLI's JSON moves from the enum's name to the lower-case one.)
bool WaitFinished(Cluster& c, int64_t id) {
  return WaitFor(
      [&] {
        std::string state = c.State(id);
        return state == "JOB_STATE_FINISHED" || state == "finished";
      },
      30000);
}

const char kJob[] = "name: hi\ncommand: [sh, -c, 'echo hello; echo world']\n";

TEST(MetricsTest, ScrapesOfSchedulerAndWorkerPassPromtool) {
  Cluster c;
  const int sp = FreePort(), wp = FreePort();
  c.StartScheduler({"--metrics-listen", "127.0.0.1:" + std::to_string(sp)});
  c.StartWorker("w1", 2, "local",
                {"--metrics-listen", "127.0.0.1:" + std::to_string(wp)});
  ASSERT_TRUE(c.WaitWorkers(1));
  for (int port : {sp, wp}) {
    EXPECT_EQ(Get(port, "/healthz").status, 200) << c.Logs();
    EXPECT_EQ(Get(port, "/readyz").status, 200) << c.Logs();
    EXPECT_EQ(Get(port, "/nothing").status, 404);
  }
  int64_t id = c.Submit(c.JobFile("hi.yaml", kJob));
  ASSERT_TRUE(WaitFinished(c, id)) << c.Logs();

  Http s = Get(sp, "/metrics");
  ASSERT_EQ(s.status, 200) << c.Logs();
  EXPECT_EQ(Sample(s.body, "dlbatch_jobs_submitted_total{profile=\"local\"}"),
            1)
      << s.body;
  EXPECT_EQ(
      Sample(s.body, "dlbatch_jobs{profile=\"local\",state=\"finished\"}"), 1)
      << s.body;
  EXPECT_EQ(Sample(s.body, "dlbatch_jobs{profile=\"local\",state=\"queued\"}"),
            0)
      << s.body;
  EXPECT_EQ(Sample(s.body, "dlbatch_slots{profile=\"local\",state=\"free\"}"),
            2)
      << s.body;
  EXPECT_EQ(Sample(s.body, "dlbatch_diary_lines_total"), 2) << s.body;
  EXPECT_EQ(Sample(s.body, "dlbatch_job_queue_wait_seconds_count"), 1);
  EXPECT_EQ(Sample(s.body, "dlbatch_job_start_latency_seconds_count"), 1);
  EXPECT_GT(Sample(s.body, "dlbatch_store_bytes"), 4096);
  Http w = Get(wp, "/metrics");
  ASSERT_EQ(w.status, 200);
  EXPECT_EQ(Sample(w.body,
                   "dlbatch_worker_slots{kind=\"cpu\",profile=\"local\","
                   "state=\"free\",worker=\"w1\"}"),
            2)
      << w.body;
  // No NVML on this machine (or none found): no GPU series, and no error.
  if (Exec({"sh", "-c", "ldconfig -p | grep -q libnvidia-ml.so.1"}).code != 0) {
    EXPECT_EQ(w.body.find("dlbatch_gpu_"), std::string::npos) << w.body;
  }

  // A purged job leaves the gauge; a restarted scheduler counts from the
  // store again.
  Result purge = c.Cli({"admin", "purge", std::to_string(id)});
  ASSERT_EQ(purge.code, 0) << purge.out << purge.err;
  EXPECT_EQ(Sample(Get(sp, "/metrics").body,
                   "dlbatch_jobs{profile=\"local\",state=\"finished\"}"),
            0);
  int64_t second = c.Submit(c.JobFile("hi2.yaml", kJob));
  ASSERT_TRUE(WaitFinished(c, second)) << c.Logs();
  c.KillScheduler(SIGTERM);
  c.StartScheduler({"--metrics-listen", "127.0.0.1:" + std::to_string(sp)});
  ASSERT_TRUE(WaitFor([&] { return Get(sp, "/readyz").status == 200; }, 10000));
  EXPECT_EQ(Sample(Get(sp, "/metrics").body,
                   "dlbatch_jobs{profile=\"local\",state=\"finished\"}"),
            1)
      << c.Logs();

  if (!Installed("promtool")) {
    GTEST_SKIP() << "promtool is not installed (deploy/bootstrap.sh "
                    "--test-tools installs Debian's prometheus): the scrapes "
                    "were read but not linted";
  }
  for (const auto& [name, scrape] :
       {std::pair{"scheduler", s.body}, std::pair{"worker", w.body}}) {
    std::string file = c.dir() + "/" + name + ".prom";
    WriteAll(file, scrape);
    Result lint = Exec({"sh", "-c", "promtool check metrics < " + file});
    EXPECT_EQ(lint.code, 0) << name << ": " << lint.out << lint.err;
  }
}

// The worker loads NVML at run time: here the stand-in (fake_nvml.c), as a
// machine without a driver has no real one.
TEST(MetricsTest, WorkerExportsEachGpuThroughNvml) {
  const char* before = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = before == nullptr ? "" : before;
  ::setenv(
      "LD_LIBRARY_PATH",
      (std::string(DLBATCH_FAKE_NVML_DIR) + (saved.empty() ? "" : ":" + saved))
          .c_str(),
      1);
  Cluster c;
  c.StartScheduler();
  const int wp = FreePort();
  c.StartWorker("w1", 2, "local",
                {"--metrics-listen", "127.0.0.1:" + std::to_string(wp)});
  if (saved.empty()) {
    ::unsetenv("LD_LIBRARY_PATH");
  } else {
    ::setenv("LD_LIBRARY_PATH", saved.c_str(), 1);
  }
  ASSERT_TRUE(c.WaitWorkers(1));
  Http w = Get(wp, "/metrics");
  ASSERT_EQ(w.status, 200) << c.Logs();
  const std::string gpu1 = "{gpu=\"1\",uuid=\"GPU-fake-1\",worker=\"w1\"}";
  EXPECT_DOUBLE_EQ(Sample(w.body, "dlbatch_gpu_utilization_ratio" + gpu1), 0.38)
      << w.body;
  EXPECT_EQ(Sample(w.body, "dlbatch_gpu_memory_total_bytes" + gpu1),
            80.0 * (1 << 30));
  EXPECT_EQ(Sample(w.body, "dlbatch_gpu_memory_used_bytes" + gpu1),
            1.0 * (1 << 30));
  EXPECT_EQ(Sample(w.body, "dlbatch_gpu_temperature_celsius" + gpu1), 42);
  if (Installed("promtool")) {
    WriteAll(c.dir() + "/gpu.prom", w.body);
    Result lint =
        Exec({"sh", "-c", "promtool check metrics < " + c.dir() + "/gpu.prom"});
    EXPECT_EQ(lint.code, 0) << lint.out << lint.err;
  }
}

// The same stand-in's readings reach the scheduler with the worker's
// heartbeats: `dlbatch workers --json` and the web face's GET
// /api/v1/workers show each GPU's utilisation and memory, and a worker
// that is gone shows none.
TEST(MetricsTest, WorkersShowTheirGpusNvmlReadings) {
  const char* before = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = before == nullptr ? "" : before;
  Cluster c;
  const std::string assets = c.dir() + "/web";
  std::filesystem::create_directories(assets);
  WriteAll(assets + "/index.html", "<!doctype html>");
  WriteAll(assets + "/login.html", "<!doctype html>");
  c.StartScheduler({"--web-listen", "127.0.0.1:0", "--web-assets", assets});
  ::setenv(
      "LD_LIBRARY_PATH",
      (std::string(DLBATCH_FAKE_NVML_DIR) + (saved.empty() ? "" : ":" + saved))
          .c_str(),
      1);
  c.StartWorker("w1", 2, "local");
  if (saved.empty()) {
    ::unsetenv("LD_LIBRARY_PATH");
  } else {
    ::setenv("LD_LIBRARY_PATH", saved.c_str(), 1);
  }
  ASSERT_TRUE(c.WaitWorkers(1));
  nlohmann::json workers;
  auto read = [&] {
    Result r = c.Cli({"workers", "--json"});
    if (r.code != 0) return false;
    workers = nlohmann::json::parse(r.out, nullptr, false);
    return workers.is_object() && workers["workers"].size() == 1 &&
           workers["workers"][0]["gpus"].size() == 2;
  };
  ASSERT_TRUE(WaitFor(read, 15000)) << workers.dump() << c.Logs();
  auto check = [](const nlohmann::json& w) {
    const nlohmann::json& gpu = w["gpus"][1];
    EXPECT_EQ(gpu["index"], 1);
    EXPECT_EQ(gpu["uuid"], "GPU-fake-1");
    EXPECT_EQ(gpu["utilization_percent"], 38);
    EXPECT_EQ(gpu["memory_used_bytes"], int64_t{1} << 30);
    EXPECT_EQ(gpu["memory_total_bytes"], int64_t{80} << 30);
    EXPECT_EQ(w["gpus"][0]["utilization_percent"], 37);
    EXPECT_TRUE(w["gpus_read"].is_string()) << w.dump();
  };
  check(workers["workers"][0]);

  // The web face: GET /api/v1/workers with a user's token.
  std::string log = ReadAll(c.dir() + "/scheduler.log");
  const std::string mark = "web face on https://127.0.0.1:";
  const size_t at = log.find(mark);
  ASSERT_NE(at, std::string::npos) << log;
  const int port = std::atoi(log.c_str() + at + mark.size());
  Result token = c.Cli({"admin", "user", "add", "ada"});
  ASSERT_EQ(token.code, 0) << token.err;
  std::string bearer = token.out;
  while (!bearer.empty() && (bearer.back() == '\n' || bearer.back() == ' '))
    bearer.pop_back();
  Result api =
      Exec({"curl", "-s", "--cacert", c.ca_file(), "-H",
            "Authorization: Bearer " + bearer,
            "https://127.0.0.1:" + std::to_string(port) + "/api/v1/workers"},
           {}, 30000);
  ASSERT_EQ(api.code, 0) << api.err;
  nlohmann::json web = nlohmann::json::parse(api.out, nullptr, false);
  ASSERT_TRUE(web.is_object() && web["workers"].size() == 1) << api.out;
  ASSERT_EQ(web["workers"][0]["gpus"].size(), 2u) << api.out;
  check(web["workers"][0]);

  // A worker that is gone has no readings.
  c.KillWorker(0, SIGKILL);
  ASSERT_TRUE(WaitFor(
      [&] {
        Result r = c.Cli({"workers", "--json"});
        nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
        return j.is_object() && j["workers"].size() == 1 &&
               j["workers"][0]["online"] == false &&
               j["workers"][0]["gpus"].empty();
      },
      15000))
      << c.Logs();
}

TEST(MetricsTest, ReadyzSaysWhyWhileTheWorkerIsNotConnected) {
  Cluster c;
  c.StartScheduler();
  const int wp = FreePort();
  c.StartWorker("w1", 1, "local",
                {"--metrics-listen", "127.0.0.1:" + std::to_string(wp)});
  ASSERT_TRUE(c.WaitWorkers(1));
  ASSERT_TRUE(WaitFor([&] { return Get(wp, "/readyz").status == 200; }, 5000));
  c.KillScheduler(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Get(wp, "/readyz").status == 503; }, 10000))
      << c.Logs();
  Http r = Get(wp, "/readyz");
  EXPECT_NE(r.body.find("not connected"), std::string::npos) << r.body;
  EXPECT_EQ(Get(wp, "/healthz").status, 200);
}

TEST(MetricsTest, PrometheusServerReadsTheJobCounterAndSlotGauge) {
  if (!Installed("prometheus")) {
    GTEST_SKIP() << "Debian's prometheus server is not installed "
                    "(deploy/bootstrap.sh --test-tools installs it)";
  }
  Cluster c;
  const int sp = FreePort(), wp = FreePort(), pp = FreePort();
  c.StartScheduler({"--metrics-listen", "127.0.0.1:" + std::to_string(sp)});
  c.StartWorker("w1", 3, "local",
                {"--metrics-listen", "127.0.0.1:" + std::to_string(wp)});
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile("hi.yaml", kJob));
  ASSERT_TRUE(WaitFinished(c, id)) << c.Logs();

  const std::string config = c.dir() + "/prometheus.yml";
  WriteAll(config,
           "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
           "scrape_configs:\n"
           "  - job_name: dlbatch\n    static_configs:\n"
           "      - targets: ['127.0.0.1:" +
               std::to_string(sp) + "', '127.0.0.1:" + std::to_string(wp) +
               "']\n");
  const std::string log = c.dir() + "/prometheus.log";
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f != nullptr) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    ::execlp("prometheus", "prometheus", ("--config.file=" + config).c_str(),
             ("--storage.tsdb.path=" + c.dir() + "/tsdb").c_str(),
             ("--web.listen-address=127.0.0.1:" + std::to_string(pp)).c_str(),
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{pid};

  // The value Prometheus has for `query` (one series), once it has one.
  auto query = [&](const std::string& q, double* value) {
    Http r = Get(pp, "/api/v1/query?query=" + q);
    if (r.status != 200) return false;
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return false;
    const auto& result = j["data"]["result"];
    if (!result.is_array() || result.size() != 1) return false;
    *value = std::stod(result[0]["value"][1].get<std::string>());
    return true;
  };
  double submitted = -1, free_slots = -1;
  // %7B %7D %22: { } " in the query string.
  EXPECT_TRUE(WaitFor(
      [&] {
        return query("dlbatch_jobs_submitted_total%7Bprofile%3D%22local%22%7D",
                     &submitted);
      },
      30000))
      << ReadAll(log);
  EXPECT_EQ(submitted, 1);
  EXPECT_TRUE(WaitFor(
      [&] {
        return query(
            "dlbatch_worker_slots%7Bworker%3D%22w1%22%2Cstate%3D%22"
            "free%22%7D",
            &free_slots);
      },
      30000))
      << ReadAll(log);
  EXPECT_EQ(free_slots, 3);
  double up = 0;
  EXPECT_TRUE(query("sum(up)", &up));
  EXPECT_EQ(up, 2) << "both targets scraped";
}

TEST(MetricsTest, JsonLogLinesParse) {
  Cluster c;
  // gRPC's own lines (asked for here) come in the daemon's format too.
  setenv("GRPC_VERBOSITY", "debug", 1);
  c.StartScheduler({"--log-format", "json"});
  c.StartWorker("w1", 1, "local", {"--log-format", "json"});
  unsetenv("GRPC_VERBOSITY");
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile("hi.yaml", kJob));
  ASSERT_TRUE(WaitFinished(c, id)) << c.Logs();
  for (const char* file : {"/scheduler.log", "/worker-w1.log"}) {
    std::istringstream in(ReadAll(c.dir() + file));
    std::string line;
    int lines = 0, grpc_lines = 0;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << file << ": not JSON: " << line;
      EXPECT_TRUE(j.contains("time") && j.contains("level") &&
                  j.contains("msg"))
          << line;
      ++lines;
      if (j.contains("msg") && j["msg"].is_string() &&
          j["msg"].get<std::string>().rfind("gRPC: ", 0) == 0) {
        ++grpc_lines;
      }
    }
    EXPECT_GT(lines, 1) << file;
    EXPECT_GT(grpc_lines, 0) << file << ": no line of gRPC's";
  }
  Result bad = Exec({BinDir() + "/dlbatch-scheduler", "--state-dir",
                     c.dir() + "/other", "--log-format", "yaml"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("write text or json"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace dlbatch::testing
