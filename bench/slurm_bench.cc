// dlbatch on a Slurm profile against Slurm alone, on the same real two-node
// Slurm (tests/slurm/slurm-cluster.sh) in one run: the same command as a
// dlbatch job and as `sbatch --wrap`, in turn. Prints a
// markdown table; nothing is asserted.
//
//   slurm_bench [--runs N]
//
// submit -> first line: from the submit command's start to the job's first
// line in `dlbatch diary -f` (dlbatch) or in the Slurm output file, polled
// every 2 ms (Slurm); split, by Slurm's logs, into submit -> slurmctld has
// the job and slurmd launched the batch job -> first line. end -> outputs
// fetchable: from the command's last instant (it prints the time as it ends) to
// `dlbatch wait` returning (the outputs are committed before the job's end is)
// or to squeue no longer showing the job running (Slurm: its output file is
// complete). The extra time dlbatch adds per job is the sum of the two phases'
// differences of medians (goal <= 150 ms): Slurm's scheduling between them
// moves each run by up to seconds with the phase of its allocation beat. The
// scheduler listens on TCP on loopback, as a Slurm profile needs.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string SelfDir() {
  return fs::read_symlink("/proc/self/exe").parent_path();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts argv with stdout to a pipe (read end in *out_fd) or to `out`,
// stderr to `err`.
pid_t Spawn(const std::vector<std::string>& argv, int* out_fd,
            const std::string& out = "/dev/null",
            const std::string& err = "/dev/null") {
  std::vector<std::string> a = argv;
  std::vector<char*> args;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int fds[2] = {-1, -1};
  if (out_fd != nullptr) {
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_t pid = 0;
  const int rc =
      posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (out_fd != nullptr) {
    close(fds[1]);
    *out_fd = fds[0];
  }
  return rc == 0 ? pid : -1;
}

// Runs argv to its end; its standard output.
std::string Output(const std::vector<std::string>& argv, int* code = nullptr) {
  int fd = -1;
  const pid_t pid = Spawn(argv, &fd);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  close(fd);
  int status = 0;
  waitpid(pid, &status, 0);
  if (code != nullptr) *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Min(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}
double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// The command both run: a first line, a second of work, an output file,
// and the instant it ends (ms since the epoch) as its last line.
std::string Command(const std::string& out_file) {
  return absl::StrCat("echo first; sleep 1; echo out > ", out_file,
                      "; echo end=$(date +%s%3N)");
}

double EndOf(const std::string& text) {
  const size_t at = text.rfind("end=");
  double ms = 0;
  if (at == std::string::npos) return 0;
  absl::string_view rest(text);
  rest.remove_prefix(at + 4);
  rest = rest.substr(0, rest.find('\n'));
  return absl::SimpleAtod(rest, &ms) ? ms : 0;
}

// Slurm's own instants of its jobs, from its logs (ms resolution, local
// time): when slurmctld took each submission ("_slurm_rpc_submit_batch_job:
// JobId=N") and when a slurmd launched each batch job ("Launching batch job
// N"). They split a start into the time before Slurm has the job, Slurm's
// scheduling and launch (the same for both, and noisy: it allocates on a
// beat), and the time from the launch to the first line.
double LogInstantMs(absl::string_view line) {
  // "[2026-11-28T00:36:37.789] ..."
  if (line.size() < 25 || line[0] != '[') return 0;
  struct tm tm = {};
  if (strptime(std::string(line.substr(1, 19)).c_str(), "%Y-%m-%dT%H:%M:%S",
               &tm) == nullptr) {
    return 0;
  }
  tm.tm_isdst = -1;
  int ms = 0;
  if (!absl::SimpleAtoi(line.substr(21, 3), &ms)) return 0;
  return static_cast<double>(mktime(&tm)) * 1000 + ms;
}
std::map<int64_t, double> SlurmInstants(const std::string& log,
                                        absl::string_view marker,
                                        absl::string_view after) {
  std::map<int64_t, double> at;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const size_t m = line.find(marker);
    if (m == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(m + marker.size());
    rest = rest.substr(0, rest.find(after));
    int64_t id = 0;
    if (absl::SimpleAtoi(rest, &id)) at[id] = LogInstantMs(line);
  }
  return at;
}

struct Series {
  std::vector<double> first, fetchable;
  // Per run: the submit command's start and the first line's instant, and
  // the Slurm job id, for the phases Slurm's logs tell apart.
  std::vector<double> t0, first_at;
  std::vector<int64_t> slurm_ids;
  // Submit command start -> slurmctld has the job; slurmd launched the
  // batch job -> first line.
  std::vector<double> to_slurm, launch_to_first;
  int failures = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (flag == "--keep") {
      keep = true;  // the logs stay (the daemons are stopped)
    } else {
      std::cerr << "usage: slurm_bench [--runs N] [--keep]\n"
                   "  dlbatch jobs on a Slurm profile against sbatch --wrap "
                   "of the same command,\n  on a real two-node Slurm started "
                   "here (tests/slurm/slurm-cluster.sh)\n";
      return flag == "--help" ? 0 : 2;
    }
  }
  char tmpl[] = "/tmp/dlbslurm-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  const std::string bin = SelfDir();
  const std::string rig = std::string(DLBATCH_BENCH_SOURCE_DIR) +
                          "/../tests/slurm/slurm-cluster.sh";
  int code = 0;
  Output({"/bin/bash", rig, "start", root + "/slurm"}, &code);
  if (code != 0) {
    std::printf("Slurm could not start here (slurm-cluster.sh exit %d)\n",
                code);
    fs::remove_all(root);
    return code == 2 ? 77 : 1;
  }
  setenv("SLURM_CONF", (root + "/slurm/slurm.conf").c_str(), 1);
  const std::string nodes = root + "/nodes";
  fs::create_directories(nodes);
  {
    std::ofstream(root + "/scheduler.yaml")
        << "profiles:\n  hpc:\n    type: slurm\n    partition: gpu\n"
           "    gpus_per_node: 2\n    bin_dir: "
        << bin << "\n    node_dir: " << nodes << "\n";
  }
  const pid_t scheduler =
      Spawn({bin + "/dlbatch-scheduler", "--config", root + "/scheduler.yaml",
             "--state-dir", root + "/state", "--listen", "127.0.0.1:0",
             "--ready-file", root + "/ready"},
            nullptr, root + "/scheduler.log", root + "/scheduler.log");
  for (int i = 0; i < 300 && ReadAll(root + "/ready").empty(); ++i)
    usleep(50000);
  const std::string address(
      absl::StripTrailingAsciiWhitespace(ReadAll(root + "/ready")));
  setenv("DLBATCH_CA", (root + "/state/ca.pem").c_str(), 1);
  setenv("DLBATCH_TOKEN",
         std::string(absl::StripAsciiWhitespace(ReadAll(root + "/state/token")))
             .c_str(),
         1);
  const std::vector<std::string> cli = {bin + "/dlbatch", "--scheduler",
                                        address};
  auto dlbatch = [&](std::vector<std::string> args, int* rc = nullptr) {
    std::vector<std::string> a = cli;
    a.insert(a.end(), args.begin(), args.end());
    return Output(a, rc);
  };

  // The scheduler names its Slurm jobs dlbatch-<instance>-<job id>; its log
  // says the instance once its Slurm side has started.
  std::string instance;
  auto slurm_name = [&](const std::string& id) {
    if (instance.empty()) {
      const std::string log = ReadAll(root + "/scheduler.log");
      const std::string mark = "are named dlbatch-";
      const size_t at = log.find(mark);
      if (at != std::string::npos) {
        instance =
            log.substr(at + mark.size(),
                       log.find('-', at + mark.size()) - at - mark.size());
      }
    }
    return absl::StrCat("dlbatch-", instance, "-", id);
  };

  Series d, s;
  for (int r = 0; r < runs; ++r) {
    // dlbatch
    {
      const std::string job = absl::StrCat(root, "/job", r, ".yaml");
      std::ofstream(job) << "name: bench\nprofile: hpc\npool: 1\ncommand: "
                            "[sh, -c, '"
                         << Command("$DLBATCH_OUTPUT_DIR/result.txt") << "']\n";
      const double t0 = NowMs();
      int rc = 0;
      const std::string id(
          absl::StripAsciiWhitespace(dlbatch({"submit", "-q", job}, &rc)));
      int fd = -1;
      std::vector<std::string> follow = cli;
      for (const char* a : {"diary", "-f"}) follow.push_back(a);
      follow.push_back(id);
      const pid_t f = rc == 0 ? Spawn(follow, &fd) : -1;
      std::string text;
      double first = 0;
      char buf[4096];
      ssize_t n;
      while (f > 0 && (n = read(fd, buf, sizeof buf)) > 0) {
        text.append(buf, n);
        if (first == 0 && text.find("first\n") != std::string::npos)
          first = NowMs();
        if (text.find("end=") != std::string::npos &&
            text.find('\n', text.find("end=")) != std::string::npos)
          break;
      }
      if (f > 0) {
        kill(f, SIGTERM);
        waitpid(f, nullptr, 0);
        close(fd);
      }
      dlbatch({"wait", id});
      const double done = NowMs();
      const double end = EndOf(text);
      int64_t slurm_id = 0;
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(Output(
                                 {"squeue", "-h", "--states=all",
                                  "--name=" + slurm_name(id), "-o", "%i"})),
                             &slurm_id);
      if (rc != 0 || first == 0 || end == 0) {
        ++d.failures;
      } else {
        d.first.push_back(first - t0);
        d.fetchable.push_back(done - end);
        d.t0.push_back(t0);
        d.first_at.push_back(first);
        d.slurm_ids.push_back(slurm_id);
      }
    }
    // Slurm alone
    {
      const std::string out = absl::StrCat(root, "/slurm-", r, ".out");
      const std::string result = absl::StrCat(root, "/slurm-result-", r);
      const double t0 = NowMs();
      int rc = 0;
      const std::string id(absl::StripAsciiWhitespace(
          Output({"sbatch", "--parsable", "--partition=gpu", "--nodes=1",
                  "--ntasks=1", "--gres=gpu:1", "--export=NONE",
                  "--output=" + out, "--wrap", Command(result)},
                 &rc)));
      double first = 0;
      for (int i = 0; rc == 0 && i < 30000 && first == 0; ++i) {
        if (ReadAll(out).find("first\n") != std::string::npos)
          first = NowMs();
        else
          usleep(2000);
      }
      double done = 0;
      for (int i = 0; rc == 0 && i < 30000 && done == 0; ++i) {
        const std::string state(absl::StripAsciiWhitespace(
            Output({"squeue", "-h", "--states=all", "-j", id, "-o", "%T"})));
        if (state != "RUNNING" && state != "COMPLETING" && state != "PENDING" &&
            state != "CONFIGURING") {
          done = NowMs();
        } else {
          usleep(2000);
        }
      }
      const double end = EndOf(ReadAll(out));
      int64_t slurm_id = 0;
      (void)absl::SimpleAtoi(id, &slurm_id);
      if (rc != 0 || first == 0 || end == 0) {
        ++s.failures;
      } else {
        s.first.push_back(first - t0);
        s.fetchable.push_back(done - end);
        s.t0.push_back(t0);
        s.first_at.push_back(first);
        s.slurm_ids.push_back(slurm_id);
      }
    }
  }

  const std::string slurm_dir = root + "/slurm";
  const std::map<int64_t, double> submitted =
      SlurmInstants(ReadAll(slurm_dir + "/slurmctld.log"),
                    "_slurm_rpc_submit_batch_job: JobId=", " ");
  std::map<int64_t, double> launched;
  for (const char* node : {"n1", "n2"}) {
    auto more = SlurmInstants(
        ReadAll(absl::StrCat(slurm_dir, "/slurmd-", node, ".log")),
        "Launching batch job ", " ");
    launched.insert(more.begin(), more.end());
  }
  for (Series* series : {&d, &s}) {
    for (size_t i = 0; i < series->slurm_ids.size(); ++i) {
      auto sub = submitted.find(series->slurm_ids[i]);
      auto launch = launched.find(series->slurm_ids[i]);
      if (sub == submitted.end() || launch == launched.end()) continue;
      series->to_slurm.push_back(sub->second - series->t0[i]);
      series->launch_to_first.push_back(series->first_at[i] - launch->second);
    }
  }

  std::printf(
      "| measure (%d runs each, in turn) | median | min | max |\n"
      "|---|---|---|---|\n",
      runs);
  auto row = [](const char* what, const std::vector<double>& v, int failed) {
    if (v.empty()) {
      std::printf("| %s | not measured (no run matched Slurm's logs) | | |\n",
                  what);
      return;
    }
    std::printf("| %s%s | %.0f ms | %.0f ms | %.0f ms |\n", what,
                failed ? absl::StrCat(" (", failed, " failed)").c_str() : "",
                Median(v), Min(v), Max(v));
  };
  row("`sbatch --wrap`: submit -> first line in its output file", s.first,
      s.failures);
  row("dlbatch on a Slurm profile: submit -> first diary line", d.first,
      d.failures);
  row("`sbatch --wrap`: command end -> squeue no longer shows it running",
      s.fetchable, 0);
  row("dlbatch: command end -> `dlbatch wait` returns (outputs stored)",
      d.fetchable, 0);
  row("`sbatch --wrap`: submit -> slurmctld has the job", s.to_slurm, 0);
  row("dlbatch: submit -> slurmctld has the job (CLI, scheduler, its sbatch)",
      d.to_slurm, 0);
  row("`sbatch --wrap`: slurmd launches the batch job -> first line",
      s.launch_to_first, 0);
  row("dlbatch: slurmd launches the batch job -> first diary line (worker "
      "start, registration, the job's start, the diary)",
      d.launch_to_first, 0);
  // What dlbatch adds is before Slurm has the job and after Slurm launched
  // it; between the two, Slurm's scheduling beat moves each run by up to
  // seconds, the same for both.
  const double extra = (Median(d.to_slurm) - Median(s.to_slurm)) +
                       (Median(d.launch_to_first) - Median(s.launch_to_first));
  const bool split = !d.to_slurm.empty() && !s.to_slurm.empty();
  std::printf(
      "| extra time dlbatch adds to a job's start (differences of the medians "
      "of the two phases above; goal <= 150 ms: %s) | %s | | |\n",
      !split         ? "not measured"
      : extra <= 150 ? "met"
                     : "MISSED",
      split ? absl::StrFormat("%.0f ms", extra).c_str() : "-");
  std::printf(
      "| the same, as the difference of the end-to-end medians (Slurm's "
      "scheduling beat included) | %.0f ms | | |\n",
      Median(d.first) - Median(s.first));

  kill(scheduler, SIGTERM);
  waitpid(scheduler, nullptr, 0);
  Output({"scancel", "--partition=gpu"});
  Output({"/bin/bash", rig, "stop", root + "/slurm"});
  if (keep) {
    std::printf("\nlogs kept in %s\n", root.c_str());
  } else {
    fs::remove_all(root);
  }
  return 0;
}
