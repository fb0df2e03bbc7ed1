#include "worker/process_runner.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/job_cgroups.h"

namespace dlbatch::worker {
namespace {

// The loop wakes at least this often to enforce kill deadlines.
constexpr int64_t kPollMs = 100;

}  // namespace

SubprocessRunner::SubprocessRunner(const Clock* clock,
                                   JobContainment containment)
    : clock_(clock), containment_(std::move(containment)) {}

SubprocessRunner::~SubprocessRunner() {
  Shutdown();
  // Kills and reaps whatever still runs (the loop thread's end already sent
  // the leaders their parent-death signal).
  set_.reset();
}

void SubprocessRunner::Attach(ProcessEvents* events) {
  events_ = events;
  set_ = std::make_unique<SubprocessSet>(
      clock_,
      [this](int64_t key, const OutputLine& line) {
        events_->ProcessLine(key, line);
      },
      [this](int64_t key, const ExitInfo& info) {
        events_->ProcessExited(key, info);
      });
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  // The thread that starts the jobs must live as long as they may: their
  // parent-death signal follows it.
  absl::MutexLock join(&join_mu_);
  thread_ = std::thread([this] { Loop(); });
}

void SubprocessRunner::Post(std::function<void()> command) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    commands_.push_back(std::move(command));
  }
  if (set_ != nullptr) set_->Wake();
}

void SubprocessRunner::Start(int64_t key, SubprocessOptions options) {
  Post([this, key, options = std::move(options)]() mutable {
    if (!containment_.mark_prefix.empty()) {
      // Last, so the job's own env: cannot replace it.
      // Ends with '/' so that job 1's mark is no prefix of job 10's.
      options.mark = absl::StrCat(containment_.mark_prefix, key, "/");
      options.env.emplace_back(kJobMarkVar, options.mark);
    }
    if (!containment_.cgroup_root.empty()) {
      options.cgroup = absl::StrCat(containment_.cgroup_root, "/job-", key);
      if (mkdir(options.cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
        events_->ProcessStarted(
            key, absl::ErrnoToStatus(
                     errno, absl::StrCat("making cgroup ", options.cgroup)));
        return;
      }
    }
    absl::StatusOr<pid_t> pid = set_->Start(key, options);
    if (!pid.ok() && !options.cgroup.empty()) rmdir(options.cgroup.c_str());
    events_->ProcessStarted(key, pid.status());
  });
}

void SubprocessRunner::Terminate(int64_t key, int signal, int64_t grace_ms) {
  Post([this, key, signal, grace_ms] {
    set_->Terminate(key, signal, grace_ms);
  });
}

void SubprocessRunner::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (set_ != nullptr) set_->Wake();
  // Once it returns no event is delivered any more.
  absl::MutexLock join(&join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id())
    thread_.join();
}

void SubprocessRunner::Loop() {
  for (;;) {
    std::deque<std::function<void()>> commands;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      commands.swap(commands_);
      stopping = stopping_;
    }
    // Every job is killed with the set; their ends are not reported (the
    // scheduler requeues them when this worker is lost).
    if (stopping) {
      set_->KillAll();
      return;
    }
    for (auto& command : commands) command();
    set_->Poll(kPollMs);
  }
}

}  // namespace dlbatch::worker
