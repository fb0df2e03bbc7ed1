#include "client/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch::client {
namespace {

// A daemon's log (its stderr) is kept by a relay process that rotates it
// at this size to LOG.1, so the state folder holds at most twice this per
// daemon however long it runs. DLBATCH_LOCAL_LOG_BYTES sets another size
// (tests).
constexpr off_t kLogRotateBytes = off_t{8} << 20;

off_t LogRotateBytes() {
  int64_t bytes = 0;
  const char* env = std::getenv("DLBATCH_LOCAL_LOG_BYTES");
  if (env != nullptr && absl::SimpleAtoi(env, &bytes) && bytes > 0) {
    return static_cast<off_t>(bytes);
  }
  return kLogRotateBytes;
}

// The relay's body: copies `in` to `path`, rotating; returns when every
// writer has closed `in` (the daemon exited). Runs in a child forked from a
// process that may have threads, so it calls nothing but system calls.
[[noreturn]] void RelayLog(int in, int out, const char* path,
                           const char* rotated, off_t rotate_bytes) {
  struct stat st;
  off_t size = ::fstat(out, &st) == 0 ? st.st_size : 0;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(0);
    if (size > 0 && size + n > rotate_bytes) {
      ::rename(path, rotated);
      int fresh = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
      if (fresh >= 0) {
        ::dup2(fresh, out);
        ::close(fresh);
        size = 0;
      }
    }
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(out, buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;  // a full disk: the line is lost, not the daemon
      done += w;
    }
    size += n;
  }
}

// Starts the relay of `log`; returns the pipe end the daemon writes to (its
// stdout and stderr), or -1.
int StartLogRelay(const std::string& log, int log_fd) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  const std::string rotated = log + ".1";
  const off_t rotate_bytes = LogRotateBytes();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    ::setsid();
    ::prctl(PR_SET_NAME, "dlbatch-log");
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    // Nothing of the CLI (its connections) stays open in the relay.
    ::dup2(fds[0], 0);
    ::dup2(log_fd, 1);
    ::close_range(2, ~0U, 0);
    RelayLog(0, 1, log.c_str(), rotated.c_str(), rotate_bytes);
  }
  ::close(fds[0]);
  return fds[1];
}

// The pid in `file` if that process is alive and is one of ours.
pid_t LivePid(const std::string& file) {
  auto text = ReadFile(file);
  if (!text.ok()) return 0;
  pid_t pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid) || pid <= 0)
    return 0;
  if (::kill(pid, 0) != 0) return 0;
  auto cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  if (!cmdline.ok() || cmdline->find("dlbatch-") == std::string::npos) return 0;
  // A zombie child of this very process counts as gone.
  auto stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (stat.ok()) {
    size_t close = stat->rfind(')');
    if (close != std::string::npos && close + 2 < stat->size() &&
        (*stat)[close + 2] == 'Z') {
      return 0;
    }
  }
  return pid;
}

std::string FindBinary(const std::string& name) {
  std::string sibling = SelfDir() + "/" + name;
  if (::access(sibling.c_str(), X_OK) == 0) return sibling;
  return name;  // execvp searches PATH
}

bool WaitUntil(const std::function<bool()>& ready, int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ready();
}

}  // namespace

std::string SelfDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

absl::StatusOr<LocalCluster> LocalCluster::Resolve() {
  std::string base;
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg) {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home) {
    base = absl::StrCat(home, "/.local/state");
  } else {
    return absl::FailedPreconditionError(
        "neither XDG_STATE_HOME nor HOME is set; set one, or pass --scheduler");
  }
  std::string dir = base + "/dlbatch";
  RETURN_IF_ERROR(MakeDirs(dir, 0700));
  ::chmod(dir.c_str(), 0700);
  // A Unix socket path is limited to 107 bytes.
  if (dir.size() + sizeof("/scheduler.sock") > 107) {
    return absl::FailedPreconditionError(
        absl::StrCat("the local state folder ", dir,
                     " is too long for a Unix socket path; set "
                     "XDG_STATE_HOME to a shorter folder"));
  }
  return LocalCluster(dir);
}

bool LocalCluster::SocketAccepts() const {
  accepted_ = ConnectUnix(socket_path());
  return accepted_ != nullptr;
}

bool LocalCluster::SchedulerAnswers() const {
  ChannelConfig config;
  auto ep = ParseEndpoint(address());
  if (!ep.ok()) return false;
  config.endpoint = *ep;
  std::shared_ptr<grpc::Channel> channel = MakeChannel(config);
  auto stub = v1::Scheduler::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(1000));
  v1::Stats stats;
  if (!stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok()) return false;
  answered_ = std::move(channel);
  return true;
}

absl::Status LocalCluster::StartProcess(const std::string& binary,
                                        const std::vector<std::string>& args,
                                        const std::string& log,
                                        const std::string& pid_file) {
  std::string path = FindBinary(binary);
  int file_fd =
      ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (file_fd < 0) return ErrnoStatus(errno, "open", log);
  int log_fd = StartLogRelay(log, file_fd);
  ::close(file_fd);
  if (log_fd < 0) return ErrnoStatus(errno, "start the log relay for", log);
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(log_fd);
    return ErrnoStatus(errno, "pipe", "");
  }
  std::vector<std::string> argv_store = {path};
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus(errno, "fork", binary);
  if (pid == 0) {
    ::setsid();
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvp(argv[0], argv.data());
    int err = errno;
    (void)!::write(err_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(log_fd);
  ::close(err_pipe[1]);
  int err = 0;
  ssize_t n = ::read(err_pipe[0], &err, sizeof err);
  ::close(err_pipe[0]);
  if (n == sizeof err) {
    ::waitpid(pid, nullptr, 0);
    return absl::NotFoundError(absl::StrCat(
        "cannot run ", path, ": ", std::strerror(err),
        "; install dlbatch (deploy/bootstrap.sh) or put ", binary, " on PATH"));
  }
  return WriteFileAtomic(pid_file, absl::StrCat(pid, "\n"));
}

absl::Status LocalCluster::EnsureRunning(bool verbose, int cpu_slots) {
  std::string lock_path = dir_ + "/start.lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return ErrnoStatus(errno, "open", lock_path);
  ::flock(lock_fd, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock_fd};

  const bool scheduler_alive = LivePid(dir_ + "/scheduler.pid") != 0;
  bool worker_up = LivePid(dir_ + "/worker.pid") != 0;
  // Both running and the socket taking connections: nothing to start, and
  // no call made here. (Whoever started them held the lock until they
  // answered; a scheduler that stops answering now is the command's own
  // call's to find, which retries for --retry-for.)
  if (scheduler_alive && worker_up && SocketAccepts()) return absl::OkStatus();
  bool scheduler_up = scheduler_alive && SchedulerAnswers();
  if (scheduler_up && worker_up) return absl::OkStatus();
  if (!scheduler_up) {
    if (verbose)
      std::cerr << "starting the local scheduler in " << dir_ << "\n";
    RETURN_IF_ERROR(
        StartProcess("dlbatch-scheduler",
                     // --config '': the machine's /etc/dlbatch files are for
                     // its service, not for a user's own cluster.
                     // The web face on a free loopback port: `dlbatch
                     // web` asks the scheduler for its address.
                     {"--config", "", "--state-dir", dir_ + "/scheduler",
                      "--listen", address(), "--web-listen", "127.0.0.1:0"},
                     dir_ + "/scheduler.log", dir_ + "/scheduler.pid"));
    if (!WaitUntil([this] { return SchedulerAnswers(); }, 15000)) {
      return absl::UnavailableError(absl::StrCat(
          "the local scheduler did not come up; see ", dir_, "/scheduler.log"));
    }
  }
  if (!worker_up) {
    std::vector<std::string> args = {
        "--config", "",           "--scheduler",    address(), "--profile",
        "local",    "--work-dir", dir_ + "/worker", "--name",  "local"};
    if (cpu_slots > 0) {
      args.push_back("--cpu-slots");
      args.push_back(absl::StrCat(cpu_slots));
    }
    if (verbose) std::cerr << "starting the local worker\n";
    RETURN_IF_ERROR(StartProcess("dlbatch-worker", args, dir_ + "/worker.log",
                                 dir_ + "/worker.pid"));
  }
  // Ready once a worker of this machine has joined the local profile.
  ChannelConfig config;
  ASSIGN_OR_RETURN(config.endpoint, ParseEndpoint(address()));
  auto stub = v1::Scheduler::NewStub(MakeChannel(config));
  bool joined = WaitUntil(
      [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(1000));
        v1::ListWorkersReply reply;
        if (!stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &reply).ok())
          return false;
        for (const auto& w : reply.workers()) {
          if (w.name() == "local" && w.online()) return true;
        }
        return false;
      },
      15000);
  if (!joined) {
    return absl::UnavailableError(absl::StrCat(
        "the local worker did not join; see ", dir_, "/worker.log"));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Stop() {
  bool any = false;
  for (const char* which : {"worker", "scheduler"}) {
    std::string pid_file = absl::StrCat(dir_, "/", which, ".pid");
    pid_t pid = LivePid(pid_file);
    if (pid != 0) {
      any = true;
      ::kill(pid, SIGTERM);
      if (!WaitUntil([&] { return LivePid(pid_file) == 0; }, 15000)) {
        ::kill(pid, SIGKILL);
        WaitUntil([&] { return LivePid(pid_file) == 0; }, 5000);
      }
      std::cout << "stopped the local " << which << " (pid " << pid << ")\n";
    }
    ::unlink(pid_file.c_str());
  }
  if (!any) std::cout << "the local cluster is not running\n";
  return absl::OkStatus();
}

std::string LocalCluster::Status() {
  std::string out;
  pid_t s = LivePid(dir_ + "/scheduler.pid");
  pid_t w = LivePid(dir_ + "/worker.pid");
  absl::StrAppend(&out, "state folder: ", dir_, "\n");
  absl::StrAppend(
      &out, "scheduler:    ",
      s ? absl::StrCat("running (pid ", s, ") on ", address()) : "not running",
      "\n");
  absl::StrAppend(&out, "worker:       ",
                  w ? absl::StrCat("running (pid ", w, ")") : "not running",
                  "\n");
  return out;
}

}  // namespace dlbatch::client
