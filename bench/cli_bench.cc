// One `dlbatch submit` from a fresh process, as a user or a script runs it,
// against Slurm's `sbatch` measured beside it (goal: at most 10 ms).
// Prints a markdown table; nothing is asserted.
//
//   cli_bench [--runs N] [--cli PATH]
//
// A real dlbatch-scheduler on a Unix socket with one real worker whose
// only slot is held by a sleeping job, so the submitted jobs stay queued;
// and, where tests/slurm/slurm-cluster.sh can start Slurm here, a real
// two-node Slurm whose `sbatch --hold` jobs stay pending. The commands run
// in turn (dlbatch, sbatch, dlbatch, ...), so load that comes and goes
// falls on both. --cli measures another build of the CLI beside this one
// (such as one linked against shared libraries). The last rows submit on
// the embedded local default (no --scheduler: the CLI first checks that the
// local cluster in a temp XDG_STATE_HOME runs), where its worker runs them.
// Rows "through gRPC" are the same CLI with its direct calls turned off
// (DLBATCH_DIRECT_CALLS=0): the call made through gRPC's runtime, as before.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_args.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

std::string SelfDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// Runs argv with `env` added, output to /dev/null; returns the exit code
// and the wall time in ms.
std::pair<int, double> Run(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env = {},
                           const std::string& out = "/dev/null") {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.push_back(*e);
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  std::vector<std::string> a = argv;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  const auto t0 = Clock::now();
  pid_t pid = 0;
  int rc =
      posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return {127, 0};
  int status = 0;
  waitpid(pid, &status, 0);
  const double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, ms};
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Series {
  std::string what;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::vector<double> ms;
  int failures = 0;
};

}  // namespace

constexpr char kUsage[] =
    "usage: cli_bench [--runs N] [--cli PATH]\n"
    "Times one `dlbatch submit` from a fresh process against `sbatch` beside "
    "it\n"
    "(on the test Slurm, where there is one); prints a markdown table\n"
    "(bench/RESULTS.md).\n";

int main(int argc, char** argv) {
  int runs = 30;
  std::string other_cli;
  if (int rc; dlbatch::bench::HelpOrBadPairs(argc, argv, kUsage, true, &rc)) {
    return rc;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (flag == "--cli") {
      other_cli = argv[i + 1];
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  char tmpl[] = "/tmp/dlbcli-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  const std::string bin = SelfDir();
  const std::string socket = "unix:" + root + "/s.sock";

  // The scheduler and a worker whose one slot a sleeping job holds.
  std::vector<pid_t> daemons;
  auto start = [&](std::vector<std::string> args, const std::string& log) {
    pid_t pid = fork();
    if (pid == 0) {
      freopen(log.c_str(), "w", stdout);
      freopen(log.c_str(), "a", stderr);
      std::vector<char*> a;
      for (auto& s : args) a.push_back(s.data());
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
    daemons.push_back(pid);
  };
  start({bin + "/dlbatch-scheduler", "--config", "", "--state-dir",
         root + "/state", "--listen", socket, "--ready-file", root + "/ready"},
        root + "/scheduler.log");
  for (int i = 0; i < 300 && !std::filesystem::exists(root + "/ready"); ++i)
    usleep(50000);
  start({bin + "/dlbatch-worker", "--config", "", "--scheduler", socket,
         "--work-dir", root + "/worker", "--cpu-slots", "1", "--name", "w"},
        root + "/worker.log");
  const std::string cli = bin + "/dlbatch";
  for (int i = 0; i < 100; ++i) {
    if (Run({cli, "--scheduler", socket, "submit", "-q", "--", "sleep", "3600"})
            .first == 0)
      break;
    usleep(100000);  // the worker has not joined yet
  }

  // Slurm beside it, where it can run here.
  const std::string slurm_dir = root + "/slurm";
  const std::string rig = std::string(DLBATCH_BENCH_SOURCE_DIR) +
                          "/../tests/slurm/slurm-cluster.sh";
  const bool slurm = Run({"/bin/bash", rig, "start", slurm_dir}).first == 0;
  const std::map<std::string, std::string> slurm_env = {
      {"SLURM_CONF", slurm_dir + "/slurm.conf"}};

  std::vector<Series> series;
  series.push_back({"`/bin/true` from a fresh process — floor", {"/bin/true"}});
  series.push_back(
      {"`dlbatch --version` (start-up alone)", {cli, "--version"}});
  if (slurm) {
    series.push_back(
        {"`sbatch --parsable --hold --wrap true` — baseline",
         {"/usr/bin/sbatch", "--parsable", "--hold", "--wrap", "true"},
         slurm_env});
  }
  series.push_back(
      {"`dlbatch submit -q -- true`",
       {cli, "--scheduler", socket, "submit", "-q", "--", "true"}});
  // The same CLI making its call through gRPC's runtime, as every call
  // went before the direct calls (client/direct_call.h).
  series.push_back(
      {"`dlbatch submit -q -- true` through gRPC (`DLBATCH_DIRECT_CALLS=0`)",
       {cli, "--scheduler", socket, "submit", "-q", "--", "true"},
       {{"DLBATCH_DIRECT_CALLS", "0"}}});
  if (!other_cli.empty()) {
    series.push_back(
        {absl::StrCat("`dlbatch submit -q -- true` with ", other_cli),
         {other_cli, "--scheduler", socket, "submit", "-q", "--", "true"}});
  }
  // The embedded local default: no --scheduler, so the CLI finds (here,
  // on the warm-up run, starts) the local cluster in XDG_STATE_HOME first.
  const std::map<std::string, std::string> local_env = {
      {"XDG_STATE_HOME", root + "/xdg"}, {"DLBATCH_SCHEDULER", ""}};
  series.push_back({"`dlbatch submit -q -- true` on the local default",
                    {cli, "submit", "-q", "--", "true"},
                    local_env});
  auto local_grpc_env = local_env;
  local_grpc_env["DLBATCH_DIRECT_CALLS"] = "0";
  series.push_back(
      {"`dlbatch submit -q -- true` on the local default, "
       "through gRPC",
       {cli, "submit", "-q", "--", "true"},
       local_grpc_env});
  if (!other_cli.empty()) {
    series.push_back(
        {absl::StrCat("`dlbatch submit -q -- true` on the local default with ",
                      other_cli),
         {other_cli, "submit", "-q", "--", "true"},
         local_env});
  }
  for (Series& s : series) Run(s.argv, s.env);  // warm the page cache
  for (int r = 0; r < runs; ++r) {
    for (Series& s : series) {
      auto [rc, ms] = Run(s.argv, s.env);
      if (rc != 0) ++s.failures;
      s.ms.push_back(ms);
    }
  }

  double sbatch_median = 0;
  for (const Series& s : series) {
    if (s.argv[0] == "/usr/bin/sbatch") sbatch_median = Percentile(s.ms, 0.5);
  }
  std::printf(
      "| measure (%d runs each, in turn) | median | min | p90 | vs "
      "sbatch | goal | |\n|---|---|---|---|---|---|---|\n",
      runs);
  for (const Series& s : series) {
    const double median = Percentile(s.ms, 0.5);
    const bool submit =
        std::find(s.argv.begin(), s.argv.end(), "submit") != s.argv.end();
    std::printf(
        "| %s%s | %.1f ms | %.1f ms | %.1f ms | %s | %s | %s |\n",
        s.what.c_str(),
        s.failures ? absl::StrCat(" (", s.failures, " failed)").c_str() : "",
        median, Percentile(s.ms, 0.0), Percentile(s.ms, 0.9),
        sbatch_median > 0
            ? absl::StrFormat("%.2fx", median / sbatch_median).c_str()
            : "-",
        submit ? "<= 10 ms" : "-",
        submit ? (median <= 10 ? "met" : "MISSED") : "");
  }
  if (!slurm) std::printf("\n(Slurm could not start here: no sbatch row)\n");

  if (slurm) Run({"/bin/bash", rig, "stop", slurm_dir});
  Run({cli, "local", "stop", "--force"}, local_env);
  for (pid_t pid : daemons) kill(pid, SIGTERM);
  for (pid_t pid : daemons) waitpid(pid, nullptr, 0);
  std::filesystem::remove_all(root);
  return 0;
}
