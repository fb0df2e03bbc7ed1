#include "worker/process_runner.h"

#include <signal.h>
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
// When one process of a job of several fails, the others get SIGTERM and
// this long to end (torchrun's agent does as much) before SIGKILL.
constexpr int64_t kStopOthersGraceMs = 10000;

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
      [this](int64_t key, const OutputLine& line) { LineOf(key, line); },
      [this](int64_t key, const ExitInfo& info) { ExitOf(key, info); });
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
    if (!options.ranks.empty()) {
      StartRanks(key, std::move(options));
      return;
    }
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
    auto group = groups_.find(key);
    if (group == groups_.end()) {
      set_->Terminate(key, signal, grace_ms);
      return;
    }
    group->second.stopping = true;
    for (const auto& [set_key, rank] : group->second.live)
      set_->Terminate(set_key, signal, grace_ms);
  });
}

void SubprocessRunner::StartRanks(int64_t key, SubprocessOptions options) {
  RankGroup& group = groups_[key];
  std::vector<SubprocessOptions::RankProcess> ranks;
  ranks.swap(options.ranks);
  if (!containment_.cgroup_root.empty()) {
    group.cgroup = absl::StrCat(containment_.cgroup_root, "/job-", key);
    if (mkdir(group.cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
      group.start_error = absl::ErrnoToStatus(
          errno, absl::StrCat("making cgroup ", group.cgroup));
    }
  }
  for (size_t i = 0; i < ranks.size() && !group.start_error; ++i) {
    SubprocessOptions one = options;
    one.rank = ranks[i].rank;
    // One $DLBATCH_PROGRESS per part, read with the first rank's streams;
    // the others' processes write to it by name.
    if (i > 0) {
      one.channel = false;
      one.channel_fifo.clear();
    }
    for (auto& kv : ranks[i].env) one.env.push_back(std::move(kv));
    if (!containment_.mark_prefix.empty()) {
      // Last, so the job's own env: cannot replace it.
      one.mark =
          absl::StrCat(containment_.mark_prefix, key, "/", one.rank, "/");
      one.env.emplace_back(kJobMarkVar, one.mark);
    }
    if (!group.cgroup.empty()) {
      one.cgroup = absl::StrCat(group.cgroup, "/rank-", one.rank);
      if (mkdir(one.cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
        group.start_error = absl::ErrnoToStatus(
            errno, absl::StrCat("making cgroup ", one.cgroup));
        break;
      }
    }
    const int64_t set_key = next_rank_key_--;
    absl::StatusOr<pid_t> pid = set_->Start(set_key, one);
    if (!pid.ok()) {
      if (!one.cgroup.empty()) rmdir(one.cgroup.c_str());
      group.start_error = absl::Status(
          pid.status().code(),
          absl::StrCat("rank ", one.rank, ": ", pid.status().message()));
      break;
    }
    group.live[set_key] = one.rank;
    rank_jobs_[set_key] = key;
  }
  if (!group.start_error) {
    events_->ProcessStarted(key, absl::OkStatus());
    return;
  }
  // The ranks that did start go first; the failure is told once they are
  // gone (ExitOf), so the job's slots are never freed under one.
  if (group.live.empty()) {
    absl::Status error = *group.start_error;
    if (!group.cgroup.empty()) rmdir(group.cgroup.c_str());
    groups_.erase(key);
    events_->ProcessStarted(key, error);
    return;
  }
  group.stopping = true;
  for (const auto& [set_key, rank] : group.live)
    set_->Terminate(set_key, SIGKILL, 0);
}

void SubprocessRunner::LineOf(int64_t set_key, const OutputLine& line) {
  auto job = rank_jobs_.find(set_key);
  events_->ProcessLine(job == rank_jobs_.end() ? set_key : job->second, line);
}

void SubprocessRunner::ExitOf(int64_t set_key, const ExitInfo& info) {
  auto job = rank_jobs_.find(set_key);
  if (job == rank_jobs_.end()) {
    events_->ProcessExited(set_key, info);
    return;
  }
  const int64_t key = job->second;
  rank_jobs_.erase(job);
  RankGroup& group = groups_.at(key);
  group.live.erase(set_key);
  group.end.leftover_killed += info.leftover_killed;
  if (!info.leftover_names.empty()) {
    absl::StrAppend(&group.end.leftover_names,
                    group.end.leftover_names.empty() ? "" : ", ",
                    info.leftover_names);
  }
  group.end.killed_after_grace |= info.killed_after_grace;
  const bool failed = !info.exited || info.exit_code != 0;
  if (failed && !group.failed) {
    group.failed = info;
    if (!group.stopping) {
      group.stopping = true;
      for (const auto& [other, rank] : group.live)
        set_->Terminate(other, SIGTERM, kStopOthersGraceMs);
    }
  }
  if (!group.live.empty()) return;
  RankGroup done = std::move(group);
  groups_.erase(key);
  if (!done.cgroup.empty()) rmdir(done.cgroup.c_str());
  if (done.start_error) {
    events_->ProcessStarted(key, *done.start_error);
    return;
  }
  ExitInfo end = done.failed ? *done.failed : info;
  if (!done.failed) end.rank = -1;  // every one exited 0: the part did
  end.leftover_killed = done.end.leftover_killed;
  end.leftover_names = done.end.leftover_names;
  end.killed_after_grace = done.end.killed_after_grace;
  events_->ProcessExited(key, end);
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
