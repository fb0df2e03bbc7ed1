#include "scheduler/slurm/tool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace dlbatch::scheduler::slurm {
namespace {

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

// Closes whichever ends are still open.
struct Pipes {
  int fds[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};  // stdin, stdout, stderr
  ~Pipes() {
    for (auto& p : fds) {
      for (int fd : p) {
        if (fd >= 0) close(fd);
      }
    }
  }
  void Close(int i, int end) {
    if (fds[i][end] >= 0) close(fds[i][end]);
    fds[i][end] = -1;
  }
};

std::string Named(const std::vector<std::string>& argv) {
  return argv.empty() ? "(nothing)" : argv[0];
}

// The tool's own words, for an error: its stderr, else its stdout.
std::string Said(const ToolResult& r) {
  absl::string_view s = absl::StripAsciiWhitespace(r.err);
  if (s.empty()) s = absl::StripAsciiWhitespace(r.out);
  return s.empty() ? absl::StrCat("exit ", r.exit_code) : std::string(s);
}

}  // namespace

ProcessSlurmTool::ProcessSlurmTool(std::map<std::string, std::string> env,
                                   int64_t deadline_ms)
    : env_(std::move(env)), deadline_ms_(deadline_ms) {}

absl::StatusOr<ToolResult> ProcessSlurmTool::Run(
    const std::vector<std::string>& argv, const std::string& input) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  Pipes p;
  for (auto& fds : p.fds) {
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return absl::ErrnoToStatus(errno, "making a pipe for a Slurm tool");
    }
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, p.fds[0][0], 0);
  posix_spawn_file_actions_adddup2(&actions, p.fds[1][1], 1);
  posix_spawn_file_actions_adddup2(&actions, p.fds[2][1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The scheduler ignores SIGPIPE and blocks its signals; the tool gets the
  // defaults back.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv = *e;
    absl::string_view name = kv.substr(0, kv.find('='));
    if (env_.count(std::string(name)) == 0) env_store.emplace_back(kv);
  }
  for (const auto& [k, v] : env_) env_store.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  pid_t pid = 0;
  const int err =
      posix_spawnp(&pid, cargv[0], &actions, &attr, cargv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot run ", Named(argv),
                          " (is Slurm's client installed on the scheduler's "
                          "machine, and on its PATH?)"));
  }
  p.Close(0, 0);
  p.Close(1, 1);
  p.Close(2, 1);
  fcntl(p.fds[0][1], F_SETFL, O_NONBLOCK);

  ToolResult r;
  size_t written = 0;
  if (input.empty()) p.Close(0, 1);
  const int64_t deadline = NowMs() + deadline_ms_;
  bool timed_out = false;
  while (p.fds[1][0] >= 0 || p.fds[2][0] >= 0) {
    const int64_t left = deadline - NowMs();
    if (left <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd fds[3] = {{p.fds[0][1], POLLOUT, 0},
                     {p.fds[1][0], POLLIN, 0},
                     {p.fds[2][0], POLLIN, 0}};
    if (poll(fds, 3, static_cast<int>(std::min<int64_t>(left, 1000))) < 0 &&
        errno != EINTR) {
      kill(pid, SIGKILL);
      break;
    }
    if (fds[0].fd >= 0 && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n =
          write(p.fds[0][1], input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) written = input.size();
      if (written == input.size()) p.Close(0, 1);
    }
    for (int i = 1; i <= 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      char buf[16384];
      ssize_t n = read(p.fds[i][0], buf, sizeof buf);
      if (n > 0) {
        (i == 1 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        p.Close(i, 0);
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(absl::StrJoin(argv, " "), " did not answer within ",
                     deadline_ms_ / 1000, " s (is slurmctld up?)"));
  }
  r.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

absl::StatusOr<int64_t> SubmitBatch(SlurmTool& tool,
                                    const SlurmProfile& profile,
                                    const BatchRequest& request,
                                    const WorkerLaunch& launch) {
  absl::StatusOr<ToolResult> r = tool.Run(
      SbatchArgv(profile, request), BatchScript(profile, request, launch));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Slurm refused the job: ", Said(*r)));
  }
  return ParseSbatchParsable(r->out);
}

absl::StatusOr<std::vector<SqueueRow>> ReadQueue(
    SlurmTool& tool, const std::vector<std::string>& partitions) {
  absl::StatusOr<ToolResult> r = tool.Run(SqueueArgv(partitions), "");
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("squeue failed: ", Said(*r)));
  }
  return ParseSqueue(r->out);
}

absl::StatusOr<PartitionLimits> ReadPartition(SlurmTool& tool,
                                              const SlurmProfile& profile) {
  absl::StatusOr<ToolResult> r = tool.Run(SinfoArgv(profile.partition), "");
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sinfo failed: ", Said(*r)));
  }
  return ParseSinfo(r->out, profile.partition, profile.gres_name);
}

absl::StatusOr<PartitionView> ReadPartitionView(SlurmTool& tool,
                                                const SlurmProfile& profile) {
  absl::StatusOr<ToolResult> r =
      tool.Run(SinfoNodesArgv(profile.partition), "");
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sinfo failed: ", Said(*r)));
  }
  return ParseSinfoNodes(r->out, profile.partition, profile.gres_name);
}

absl::Status CancelBatch(SlurmTool& tool, int64_t slurm_id) {
  absl::StatusOr<ToolResult> r =
      tool.Run({"scancel", absl::StrCat(slurm_id)}, "");
  if (!r.ok()) return r.status();
  return ScancelOutcome(r->exit_code, r->err);
}

absl::Status SignalBatch(SlurmTool& tool, int64_t slurm_id,
                         const std::string& signal) {
  absl::StatusOr<ToolResult> r =
      tool.Run(ScancelSignalArgv(slurm_id, signal), "");
  if (!r.ok()) return r.status();
  return ScancelOutcome(r->exit_code, r->err);
}

absl::StatusOr<std::vector<NodeRow>> ReadNodeRows(SlurmTool& tool,
                                                  const SlurmProfile& profile) {
  absl::StatusOr<ToolResult> r =
      tool.Run(SinfoNodeRowsArgv(profile.partition), "");
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sinfo failed: ", Said(*r)));
  }
  return ParseSinfoNodeRows(r->out, profile.gres_name);
}

}  // namespace dlbatch::scheduler::slurm
