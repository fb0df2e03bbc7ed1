// What the system costs around the trainer: a LeNet train job submitted
// through a real scheduler and worker (a Unix socket in a temp folder)
// against the same training run by dlbatch-train directly, alternating,
// with the same ranks and threads (a pool of P CPU slots = one process of
// P thread ranks, one thread each: --thread-ranks, as the worker starts
// it). And whether a pool runs as fast as the machine allows: the pool-P
// job and a pool-1 job through the scheduler against `dlbatch-train
// --ranks 1 --threads P` (one rank whose mini-batch is split over P
// threads), all measured in the same run. Prints markdown tables; the
// figures are not asserted.
//
//   train_job_bench [--pool P] [--iterations N] [--repeats R] [--bin DIR]
//
// Measured per run, from the moments lines arrive on our end of a pipe:
// - start: spawn of `dlbatch submit --follow` to its first diary line,
//   minus spawn of dlbatch-train to its first line (both lines are the
//   trainer's first). Submit, placement, the worker's start and the
//   diary's trip back are what remains.
// - end: the trainer's last line to `submit --follow` exiting (the job is
//   committed as ended only once its outputs are stored, so they are
//   fetchable then), minus dlbatch-train's last line to its exit.
// - images/s: metrics.json of each run (training steps only).
// Medians over the repeats; the first run of each kind warms caches and is
// not counted. The worker passes OMP_WAIT_POLICY on to its jobs (--job-env)
// where it is set, so that both kinds of run wait alike.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_proc.h"

namespace {

namespace fs = std::filesystem;
using dlbatch::bench::Median;
using dlbatch::bench::SpawnLogged;
using Clock = std::chrono::steady_clock;

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";  // the job's data

std::string SelfDir() {
  return fs::read_symlink("/proc/self/exe").parent_path().string();
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// A process whose stdout lines are stamped as they arrive.
struct Timed {
  Clock::time_point spawned, first_line, last_line, exited;
  std::vector<std::string> lines;
  std::vector<Clock::time_point> times;  // of each line
  int status = -1;
};

// Runs argv to its end; lines matching `skip` do not count as first/last.
// With merge_stderr, stderr goes into the same pipe (dlbatch's own lines).
Timed RunTimed(const std::vector<std::string>& argv,
               const std::string& skip_prefix,
               const std::vector<std::pair<std::string, std::string>>& env = {},
               bool merge_stderr = false) {
  Timed t;
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  t.spawned = Clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    if (merge_stderr) {
      dup2(fds[1], 2);
    } else {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 2);
    }
    close(fds[0]);
    close(fds[1]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dlbatch::bench::ExecOrExit(argv);
  }
  close(fds[1]);
  std::string partial;
  char buf[65536];
  bool have_first = false;
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    const auto now = Clock::now();
    partial.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
      std::string line = partial.substr(0, nl);
      partial.erase(0, nl + 1);
      if (!skip_prefix.empty() && line.rfind(skip_prefix, 0) == 0) continue;
      if (!have_first) {
        t.first_line = now;
        have_first = true;
      }
      t.last_line = now;
      t.lines.push_back(std::move(line));
      t.times.push_back(now);
    }
  }
  close(fds[0]);
  waitpid(pid, &t.status, 0);
  t.exited = Clock::now();
  return t;
}

double ImagesPerS(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() ? j.value("images_per_s", 0.0) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  int pool = 2, iterations = 400, repeats = 3;
  std::string bin = SelfDir();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--pool")
      pool = std::atoi(next().c_str());
    else if (a == "--iterations")
      iterations = std::atoi(next().c_str());
    else if (a == "--repeats")
      repeats = std::atoi(next().c_str());
    else if (a == "--bin")
      bin = next();
    else {
      std::cerr << "usage: train_job_bench [--pool P] [--iterations N] "
                   "[--repeats R] [--bin DIR]\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (!fs::exists(std::string(kData) + "/train-images-idx3-ubyte.gz")) {
    std::cerr << "Fashion-MNIST is missing from " << kData
              << " (Debian's dataset-fashion-mnist)\n";
    return 1;
  }
  char tmpl[] = "/tmp/dlbatch-train-job-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // trainer_bench's LeNet job (bench/jobs/lenet.yaml) with a pool and a
  // number of iterations.
  std::string lenet;
  {
    std::ifstream in(std::string(DLBATCH_BENCH_SOURCE_DIR) +
                     "/jobs/lenet.yaml");
    std::ostringstream text;
    text << in.rdbuf();
    lenet = text.str();
  }
  const auto write_job = [&](int job_pool) -> std::string {
    std::string yaml = lenet;
    const size_t name = yaml.find("\nname:");
    const size_t epochs = yaml.find("    max_epochs: 1\n");
    if (name == std::string::npos || epochs == std::string::npos) return "";
    yaml.replace(epochs, std::strlen("    max_epochs: 1"),
                 absl::StrCat("    max_iterations: ", iterations));
    yaml.insert(yaml.find('\n', name + 1) + 1,
                absl::StrCat("pool: ", job_pool, "\n"));
    const std::string path =
        absl::StrCat(dir, "/lenet-pool", job_pool, ".yaml");
    std::ofstream(path) << yaml;
    return path;
  };
  const std::string job = write_job(pool), job1 = write_job(1);
  if (job.empty() || job1.empty()) {
    std::cerr << "bench/jobs/lenet.yaml has no name: or max_epochs: 1 line\n";
    return 1;
  }
  // One kernel-choice cache for both kinds of run, so they compute alike.
  const std::vector<std::pair<std::string, std::string>> env = {
      {"XDG_CACHE_HOME", dir + "/cache"}};
  setenv("XDG_CACHE_HOME", (dir + "/cache").c_str(), 1);

  const std::string sock = "unix:" + dir + "/sched.sock";
  pid_t scheduler =
      SpawnLogged({bin + "/dlbatch-scheduler", "--state-dir", dir + "/state",
                   "--listen", sock, "--ready-file", dir + "/ready"},
                  dir + "/scheduler.log");
  for (int i = 0; i < 300 && !fs::exists(dir + "/ready"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<std::string> worker_argv = {bin + "/dlbatch-worker",
                                          "--scheduler",
                                          sock,
                                          "--work-dir",
                                          dir + "/worker",
                                          "--name",
                                          "bench",
                                          "--cpu-slots",
                                          std::to_string(pool),
                                          "--job-env",
                                          "XDG_CACHE_HOME"};
  for (const char* name : {"OMP_WAIT_POLICY", "OMP_PROC_BIND"}) {
    if (std::getenv(name) != nullptr) {
      worker_argv.push_back("--job-env");
      worker_argv.push_back(name);
    }
  }
  pid_t worker = SpawnLogged(worker_argv, dir + "/worker.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  std::vector<double> start_direct, start_system, end_direct, end_system,
      ips_direct, ips_system, ips_split, ips_pool1;
  // `submit --follow` of `job_file` through the scheduler; its outputs
  // fetched into `fetched`. The trainer's last line (the one before the
  // CLI's own "job N finished") in *trainer_last.
  const auto submit = [&](const std::string& job_file,
                          const std::string& fetched,
                          Clock::time_point* trainer_last) -> Timed {
    Timed s = RunTimed(
        {bin + "/dlbatch", "--scheduler", sock, "submit", "--follow", job_file},
        "Submitted job", env, /*merge_stderr=*/true);
    if (s.status != 0 || s.lines.empty()) return s;
    int64_t id = 0;
    *trainer_last = s.last_line;
    if (s.lines.size() >= 2 && s.lines.back().rfind("job ", 0) == 0) {
      id = std::atoll(s.lines.back().c_str() + 4);
      *trainer_last = s.times[s.times.size() - 2];
    }
    Timed f = RunTimed({bin + "/dlbatch", "--scheduler", sock, "fetch-outputs",
                        std::to_string(id), "-o", fetched},
                       "");
    if (f.status != 0) s.status = f.status;
    return s;
  };
  for (int r = 0; r <= repeats; ++r) {
    const std::string out = absl::StrCat(dir, "/direct-", r);
    const std::string split_out = absl::StrCat(dir, "/split-", r);
    const std::string fetched = absl::StrCat(dir, "/fetched-", r);
    const std::string fetched1 = absl::StrCat(dir, "/fetched1-", r);
    // As the worker starts the pool's job.
    Timed d =
        RunTimed({bin + "/dlbatch-train", job, "--ranks", std::to_string(pool),
                  "--threads", "1", "--thread-ranks", "--output-dir", out},
                 "", env);
    Clock::time_point trainer_last;
    Timed s = submit(job, fetched, &trainer_last);
    // The machine's best: one rank, its mini-batch split over the threads.
    Timed b =
        RunTimed({bin + "/dlbatch-train", job, "--ranks", "1", "--threads",
                  std::to_string(pool), "--output-dir", split_out},
                 "", env);
    Clock::time_point unused;
    Timed s1 = submit(job1, fetched1, &unused);
    if (d.status != 0 || s.status != 0 || b.status != 0 || s1.status != 0 ||
        d.lines.empty() || s.lines.empty()) {
      std::cerr << "run " << r << " failed (direct " << d.status
                << ", through the scheduler " << s.status << ", split "
                << b.status << ", pool 1 " << s1.status << "); logs in " << dir
                << "\n";
      kill(worker, SIGTERM);
      kill(scheduler, SIGTERM);
      return 1;
    }
    if (r == 0) continue;  // warm-up
    start_direct.push_back(Ms(d.first_line - d.spawned));
    start_system.push_back(Ms(s.first_line - s.spawned));
    end_direct.push_back(Ms(d.exited - d.last_line));
    end_system.push_back(Ms(s.exited - trainer_last));
    ips_direct.push_back(ImagesPerS(out + "/metrics.json"));
    ips_system.push_back(ImagesPerS(fetched + "/metrics.json"));
    ips_split.push_back(ImagesPerS(split_out + "/metrics.json"));
    ips_pool1.push_back(ImagesPerS(fetched1 + "/metrics.json"));
  }
  kill(worker, SIGTERM);
  kill(scheduler, SIGTERM);
  waitpid(worker, nullptr, 0);
  waitpid(scheduler, nullptr, 0);
  fs::remove_all(dir);

  const double start_overhead = Median(start_system) - Median(start_direct);
  const double end_overhead = Median(end_system) - Median(end_direct);
  const double ips_ratio =
      Median(ips_system) / std::max(1e-9, Median(ips_direct));
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf(
      "LeNet, batch 64, %d iterations, pool %d (1 process, %d thread ranks x "
      "1 thread), %d repeats (medians), OMP_WAIT_POLICY=%s\n\n",
      iterations, pool, pool, repeats,
      wait_policy != nullptr ? wait_policy : "(unset)");
  std::printf(
      "| measure | dlbatch-train alone | through scheduler + worker | overhead "
      "| goal |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf(
      "| spawn -> first trainer line | %.0f ms | %.0f ms | %+.0f ms | < 150 ms "
      "%s |\n",
      Median(start_direct), Median(start_system), start_overhead,
      start_overhead < 150 ? "(met)" : "(missed)");
  std::printf(
      "| last trainer line -> outputs ready | %.0f ms | %.0f ms | %+.0f ms | < "
      "150 ms %s |\n",
      Median(end_direct), Median(end_system), end_overhead,
      end_overhead < 150 ? "(met)" : "(missed)");
  std::printf("| training images/s | %.0f | %.0f | %.3fx | >= 0.97x %s |\n",
              Median(ips_direct), Median(ips_system), ips_ratio,
              ips_ratio >= 0.97 ? "(met)" : "(missed)");

  // Against the machine's best, measured in this run.
  const double base = std::max(1e-9, Median(ips_split));
  const double pool_ratio = Median(ips_system) / base;
  const double pool1_ratio = Median(ips_pool1) / base;
  std::printf(
      "\n| training images/s | median | vs dlbatch-train --ranks 1 --threads "
      "%d | goal |\n",
      pool);
  std::printf("|---|---|---|---|\n");
  std::printf(
      "| dlbatch-train --ranks 1 --threads %d (baseline) | %.0f | "
      "1.000x | |\n",
      pool, Median(ips_split));
  std::printf(
      "| dlbatch-train --ranks %d --threads 1 --thread-ranks | %.0f | %.3fx "
      "| |\n",
      pool, Median(ips_direct), Median(ips_direct) / base);
  std::printf(
      "| pool %d job, scheduler + %d-slot worker | %.0f | %.3fx | >= 0.95x "
      "%s |\n",
      pool, pool, Median(ips_system), pool_ratio,
      pool_ratio >= 0.95 ? "(met)" : "(missed)");
  std::printf(
      "| pool 1 job, same worker | %.0f | %.3fx | pool %d >= pool 1 %s |\n",
      Median(ips_pool1), pool1_ratio, pool,
      Median(ips_system) >= Median(ips_pool1) ? "(met)" : "(missed)");
  return 0;
}
