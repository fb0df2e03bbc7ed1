// PyTorch command jobs through a real scheduler and two real workers (one
// CPU slot each, on this machine), against the same work without dlbatch,
// measured in the same run:
//
// - DDP throughput: examples/pytorch/ddp_train.py (gloo, 2 ranks, CPU) as
//   examples/pytorch/ddp-per-slot.yaml runs it (pool 2 spread over the two
//   workers, launch: per-slot; rank 0 reports every step and checkpoints
//   through the dlbatch module, the workers store the checkpoints) against
//   the same script started by hand as two processes with the same
//   torchrun variables (the module absent: nothing reported, checkpoints
//   written but not stored). Steps/s of rank 0's training loop, as the
//   script prints it, and the CPU the scheduler and workers use meanwhile.
//   Goal: dlbatch at least 0.98x by hand.
// - Start-up of a job spread over two workers: the scheduler's submit time
//   to the last process's own start timestamp (bench_stamp) for a pool-2,
//   max_nodes-2, launch: per-slot job on the two workers, against a pool-1
//   job (plain, and launch: per-slot). Goal: the 2-part job starts at most
//   100 ms after the 1-part one would.
//
//   pytorch_job_bench [--repeats R] [--starts S] [--seconds T]
//                     [--report-every N] [--bin DIR]
//
// R training runs each way (default 3; the order alternates), S starts of
// each job (default 10), each training run about T seconds (default 15;
// the steps come from a warm-up run by hand), rank 0 reporting every N
// steps (default 1). Medians; prints a markdown table and asserts nothing.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_args.h"
#include "bench/bench_proc.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using dlbatch::bench::Capture;
using dlbatch::bench::ExecOrExit;
using dlbatch::bench::Median;
using dlbatch::bench::SpawnLogged;

constexpr char kPython[] = "/usr/bin/python3";
constexpr char kUsage[] =
    "usage: pytorch_job_bench [--repeats R] [--starts S] [--seconds T] "
    "[--report-every N] [--bin DIR]\n"
    "  DDP steps/s of examples/pytorch/ddp_train.py through dlbatch against "
    "by hand,\n  and the start-up of a 2-part job against a 1-part one.\n";

std::string SelfDir() {
  return fs::read_symlink("/proc/self/exe").parent_path().string();
}

// "2026-12-02T14:02:11.123Z" -> ms (UTC); 0 if not a time.
int64_t TimeMs(const nlohmann::json& t) {
  if (!t.is_string()) return 0;
  struct tm tm = {};
  const std::string s = t.get<std::string>();
  if (strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
  return static_cast<int64_t>(timegm(&tm)) * 1000 +
         (s.size() >= 23 ? std::atoi(s.substr(20, 3).c_str()) : 0);
}

bool WaitUntil(const std::function<bool()>& ready, int timeout_ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ready();
}

// Rank 0's "rank 0 trained N steps in T s (X steps/s)": X, or 0.
double StepsPerS(const std::string& text) {
  const size_t at = text.find("rank 0 trained ");
  if (at == std::string::npos) return 0;
  const size_t open = text.find('(', at);
  return open == std::string::npos ? 0 : std::atof(text.c_str() + open + 1);
}

// CPU seconds `pid` has used (all its threads), from /proc; 0 if gone.
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

// A loopback port free now.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// The script's two ranks started by hand in `dir`, as dlbatch's per-slot
// launch over two one-slot workers names them; rank 0's steps/s, or 0.
double ByHand(const std::string& dir, const std::vector<std::string>& args,
              const std::string& log) {
  const int port = FreePort();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string out = absl::StrCat(log, ".", rank);
    pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir.c_str()) != 0) _exit(127);
      const std::string path = getenv("PATH") ? getenv("PATH") : "/usr/bin";
      const std::string home = getenv("HOME") ? getenv("HOME") : "/";
      clearenv();
      for (const auto& [k, v] :
           std::vector<std::pair<std::string, std::string>>{
               {"PATH", path},
               {"HOME", home},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", std::to_string(port)},
               {"WORLD_SIZE", "2"},
               {"RANK", std::to_string(rank)},
               {"LOCAL_RANK", "0"},
               {"LOCAL_WORLD_SIZE", "1"},
               {"GROUP_RANK", std::to_string(rank)},
               {"NODE_RANK", std::to_string(rank)},
               {"GROUP_WORLD_SIZE", "2"},
               {"ROLE_RANK", std::to_string(rank)},
               {"ROLE_WORLD_SIZE", "2"},
               {"ROLE_NAME", "default"},
               {"OMP_NUM_THREADS", "1"},
           }) {
        setenv(k.c_str(), v.c_str(), 1);
      }
      int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<std::string> argv = {kPython, "ddp_train.py"};
      argv.insert(argv.end(), args.begin(), args.end());
      ExecOrExit(argv);
    }
    pids.push_back(pid);
  }
  // A rank that does not exit (a hung collective) fails the run.
  bool ok = true;
  const auto deadline = Clock::now() + std::chrono::minutes(10);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::ifstream in(log + ".0");
  std::ostringstream text;
  text << in.rdbuf();
  return ok ? StepsPerS(text.str()) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rc = 0;
  if (dlbatch::bench::HelpOrBadPairs(argc, argv, kUsage, true, &rc)) return rc;
  int repeats = 3, starts = 10;
  double seconds = 15;
  std::string report_every = "1";
  std::string bin = SelfDir();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--repeats") {
      repeats = std::atoi(v.c_str());
    } else if (a == "--starts") {
      starts = std::atoi(v.c_str());
    } else if (a == "--seconds") {
      seconds = std::atof(v.c_str());
    } else if (a == "--report-every") {
      report_every = v;
    } else if (a == "--bin") {
      bin = v;
    } else {
      std::cerr << "unknown flag " << a << "\n" << kUsage;
      return 2;
    }
  }
  if (repeats < 1 || starts < 1 || seconds <= 0 ||
      std::atoi(report_every.c_str()) < 1) {
    std::cerr << "--repeats, --starts and --report-every must be at least 1, "
                 "--seconds above 0\n";
    return 2;
  }
  std::string ignored;
  if (Capture({kPython, "-c", "import torch"}, &ignored) != 0) {
    std::cerr << kPython
              << " cannot import torch (install Debian's python3-torch)\n";
    return 1;
  }
  char tmpl[] = "/tmp/dlbatch-pytorch-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string examples =
      std::string(DLBATCH_BENCH_SOURCE_DIR) + "/../examples/pytorch";
  const std::string hand = dir + "/by-hand";
  fs::create_directories(hand);
  fs::copy_file(examples + "/ddp_train.py", hand + "/ddp_train.py");

  const std::string sock = "unix:" + dir + "/sched.sock";
  pid_t scheduler =
      SpawnLogged({bin + "/dlbatch-scheduler", "--state-dir", dir + "/state",
                   "--listen", sock, "--ready-file", dir + "/ready"},
                  dir + "/scheduler.log");
  WaitUntil([&] { return fs::exists(dir + "/ready"); }, 15000);
  std::vector<pid_t> workers;
  for (const char* name : {"a", "b"}) {
    workers.push_back(
        SpawnLogged({bin + "/dlbatch-worker", "--scheduler", sock, "--work-dir",
                     absl::StrCat(dir, "/worker-", name), "--name", name,
                     "--cpu-slots", "1", "--host", "127.0.0.1"},
                    absl::StrCat(dir, "/worker-", name, ".log")));
  }
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {bin + "/dlbatch", "--scheduler", sock};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out;
    Capture(argv, &out);
    return out;
  };
  auto show = [&](int64_t id) {
    return nlohmann::json::parse(cli({"show", "--json", std::to_string(id)}),
                                 nullptr, false);
  };
  auto stop = [&](const std::string& why) {
    if (!why.empty()) std::cerr << why << "; logs in " << dir << "\n";
    for (pid_t w : workers) kill(w, SIGTERM);
    kill(scheduler, SIGTERM);
    for (pid_t w : workers) waitpid(w, nullptr, 0);
    waitpid(scheduler, nullptr, 0);
    return why.empty() ? 0 : 1;
  };
  if (!WaitUntil(
          [&] {
            const nlohmann::json w = nlohmann::json::parse(
                cli({"workers", "--json"}), nullptr, false);
            return w.is_object() && w["workers"].is_array() &&
                   w["workers"].size() == 2;
          },
          15000)) {
    return stop("the workers did not come online");
  }
  // Waits for its end with one `dlbatch wait` (a CLI started every few ms
  // to poll `show` would take the CPU the ranks train on); false if it did
  // not finish well.
  auto finished = [&](int64_t id, int timeout_s) {
    std::string out;
    return Capture({bin + "/dlbatch", "--scheduler", sock, "wait", "--timeout",
                    absl::StrCat(timeout_s, "s"), std::to_string(id)},
                   &out) == 0;
  };

  // (a) Steps for about `seconds` of training, from a warm-up by hand.
  const double warm = ByHand(hand, {"--steps", "500", "--log-every", "100000"},
                             dir + "/warm-up");
  if (warm <= 0) return stop("the warm-up run by hand failed");
  const int steps = std::max(100, static_cast<int>(warm * seconds));
  // A checkpoint about every 2 s, as a long run might keep them.
  const int every = std::max(10, static_cast<int>(warm * 2));
  const std::vector<std::string> train_args = {"--steps",
                                               std::to_string(steps),
                                               "--checkpoint-every",
                                               std::to_string(every),
                                               "--log-every",
                                               "100000",
                                               "--report-every",
                                               report_every};
  std::vector<double> by_hand, through, hand_daemons_cpu, job_daemons_cpu;
  // What the scheduler and the workers spend on the CPU during a run.
  auto daemons_cpu = [&] {
    double s = CpuSeconds(scheduler);
    for (pid_t w : workers) s += CpuSeconds(w);
    return s;
  };
  for (int r = 0; r < repeats; ++r) {
    auto hand_run = [&] {
      const double cpu = daemons_cpu();
      const double v = ByHand(hand, train_args, absl::StrCat(dir, "/hand-", r));
      if (v > 0) by_hand.push_back(v);
      hand_daemons_cpu.push_back(daemons_cpu() - cpu);
      return v > 0;
    };
    auto job_run = [&] {
      std::vector<std::string> submit = {
          "submit",       "-q",          examples + "/ddp-per-slot.yaml",
          "--time-limit", "30m",         "--",
          kPython,        "ddp_train.py"};
      submit.insert(submit.end(), train_args.begin(), train_args.end());
      const double cpu = daemons_cpu();
      const int64_t id = std::atoll(cli(submit).c_str());
      if (id <= 0 || !finished(id, 600)) return false;
      job_daemons_cpu.push_back(daemons_cpu() - cpu);
      const double v = StepsPerS(cli({"diary", std::to_string(id)}));
      if (v > 0) through.push_back(v);
      return v > 0;
    };
    // Alternate which goes first, so a drift in the machine's load falls
    // on both.
    const bool ok =
        r % 2 == 0 ? hand_run() && job_run() : job_run() && hand_run();
    if (!ok) return stop(absl::StrCat("training run ", r, " failed"));
  }

  // (b) Start-up: submit (the scheduler's time) to the last process's own
  // timestamp.
  struct StartCase {
    const char* what;
    std::string yaml;
    int processes;
    std::vector<double> ms;
  };
  const std::string stamp = bin + "/bench_stamp";
  std::vector<StartCase> cases = {
      {"pool 1, plain command", "pool: 1\n", 1, {}},
      {"pool 1, launch: per-slot", "pool: 1\nlaunch: per-slot\n", 1, {}},
      {"pool 2 over 2 workers, launch: per-slot",
       "pool: 2\nmax_nodes: 2\nlaunch: per-slot\n",
       2,
       {}},
  };
  for (int s = 0; s < starts; ++s) {
    for (StartCase& c : cases) {
      const std::string stamps =
          absl::StrCat(dir, "/stamps-", s, "-", c.processes, c.yaml.size());
      const std::string job = dir + "/start.yaml";
      std::ofstream(job) << "name: start\n"
                         << c.yaml << "command: [" << stamp << ", " << stamps
                         << "]\n";
      const int64_t id = std::atoll(cli({"submit", "-q", job}).c_str());
      if (id <= 0 || !finished(id, 60)) return stop("a start job failed");
      const nlohmann::json j = show(id);
      std::ifstream in(stamps);
      int64_t last_ns = 0;
      int seen = 0;
      for (long long ns, job_id; in >> ns >> job_id; ++seen) {
        last_ns = std::max<int64_t>(last_ns, ns);
      }
      if (seen != c.processes) return stop("a start job's stamps are missing");
      c.ms.push_back(static_cast<double>(last_ns) / 1e6 -
                     static_cast<double>(TimeMs(j["submit_time"])));
    }
  }
  stop("");
  fs::remove_all(dir);

  const double hand_median = Median(by_hand), job_median = Median(through);
  const double ratio = job_median / hand_median;
  const double one = Median(cases[0].ms), one_launch = Median(cases[1].ms),
               two = Median(cases[2].ms);
  std::printf(
      "\nDDP: examples/pytorch/ddp_train.py, gloo, 2 ranks, %d steps of a "
      "global batch of 64 (about %.0f s), a checkpoint every %d steps; "
      "median of %d\n\n",
      steps, seconds, every, repeats);
  std::printf("| measure | by hand | through dlbatch | ratio | goal | met |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf(
      "| DDP steps/s (rank 0's loop) | %.1f | %.1f | %.3f | >= 0.98 | %s |\n",
      hand_median, job_median, ratio, ratio >= 0.98 ? "yes" : "no");
  auto each = [](const std::vector<double>& v) {
    std::string out;
    for (double x : v)
      absl::StrAppend(&out, out.empty() ? "" : ", ",
                      absl::StrFormat("%.1f", x));
    return out;
  };
  std::printf("| each run, in order | %s | %s | | | |\n", each(by_hand).c_str(),
              each(through).c_str());
  std::printf(
      "| scheduler + workers' CPU during a run (s) | %.2f | %.2f | | | |\n",
      Median(hand_daemons_cpu), Median(job_daemons_cpu));
  std::printf(
      "\nStart-up: the scheduler's submit time -> the last process's own "
      "start (bench_stamp); median of %d\n\n",
      starts);
  std::printf("| job | submit -> last process started (ms) |\n|---|---|\n");
  for (const StartCase& c : cases) {
    std::printf("| %s | %.1f |\n", c.what, Median(c.ms));
  }
  std::printf("\n| extra start-up of the 2-part job | ms | goal | met |\n");
  std::printf("|---|---|---|---|\n");
  std::printf("| over pool 1, plain | %.1f | <= 100 | %s |\n", two - one,
              two - one <= 100 ? "yes" : "no");
  std::printf("| over pool 1, launch: per-slot | %.1f | | |\n",
              two - one_launch);
  return 0;
}
