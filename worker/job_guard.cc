#include "worker/job_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "absl/strings/str_cat.h"
#include "worker/job_cgroups.h"

namespace dlbatch::worker {
namespace {

void SleepMs(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

int64_t MonotonicMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

[[noreturn]] void RunGuard(int read_fd, const GuardConfig& config) {
  // Out of the worker's process group and session: a signal meant for the
  // worker's group (a terminal's ^C) is not one for the guard, which leaves
  // once the worker has gone.
  setsid();
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE})
    signal(sig, SIG_IGN);
  prctl(PR_SET_NAME, "dlbatch-guard", 0, 0, 0);
  if (chdir("/") != 0) {
  }
  // Nothing of the worker's (its lock file above all) is held here.
  syscall(SYS_close_range, 3u, static_cast<unsigned>(read_fd) - 1, 0u);
  syscall(SYS_close_range, static_cast<unsigned>(read_fd) + 1, ~0u, 0u);
  char buf[64];
  for (;;) {
    ssize_t n = read(read_fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  KillWorkerJobs(config, 5000);
  _exit(0);
}

}  // namespace

int KillWorkerJobs(const GuardConfig& config, int timeout_ms) {
  std::set<pid_t> killed;
  const int64_t deadline = MonotonicMs() + timeout_ms;
  for (;;) {
    bool any = false;
    if (!config.cgroup_root.empty()) {
      int n = KillCgroupsUnder(config.cgroup_root);
      any |= n > 0;
    }
    if (!config.mark_prefix.empty()) {
      for (pid_t pid : MarkedProcesses(config.mark_prefix)) {
        if (kill(pid, SIGKILL) == 0) {
          killed.insert(pid);
          any = true;
        }
      }
    }
    if (!any || MonotonicMs() >= deadline) break;
    SleepMs(20);
  }
  if (!config.cgroup_root.empty()) {
    // This run's folder, then the work folder's if no other run uses it.
    rmdir(config.cgroup_root.c_str());
    const size_t slash = config.cgroup_root.rfind('/');
    if (slash != std::string::npos && slash > 0)
      rmdir(config.cgroup_root.substr(0, slash).c_str());
  }
  return static_cast<int>(killed.size());
}

absl::StatusOr<JobGuard> StartJobGuard(const GuardConfig& config) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return absl::ErrnoToStatus(errno, "making the job guard's pipe");
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::ErrnoToStatus(err, "starting the job guard");
  }
  if (pid == 0) {
    close(fds[1]);
    RunGuard(fds[0], config);
  }
  close(fds[0]);
  return JobGuard{fds[1], pid};
}

bool EndJobGuard(JobGuard* guard, int timeout_ms) {
  if (guard->fd >= 0) close(guard->fd);
  guard->fd = -1;
  if (guard->pid <= 0) return true;
  const int64_t deadline = MonotonicMs() + timeout_ms;
  for (;;) {
    const pid_t r = waitpid(guard->pid, nullptr, WNOHANG);
    // ECHILD: reaped already (the process runner reaps every child).
    if (r == guard->pid || (r < 0 && errno == ECHILD)) break;
    if (r < 0 && errno == EINTR) continue;
    if (MonotonicMs() >= deadline) return false;
    SleepMs(5);
  }
  guard->pid = 0;
  return true;
}

}  // namespace dlbatch::worker
