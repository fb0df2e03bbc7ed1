#include "worker/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/job_cgroups.h"

extern char** environ;

namespace dlbatch::worker {
namespace {

// Orphaned group members exit without waking poll(), so while a group is
// being waited for (or the leader cannot be watched through a pidfd) Poll
// sleeps at most this long.
constexpr int64_t kReapPollMs = 50;
// Pipes read per subprocess: stdout, stderr and the optional channel (fd 3).
constexpr int kStreams = 3;
constexpr int kPidfdSlot = kStreams;
constexpr size_t kReadChunk = 64 * 1024;
// Per pipe and Poll, so one chatty job cannot starve the others.
constexpr size_t kMaxReadPerPoll = 1024 * 1024;
// What group members wrote before exiting is at most one pipe buffer (1 MiB
// unprivileged); the bound only stops an escaped writer that never pauses.
constexpr int kMaxDrainRounds = 8;
// A group that still has live members this long after a SIGKILL is sent
// SIGKILL again (a fork racing the first one).
constexpr int64_t kRekillMs = 500;
// A group whose only members are zombies that are not ours to reap (their
// parent escaped the group) counts as empty after this long.
constexpr int64_t kZombieOnlyMs = 1000;

// What a child that failed before exec tells its parent through the error
// pipe.
enum ChildStage : int {
  kStageSetup = 1,
  kStageChdir = 2,
  kStageExec = 3,
  kStageCgroup = 4,
  kStageUser = 5
};
struct ChildFailure {
  int stage;
  int err;
};

// Everything the child needs, prepared before fork so the child allocates
// nothing (only async-signal-safe calls are allowed after fork in a
// multithreaded process).
struct ChildPlan {
  int stdin_fd;
  int stdout_fd;
  int stderr_fd;
  int fail_fd;
  int channel_fd;   // -1: none; else becomes the child's descriptor 3
  int cgroup_fd;    // -1: none; else the job cgroup's cgroup.procs
  const char* cwd;  // nullptr: stay
  char* const* argv;
  char* const* envp;
  const char* const* candidates;  // paths to try, in order
  size_t num_candidates;
  pid_t parent;       // 0: the child may outlive the parent
  bool drop = false;  // take the identity below
  uid_t uid = 0;
  gid_t gid = 0;
  const gid_t* groups = nullptr;
  size_t num_groups = 0;
};

void CloseFd(int* fd) {
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
}

// Owns a descriptor until released.
class ScopedFd {
 public:
  ScopedFd() = default;
  ~ScopedFd() { CloseFd(&fd_); }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int* out() { return &fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() { CloseFd(&fd_); }

 private:
  int fd_ = -1;
};

[[noreturn]] void ChildFail(int fail_fd, int stage, int err) {
  ChildFailure failure{stage, err};
  ssize_t n;
  do {
    n = write(fail_fd, &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  _exit(127);
}

// Closes every descriptor >= 3 except `keep` (which is >= 3).
void CloseDescriptorsFromExcept(int first, int keep) {
  auto close_range_sys = [](unsigned lo, unsigned hi) {
    return lo > hi || syscall(SYS_close_range, lo, hi, 0u) == 0;
  };
  if (close_range_sys(static_cast<unsigned>(first),
                      static_cast<unsigned>(keep) - 1) &&
      close_range_sys(static_cast<unsigned>(keep) + 1, ~0u)) {
    return;
  }
  // Kernels before 5.9: list /proc/self/fd with getdents64 (opendir would
  // allocate).
  int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    alignas(8) char buf[4096];
    for (;;) {
      long n = syscall(SYS_getdents64, dir, buf, sizeof(buf));
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const auto* entry = reinterpret_cast<const struct dirent64*>(buf + off);
        off += entry->d_reclen;
        int fd = 0;
        const char* p = entry->d_name;
        if (*p < '0' || *p > '9') continue;
        for (; *p >= '0' && *p <= '9'; ++p) fd = fd * 10 + (*p - '0');
        if (fd >= first && fd != keep && fd != dir) close(fd);
      }
    }
    close(dir);
    return;
  }
  for (int fd = 3; fd < 65536; ++fd) {
    if (fd != keep) close(fd);
  }
}

// Runs in the forked child; never returns.
[[noreturn]] void RunChild(const ChildPlan& plan) {
  int fail_fd = plan.fail_fd;
  // Signals were blocked around fork by the parent: reset every disposition
  // first (so no handler of the parent runs here), then unblock everything.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &dfl, nullptr);  // EINVAL for libc-internal ones: fine
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  if (setpgid(0, 0) != 0) ChildFail(fail_fd, kStageSetup, errno);
  // Into the job's cgroup before anything of the job runs ("0": this
  // process); every process it makes is born there.
  if (plan.cgroup_fd >= 0 && write(plan.cgroup_fd, "0", 1) != 1)
    ChildFail(fail_fd, kStageCgroup, errno);
  // The job's user, before the parent-death signal: changing credentials
  // clears that signal.
  if (plan.drop && (setgroups(plan.num_groups, plan.groups) != 0 ||
                    setgid(plan.gid) != 0 || setuid(plan.uid) != 0)) {
    ChildFail(fail_fd, kStageUser, errno);
  }
  if (plan.parent != 0) {
    // Killed with the thread that started it; and if the parent died
    // before this line, go now.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
      ChildFail(fail_fd, kStageSetup, errno);
    if (getppid() != plan.parent) _exit(128 + SIGKILL);
  }

  // Move every descriptor we keep above the ones we set first, so a parent
  // that runs with 0, 1 or 2 closed (whose pipes may then sit there) is
  // handled too.
  const int targets = plan.channel_fd >= 0 ? 4 : 3;
  int sources[5] = {plan.stdin_fd, plan.stdout_fd, plan.stderr_fd,
                    plan.channel_fd, fail_fd};
  for (int& fd : sources) {
    if (fd < 0) continue;
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, targets);
    if (moved < 0) ChildFail(fail_fd, kStageSetup, errno);
    fd = moved;
  }
  fail_fd = sources[4];
  for (int target = 0; target < targets; ++target) {
    // dup2 clears close-on-exec on the target.
    if (dup2(sources[target], target) < 0) {
      ChildFail(fail_fd, kStageSetup, errno);
    }
  }
  if (plan.cwd != nullptr && chdir(plan.cwd) != 0) {
    ChildFail(fail_fd, kStageChdir, errno);
  }
  // fail_fd closes itself on exec.
  CloseDescriptorsFromExcept(targets, fail_fd);

  // execvpe's rules: keep searching past ENOENT-like errors, remember
  // EACCES, stop at anything else.
  int err = ENOENT;
  bool saw_eacces = false;
  for (size_t i = 0; i < plan.num_candidates; ++i) {
    execve(plan.candidates[i], plan.argv, plan.envp);
    err = errno;
    switch (err) {
      case EACCES:
        saw_eacces = true;
        break;
      case ENOENT:
      case ENOTDIR:
      case ESTALE:
      case ENODEV:
      case ETIMEDOUT:
        break;
      default:
        ChildFail(fail_fd, kStageExec, err);
    }
  }
  ChildFail(fail_fd, kStageExec, saw_eacces ? EACCES : err);
}

std::string_view EnvName(std::string_view entry) {
  return entry.substr(0, entry.find('='));
}

// The calling process's environment (with `clean`, only its variables
// named in `keep`) with `overrides` added or replacing (the last of several
// overrides of one name wins).
absl::StatusOr<std::vector<std::string>> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides,
    bool clean, const std::vector<std::string>& keep) {
  for (const auto& [name, value] : overrides) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable name '", name, "' is empty or contains '='"));
    }
  }
  auto overridden = [&](std::string_view name) {
    for (const auto& o : overrides) {
      if (o.first == name) return true;
    }
    return false;
  };
  std::vector<std::string> env;
  auto kept = [&](std::string_view name) {
    if (!clean) return true;
    for (const std::string& k : keep) {
      if (k == name) return true;
    }
    return false;
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (kept(EnvName(entry)) && !overridden(EnvName(entry))) {
      env.emplace_back(entry);
    }
  }
  for (size_t i = 0; i < overrides.size(); ++i) {
    bool later = false;
    for (size_t j = i + 1; j < overrides.size(); ++j) {
      later |= overrides[j].first == overrides[i].first;
    }
    if (!later) env.push_back(overrides[i].first + "=" + overrides[i].second);
  }
  return env;
}

// PATH as the child will see it; glibc's default where it is unset.
std::string SearchPath(const std::vector<std::string>& env) {
  for (const std::string& entry : env) {
    if (entry.compare(0, 5, "PATH=") == 0) return entry.substr(5);
  }
  return "/bin:/usr/bin";
}

// Where execvp would look for `program`, in order. Relative entries are
// resolved by the child, after its chdir.
std::vector<std::string> ExecCandidates(const std::string& program,
                                        const std::string& path) {
  if (program.find('/') != std::string::npos) return {program};
  std::vector<std::string> out;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    out.push_back(absl::StrCat(dir.empty() ? "." : dir, "/", program));
  }
  return out;
}

absl::Status ChildFailureStatus(const ChildFailure& failure,
                                const SubprocessOptions& options,
                                const std::string& path) {
  const std::string& program = options.argv[0];
  switch (failure.stage) {
    case kStageChdir:
      return absl::ErrnoToStatus(
          failure.err,
          absl::StrCat("cannot run '", program,
                       "': cannot change to directory '", options.cwd, "'"));
    case kStageCgroup:
      return absl::ErrnoToStatus(
          failure.err, absl::StrCat("cannot run '", program,
                                    "': joining cgroup ", options.cgroup));
    case kStageUser:
      return absl::ErrnoToStatus(
          failure.err, absl::StrCat("cannot run '", program, "' as uid ",
                                    options.run_as ? options.run_as->uid : 0,
                                    " (the job's owner)"));
    case kStageExec:
      if (failure.err == ENOENT && program.find('/') == std::string::npos) {
        return absl::ErrnoToStatus(
            failure.err, absl::StrCat("cannot run '", program,
                                      "': not found on PATH '", path, "'"));
      }
      return absl::ErrnoToStatus(failure.err,
                                 absl::StrCat("cannot run '", program, "'"));
    default:
      return absl::ErrnoToStatus(
          failure.err,
          absl::StrCat("cannot run '", program, "': setting up the child"));
  }
}

// Delivers one line (without its '\n'; `newline` false: the stream's last
// bytes, which had none), taking a '\r' before the '\n' as part of the
// ending and splitting the text into pieces of at most `max_bytes`, each
// labelled as `head` is (stream, rank, time).
void DeliverLine(const SubprocessSet::LineSink& sink, SubprocessSet::Key key,
                 const OutputLine& head, std::string_view text,
                 size_t max_bytes, bool newline = true) {
  OutputLine::Ending ending =
      newline ? OutputLine::kNewline : OutputLine::kNone;
  if (newline && !text.empty() && text.back() == '\r') {
    text.remove_suffix(1);
    ending = OutputLine::kCrlf;
  }
  do {
    OutputLine line = head;
    line.text = std::string(text.substr(0, max_bytes));
    text.remove_prefix(line.text.size());
    line.ending = text.empty() ? ending : OutputLine::kNone;
    sink(key, line);
  } while (!text.empty());
}

// Reads /proc/<pid>/stat; false if the process is gone.
bool ReadProcStat(const char* pid_name, char* state, long* ppid, long* pgrp) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%s/stat", pid_name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
  const char* paren = strrchr(buf, ')');
  return paren != nullptr &&
         sscanf(paren + 1, " %c %ld %ld", state, ppid, pgrp) == 3;
}

// The channel as a FIFO at options.channel_fifo: made afresh for the job's
// user, then opened without following links and checked to be that FIFO,
// since the folder it is in is the job's (a process of the same user could
// put a link there, and these opens run with the worker's powers).
absl::Status OpenFifo(const SubprocessOptions& options, ScopedFd* r,
                      ScopedFd* w) {
  const char* path = options.channel_fifo.c_str();
  if (unlink(path) != 0 && errno != ENOENT)
    return absl::ErrnoToStatus(errno, absl::StrCat("removing ", path));
  if (mkfifo(path, 0600) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("making the FIFO ", path));
  if (options.run_as &&
      lchown(path, options.run_as->uid, options.run_as->gid) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("chown ", path));
  // Read and write: no end of file while the job lives, and opening the
  // write end below does not wait for a reader.
  *r->out() = open(path, O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (r->get() < 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("opening ", path));
  *w->out() = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (w->get() < 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("opening ", path));
  struct stat rs, ws;
  if (fstat(r->get(), &rs) != 0 || fstat(w->get(), &ws) != 0 ||
      !S_ISFIFO(rs.st_mode) || rs.st_ino != ws.st_ino ||
      rs.st_dev != ws.st_dev) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " was replaced while it was being opened"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ExitInfo::Describe() const {
  const std::string who = rank >= 0 ? absl::StrCat("rank ", rank, ": ") : "";
  if (exited) return absl::StrCat(who, "exit code ", exit_code);
  if (term_signal != 0) {
    const char* name = strsignal(term_signal);
    return absl::StrCat(who, "killed by signal ", term_signal, " (",
                        name != nullptr ? name : "unknown", ")");
  }
  return who + "no exit status";
}

bool ProcessGroupAlive(pid_t pgid) {
  if (pgid <= 0) return false;
  return kill(-pgid, 0) == 0 || errno == EPERM;
}

int KillProcessesUnder(const std::string& dir) {
  if (dir.empty()) return 0;
  std::string prefix = dir.back() == '/' ? dir : dir + "/";
  int killed = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  while (struct dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 1 || pid == getpid())
      continue;
    char link[64];
    snprintf(link, sizeof link, "/proc/%ld/cwd", pid);
    char cwd[4096];
    ssize_t n = readlink(link, cwd, sizeof cwd - 1);
    if (n <= 0) continue;
    cwd[n] = '\0';
    std::string where(cwd);
    if (where.rfind(prefix, 0) == 0 || where + "/" == prefix) {
      if (kill(static_cast<pid_t>(pid), SIGKILL) == 0) ++killed;
    }
  }
  closedir(proc);
  return killed;
}

struct SubprocessSet::Proc {
  Key key = 0;
  pid_t pid = -1;  // the leader; also the process group id
  int pidfd = -1;  // readable once the leader exits; -1 if unsupported
  // stdout, stderr and channel read ends; -1 once at EOF (or never opened).
  int fds[kStreams] = {-1, -1, -1};
  bool would_block[kStreams] = {};  // last ReadPipe stopped at EAGAIN
  std::string partial[kStreams];    // bytes after the last '\n', at most max+1
  size_t max_line_bytes = 0;
  int64_t linger_ms = 0;
  int rank = -1;  // SubprocessOptions::rank, on each of its lines

  bool leader_reaped = false;
  int64_t linger_deadline = 0;  // monotonic; valid once leader_reaped
  bool linger_expired = false;  // leftovers were counted and killed
  int64_t kill_deadline = -1;   // monotonic SIGKILL-after-grace, or -1
  int64_t last_kill_ms = -1;    // when the group last got SIGKILL
  // When only zombies were left of the group (-1: not so); see Advance.
  int64_t zombies_only_since = -1;
  std::string cgroup;  // "": none
  std::string mark;
  bool done = false;
  ExitInfo info;
};

SubprocessSet::SubprocessSet(const Clock* clock, LineSink on_line,
                             ExitSink on_exit)
    : clock_(clock),
      on_line_(std::move(on_line)),
      on_exit_(std::move(on_exit)) {
  // Best effort: without it, orphans go to init and the group check below
  // still works, only their zombies are not reaped here.
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  if (pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    wake_fds_[0] = wake_fds_[1] = -1;
  }
}

SubprocessSet::~SubprocessSet() {
  for (auto& [key, proc] : procs_) {
    KillMembers(*proc);
    for (int& fd : proc->fds) CloseFd(&fd);
    CloseFd(&proc->pidfd);
  }
  // Reap the leaders and the group members that were reparented here; a
  // process stuck in uninterruptible sleep is given up on after a while.
  int64_t deadline = clock_->MonotonicMs() + 5000;
  for (;;) {
    ReapChildren();
    bool pending = false;
    for (auto& [key, proc] : procs_) {
      // ProcessGroupAlive counts zombies too: a member killed a moment ago
      // may still wait to be reparented here and reaped.
      pending |= !proc->leader_reaped || !Members(*proc).empty() ||
                 ProcessGroupAlive(proc->pid);
    }
    if (!pending || clock_->MonotonicMs() >= deadline) break;
    for (auto& [key, proc] : procs_) KillMembers(*proc);
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  for (auto& [key, proc] : procs_) {
    if (!proc->cgroup.empty()) rmdir(proc->cgroup.c_str());
  }
  procs_.clear();
  CloseFd(&wake_fds_[0]);
  CloseFd(&wake_fds_[1]);
}

absl::StatusOr<pid_t> SubprocessSet::Start(Key key,
                                           const SubprocessOptions& options) {
  if (procs_.count(key) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("subprocess key ", key, " is already running"));
  }
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("cannot run an empty command line");
  }
  if (options.max_line_bytes == 0) {
    return absl::InvalidArgumentError("max_line_bytes must be positive");
  }
  absl::StatusOr<std::vector<std::string>> env =
      BuildEnvironment(options.env, options.clean_env, options.keep_env);
  if (!env.ok()) return env.status();
  const std::string path = SearchPath(*env);
  std::vector<std::string> candidates = ExecCandidates(options.argv[0], path);
  std::vector<std::string> argv = options.argv;

  std::vector<char*> argv_ptrs, env_ptrs;
  std::vector<const char*> candidate_ptrs;
  for (std::string& a : argv) argv_ptrs.push_back(a.data());
  argv_ptrs.push_back(nullptr);
  for (std::string& e : *env) env_ptrs.push_back(e.data());
  env_ptrs.push_back(nullptr);
  for (const std::string& c : candidates) candidate_ptrs.push_back(c.c_str());

  const std::string& program = options.argv[0];
  ScopedFd devnull, out_r, out_w, err_r, err_w, chan_r, chan_w, fail_r, fail_w;
  *devnull.out() = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull.get() < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot run '", program, "': opening /dev/null"));
  }
  int fds[2];
  for (auto [r, w] :
       {std::pair{&out_r, &out_w}, std::pair{&err_r, &err_w},
        std::pair{&chan_r, &chan_w}, std::pair{&fail_r, &fail_w}}) {
    if (r == &chan_r && !options.channel) continue;
    if (r == &chan_r && !options.channel_fifo.empty()) {
      absl::Status made = OpenFifo(options, r, w);
      if (!made.ok()) {
        return absl::Status(made.code(), absl::StrCat("cannot run '", program,
                                                      "': ", made.message()));
      }
      continue;
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot run '", program, "': creating a pipe"));
    }
    *r->out() = fds[0];
    *w->out() = fds[1];
  }

  ScopedFd cgroup_procs;
  if (!options.cgroup.empty()) {
    const std::string procs = options.cgroup + "/cgroup.procs";
    *cgroup_procs.out() = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (cgroup_procs.get() < 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot run '", program, "': opening ", procs));
    }
  }

  ChildPlan plan;
  plan.cgroup_fd = cgroup_procs.get();
  plan.stdin_fd = devnull.get();
  plan.stdout_fd = out_w.get();
  plan.stderr_fd = err_w.get();
  plan.fail_fd = fail_w.get();
  plan.channel_fd = options.channel ? chan_w.get() : -1;
  plan.cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
  plan.parent = options.die_with_parent ? getpid() : 0;
  plan.argv = argv_ptrs.data();
  plan.envp = env_ptrs.data();
  plan.candidates = candidate_ptrs.data();
  if (options.run_as) {
    plan.drop = true;
    plan.uid = options.run_as->uid;
    plan.gid = options.run_as->gid;
    plan.groups = options.run_as->groups.data();
    plan.num_groups = options.run_as->groups.size();
  }
  plan.num_candidates = candidate_ptrs.size();

  // Blocked across fork so that no handler of ours runs in the child before
  // it has reset the dispositions.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &saved);
  pid_t pid = fork();
  if (pid == 0) RunChild(plan);
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    return absl::ErrnoToStatus(
        fork_errno, absl::StrCat("cannot run '", program, "': fork"));
  }
  devnull.reset();
  out_w.reset();
  err_w.reset();
  chan_w.reset();
  fail_w.reset();

  // EOF on the error pipe means exec succeeded (it was close-on-exec).
  ChildFailure failure{};
  size_t got = 0;
  while (got < sizeof(failure)) {
    ssize_t n = read(fail_r.get(), reinterpret_cast<char*>(&failure) + got,
                     sizeof(failure) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (got < sizeof(failure)) {
      return absl::InternalError(
          absl::StrCat("cannot run '", program, "': child setup failed"));
    }
    return ChildFailureStatus(failure, options, path);
  }

  for (int fd : {out_r.get(), err_r.get(), chan_r.get()}) {
    if (fd < 0) continue;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  auto proc = std::make_unique<Proc>();
  proc->key = key;
  proc->pid = pid;
  proc->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));  // CLOEXEC
  if (proc->pidfd < 0) proc->pidfd = -1;
  proc->fds[0] = out_r.release();
  proc->fds[1] = err_r.release();
  proc->fds[2] = chan_r.release();
  proc->max_line_bytes = options.max_line_bytes;
  proc->linger_ms = std::max<int64_t>(0, options.linger_ms);
  proc->cgroup = options.cgroup;
  proc->mark = options.mark;
  proc->rank = options.rank;
  proc->info.rank = options.rank;
  procs_.emplace(key, std::move(proc));
  return pid;
}

void SubprocessSet::Terminate(Key key, int signal, int64_t grace_ms) {
  auto it = procs_.find(key);
  if (it == procs_.end()) return;
  Proc* proc = it->second.get();
  SignalMembers(*proc, signal);
  SignalMembers(*proc, SIGCONT);  // a stopped member must see its signal
  int64_t deadline = clock_->MonotonicMs() + std::max<int64_t>(0, grace_ms);
  if (proc->kill_deadline < 0 || deadline < proc->kill_deadline) {
    proc->kill_deadline = deadline;
  }
}

void SubprocessSet::Poll(int64_t timeout_ms) {
  struct Slot {
    Key key;
    int what;  // a stream index, kPidfdSlot, or -1 for the wake pipe
  };
  std::vector<pollfd> pfds;
  std::vector<Slot> slots;
  if (wake_fds_[0] >= 0) {
    pfds.push_back({wake_fds_[0], POLLIN, 0});
    slots.push_back({0, -1});
  }
  const int64_t now = clock_->MonotonicMs();
  int64_t wait_ms = timeout_ms < 0 ? -1 : timeout_ms;
  auto cap = [&](int64_t ms) {
    ms = std::max<int64_t>(0, ms);
    if (wait_ms < 0 || ms < wait_ms) wait_ms = ms;
  };
  for (auto& [key, proc] : procs_) {
    for (int i = 0; i < kStreams; ++i) {
      if (proc->fds[i] >= 0) {
        pfds.push_back({proc->fds[i], POLLIN, 0});
        slots.push_back({key, i});
      }
    }
    if (!proc->leader_reaped && proc->pidfd >= 0) {
      pfds.push_back({proc->pidfd, POLLIN, 0});
      slots.push_back({key, kPidfdSlot});
    } else {
      cap(kReapPollMs);
    }
    if (proc->kill_deadline >= 0) cap(proc->kill_deadline - now);
    if (proc->leader_reaped && !proc->linger_expired) {
      cap(proc->linger_deadline - now);
    }
  }
  int n = poll(pfds.data(), pfds.size(),
               static_cast<int>(std::min<int64_t>(wait_ms, INT_MAX)));
  if (n > 0) {
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      if (slots[i].what == -1) {
        char buf[64];
        while (read(wake_fds_[0], buf, sizeof(buf)) > 0) {
        }
        continue;
      }
      if (slots[i].what == kPidfdSlot) continue;  // ReapChildren below
      auto it = procs_.find(slots[i].key);
      if (it != procs_.end()) ReadPipe(it->second.get(), slots[i].what);
    }
  }
  ReapChildren();

  std::vector<Key> keys;
  keys.reserve(procs_.size());
  for (const auto& [key, proc] : procs_) keys.push_back(key);
  for (Key key : keys) {
    auto it = procs_.find(key);
    if (it == procs_.end()) continue;
    Advance(it->second.get());
    if (!it->second->done) continue;
    std::unique_ptr<Proc> finished = std::move(it->second);
    procs_.erase(it);
    on_exit_(key, finished->info);
  }
}

void SubprocessSet::Wake() {
  if (wake_fds_[1] < 0) return;
  char byte = 1;
  // A full pipe already guarantees a wake-up.
  [[maybe_unused]] ssize_t n = write(wake_fds_[1], &byte, 1);
}

void SubprocessSet::KillAll() {
  for (auto& [key, proc] : procs_) KillMembers(*proc);
}

size_t SubprocessSet::running() const { return procs_.size(); }

bool SubprocessSet::IsRunning(Key key) const { return procs_.count(key) != 0; }

void SubprocessSet::ReapChildren() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG | __WALL);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    // Unknown pids are orphans reparented here (or leaders of a set that
    // gave up on them): reaped and forgotten.
    for (auto& [key, proc] : procs_) {
      if (proc->pid != pid || proc->leader_reaped) continue;
      proc->leader_reaped = true;
      proc->linger_deadline = clock_->MonotonicMs() + proc->linger_ms;
      CloseFd(&proc->pidfd);
      if (WIFEXITED(status)) {
        proc->info.exited = true;
        proc->info.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        proc->info.term_signal = WTERMSIG(status);
      }
      break;
    }
  }
}

void SubprocessSet::ReadPipe(Proc* proc, int stream_index) {
  char buf[kReadChunk];
  int& fd = proc->fds[stream_index];
  std::string& partial = proc->partial[stream_index];
  const size_t max = proc->max_line_bytes;
  const int stream = stream_index + 1;
  proc->would_block[stream_index] = false;
  size_t total = 0;
  while (fd >= 0 && total < kMaxReadPerPoll) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        proc->would_block[stream_index] = true;
        return;
      }
      n = 0;  // any other error ends the stream like EOF
    }
    if (n == 0) {
      FlushPartial(proc, stream_index);
      CloseFd(&fd);
      return;
    }
    total += static_cast<size_t>(n);
    OutputLine head;
    head.stream = stream;
    head.rank = proc->rank;
    head.time_ms = clock_->NowMs();
    std::string_view data(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = data.find('\n')) != std::string_view::npos;) {
      if (partial.empty()) {
        DeliverLine(on_line_, proc->key, head, data.substr(0, nl), max);
      } else {
        partial.append(data.substr(0, nl));
        DeliverLine(on_line_, proc->key, head, partial, max);
        partial.clear();
      }
      data.remove_prefix(nl + 1);
    }
    partial.append(data);
    // Keep at most max+1 bytes pending, so a line of exactly max bytes
    // followed by "\r\n" still arrives as one piece.
    size_t off = 0;
    while (partial.size() - off > max + 1) {
      OutputLine line = head;
      line.text = partial.substr(off, max);
      line.ending = OutputLine::kNone;  // the line goes on
      on_line_(proc->key, line);
      off += max;
    }
    partial.erase(0, off);
  }
}

void SubprocessSet::FlushPartial(Proc* proc, int stream_index) {
  std::string& partial = proc->partial[stream_index];
  if (partial.empty()) return;
  std::string text = std::move(partial);
  partial.clear();
  OutputLine head;
  head.stream = stream_index + 1;
  head.rank = proc->rank;
  head.time_ms = clock_->NowMs();
  DeliverLine(on_line_, proc->key, head, text, proc->max_line_bytes,
              /*newline=*/false);
}

std::vector<pid_t> SubprocessSet::Members(const Proc& proc) const {
  std::vector<pid_t> out;
  const pid_t self = getpid();
  if (!proc.cgroup.empty()) {
    for (pid_t pid : CgroupProcs(proc.cgroup)) {
      char state;
      long ppid, pgrp;
      char name[24];
      snprintf(name, sizeof name, "%d", pid);
      if (pid != self && ReadProcStat(name, &state, &ppid, &pgrp) &&
          state != 'Z' && state != 'X') {
        out.push_back(pid);
      }
    }
    return out;
  }
  // No cgroup: the group's members, the leader's descendants, the processes
  // carrying the job's mark, and their descendants.
  struct Entry {
    pid_t pid;
    pid_t ppid;
    bool live;
    bool in;
  };
  std::vector<Entry> all;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  std::vector<pid_t> marked;
  if (!proc.mark.empty()) marked = MarkedProcesses(proc.mark);
  while (const struct dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    char state;
    long ppid, pgrp;
    if (!ReadProcStat(entry->d_name, &state, &ppid, &pgrp)) continue;
    const pid_t pid = static_cast<pid_t>(atol(entry->d_name));
    if (pid == self) continue;
    bool in = pgrp == proc.pid || pid == proc.pid ||
              std::find(marked.begin(), marked.end(), pid) != marked.end();
    all.push_back(
        {pid, static_cast<pid_t>(ppid), state != 'Z' && state != 'X', in});
  }
  closedir(dir);
  for (bool grew = true; grew;) {
    grew = false;
    for (Entry& e : all) {
      if (e.in) continue;
      for (const Entry& parent : all) {
        if (parent.in && parent.pid == e.ppid) {
          e.in = grew = true;
          break;
        }
      }
    }
  }
  for (const Entry& e : all) {
    if (e.in && e.live) out.push_back(e.pid);
  }
  return out;
}

void SubprocessSet::SignalMembers(const Proc& proc, int sig) {
  kill(-proc.pid, sig);
  for (pid_t pid : Members(proc)) kill(pid, sig);
}

void SubprocessSet::KillMembers(const Proc& proc) {
  kill(-proc.pid, SIGKILL);
  if (!proc.cgroup.empty() && KillCgroup(proc.cgroup)) return;
  for (pid_t pid : Members(proc)) kill(pid, SIGKILL);
}

void SubprocessSet::NoteLeftovers(Proc* proc, const std::vector<pid_t>& live) {
  proc->info.leftover_killed += static_cast<int>(live.size());
  if (proc->info.leftover_names.empty())
    proc->info.leftover_names = DescribeProcesses(live);
}

void SubprocessSet::Advance(Proc* proc) {
  const int64_t now = clock_->MonotonicMs();
  if (proc->kill_deadline >= 0 && now >= proc->kill_deadline) {
    proc->kill_deadline = -1;
    std::vector<pid_t> live = Members(*proc);
    if (!live.empty()) {
      if (proc->leader_reaped && !proc->linger_expired)
        NoteLeftovers(proc, live);
      KillMembers(*proc);
      proc->last_kill_ms = now;
      proc->info.killed_after_grace = true;
      if (proc->leader_reaped) proc->linger_expired = true;
    }
  }
  if (!proc->leader_reaped) return;

  std::vector<pid_t> live = Members(*proc);
  if (!live.empty()) {
    if (now < proc->linger_deadline) return;
    // The leader has gone and its time to wind down is over: whatever of
    // the job is left is killed (and named in the diary).
    if (!proc->linger_expired) NoteLeftovers(proc, live);
    if (!proc->linger_expired || now - proc->last_kill_ms >= kRekillMs) {
      KillMembers(*proc);
      proc->last_kill_ms = now;
    }
    proc->linger_expired = true;
    return;
  }
  // Killed members may still be zombies on their way to being reparented
  // here and reaped: a job ends once they are gone, or after a while if
  // they are not ours to reap (their parent escaped the group).
  if (ProcessGroupAlive(proc->pid)) {
    if (proc->zombies_only_since < 0) proc->zombies_only_since = now;
    if (now - proc->zombies_only_since < kZombieOnlyMs) return;
  }

  // No process of the job is left to write; a pipe still open is held by
  // one that escaped every way of finding it. Take what it holds and let go.
  for (int i = 0; i < kStreams; ++i) {
    for (int round = 0; round < kMaxDrainRounds && proc->fds[i] >= 0; ++round) {
      ReadPipe(proc, i);
      if (proc->would_block[i]) break;
    }
    if (proc->fds[i] >= 0) {
      FlushPartial(proc, i);
      CloseFd(&proc->fds[i]);
    }
  }
  if (!proc->cgroup.empty()) rmdir(proc->cgroup.c_str());
  proc->done = true;
}

}  // namespace dlbatch::worker
