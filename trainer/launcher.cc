#include "trainer/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/stop_signals.h"

extern char** environ;

namespace dlbatch::trainer {
namespace {

// What the handlers saw, for the loop to forward: SIGINT or SIGTERM (stop
// at once), and apart from them a checkpoint-and-stop request (SIGTERM
// too where g_term_is_stop_request).
std::atomic<int> g_forward_signal{0};
std::atomic<bool> g_forward_stop_request{false};
std::atomic<bool> g_term_is_stop_request{false};

void RememberSignal(int sig) {
  if (sig == kTrainerStopSignal ||
      (sig == SIGTERM && g_term_is_stop_request.load())) {
    g_forward_stop_request.store(true);
  } else {
    g_forward_signal.store(sig);
  }
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

absl::StatusOr<int> LaunchRanks(const std::string& program,
                                const std::vector<std::string>& args,
                                const RankRange& range,
                                const std::string& rendezvous_dir,
                                bool stop_on_term) {
  std::vector<pid_t> pids;
  g_term_is_stop_request.store(stop_on_term);
  // How a failed rank's peers are stopped at once.
  const int stop_at_once = stop_on_term ? SIGINT : SIGTERM;
  const pid_t parent = getpid();
  // A stop request waits until it can be forwarded: held here until the
  // handler below is in place, and held in each rank (the mask survives
  // exec) until it takes them itself (stop_request.h), so that none sent
  // while the ranks start ends one.
  sigset_t stop_set, old_mask;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, kTrainerStopSignal);
  if (stop_on_term) sigaddset(&stop_set, SIGTERM);
  sigprocmask(SIG_BLOCK, &stop_set, &old_mask);
  for (int i = 0; i < range.count; ++i) {
    std::vector<std::string> argv_s = {program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    for (const std::string& s :
         {std::string("--rank"), std::to_string(range.first + i),
          std::string("--world"), std::to_string(range.world)}) {
      argv_s.push_back(s);
    }
    if (!rendezvous_dir.empty()) {
      argv_s.push_back("--rendezvous");
      argv_s.push_back(rendezvous_dir);
    }
    std::vector<char*> argv;
    for (std::string& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    // As torchrun's LOCAL_RANK: which of this machine's devices is its.
    std::vector<std::string> env_s;
    // DLBATCH_LOCAL_RANKS, as torchrun's LOCAL_WORLD_SIZE: how many there
    // are on this machine (auto trains on GPUs where there is one each).
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "DLBATCH_LOCAL_RANK=", 19) != 0 &&
          std::strncmp(*e, "DLBATCH_LOCAL_RANKS=", 20) != 0) {
        env_s.push_back(*e);
      }
    }
    env_s.push_back("DLBATCH_LOCAL_RANK=" + std::to_string(i));
    env_s.push_back("DLBATCH_LOCAL_RANKS=" + std::to_string(range.count));
    std::vector<char*> envp;
    for (std::string& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      return ErrnoStatus(errno, "starting a rank of", program);
    }
    if (pid == 0) {
      // A launcher killed outright (its worker died with SIGKILL) takes its
      // ranks along: none may train on unsupervised.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(128 + SIGKILL);
      execve(program.c_str(), argv.data(), envp.data());
      std::fprintf(stderr, "dlbatch-train: cannot run %s: %s\n",
                   program.c_str(), std::strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
  }

  struct sigaction sa {};
  sa.sa_handler = RememberSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(kTrainerStopSignal, &sa, nullptr);
  sigprocmask(SIG_UNBLOCK, &stop_set, nullptr);

  int result = 0;
  int running = range.count;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    // The ranks agree on the step to stop after and leave when they have
    // written its checkpoint: no deadline here (the sender keeps its own).
    if (g_forward_stop_request.exchange(false)) {
      for (pid_t p : pids)
        if (p > 0) kill(p, kTrainerStopSignal);
    }
    if (const int sig = g_forward_signal.exchange(0); sig != 0) {
      for (pid_t p : pids)
        if (p > 0) kill(p, sig);
      if (!stopping) {
        stopping = true;
        stop_deadline =
            std::chrono::steady_clock::now() + std::chrono::seconds(10);
      }
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (pid_t& p : pids) {
        if (p != pid) continue;
        p = -1;
        --running;
        const int code = ExitCodeOf(status);
        if (code != 0 && result == 0) {
          result = code;
          // A rank stopped on request: the others agreed to stop after
          // the same step and are leaving too.
          if (!stopping && code != kTrainerStoppedExitCode) {
            // One rank failed: the others would wait for it in the next
            // collective until the timeout; stop them now.
            for (pid_t q : pids)
              if (q > 0) kill(q, stop_at_once);
            stopping = true;
            stop_deadline =
                std::chrono::steady_clock::now() + std::chrono::seconds(10);
          }
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!rendezvous_dir.empty()) RemoveTree(rendezvous_dir).IgnoreError();
  return result;
}

}  // namespace dlbatch::trainer
