// The real runner: its loop thread is joined once however many threads
// shut it down at once, and a preempted job's signal reaches every process
// its containment holds.
#include "worker/process_runner.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "worker/job_cgroups.h"

namespace dlbatch::worker {
namespace {

class CountingEvents : public ProcessEvents {
 public:
  void ProcessStarted(int64_t, absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ++started_;
    ok_ = ok_ && status.ok();
  }
  void ProcessLine(int64_t, const OutputLine&) override {}
  void ProcessExited(int64_t, const ExitInfo&) override {}
  bool WaitStarted(int n) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return started_ >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
    return started_ >= n && ok_;
  }

 private:
  absl::Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
};

// Two threads shut the runner down at the same moment while a job runs,
// then the runner is destroyed, as a signalled worker does. Each round
// must end: a hang here is a second join of the loop thread.
TEST(SubprocessRunnerTest, ShutdownsFromTwoThreadsAtOnceBothReturn) {
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) {
      ADD_FAILURE() << "shutting the runner down from two threads hung";
      _exit(1);
    }
  });
  for (int round = 0; round < 30; ++round) {
    CountingEvents events;
    auto runner = std::make_unique<SubprocessRunner>(SystemClock::Get());
    runner->Attach(&events);
    SubprocessOptions job;
    job.argv = {"sleep", "30"};
    runner->Start(1, job);
    ASSERT_TRUE(events.WaitStarted(1));
    std::atomic<int> go{0};
    auto stop = [&] {
      go.fetch_add(1);
      while (go.load() < 2) {
      }
      runner->Shutdown();
    };
    std::thread a(stop);
    std::thread b(stop);
    a.join();
    b.join();
    runner.reset();  // shuts down once more, as the destructor does
  }
  done = true;
  watchdog.join();
}

// Records what the runner reports, for a test to wait on.
class RecordingEvents : public ProcessEvents {
 public:
  void ProcessStarted(int64_t key, absl::Status status) override {
    absl::MutexLock lock(&mu_);
    started_.emplace(key, std::move(status));
  }
  void ProcessLine(int64_t key, const OutputLine& line) override {
    absl::MutexLock lock(&mu_);
    lines_[key].push_back(line.text);
    ranked_[key].push_back(
        absl::StrCat(line.rank, ":", line.stream, ":", line.text));
  }
  void ProcessExited(int64_t key, const ExitInfo& info) override {
    absl::MutexLock lock(&mu_);
    exits_.emplace(key, info);
  }
  // Waits up to `timeout` for `key`'s start; its status.
  absl::Status WaitStarted(int64_t key, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return started_.count(key) != 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout))
      return absl::DeadlineExceededError("no start reported");
    return started_.at(key);
  }
  std::optional<ExitInfo> WaitExit(int64_t key, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return exits_.count(key) != 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout))
      return std::nullopt;
    return exits_.at(key);
  }
  // Each line as "RANK:STREAM:TEXT".
  std::vector<std::string> Ranked(int64_t key) {
    absl::MutexLock lock(&mu_);
    return ranked_[key];
  }
  bool HasLine(int64_t key, const std::string& text) {
    absl::MutexLock lock(&mu_);
    for (const std::string& l : lines_[key]) {
      if (l == text) return true;
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::map<int64_t, absl::Status> started_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<std::string>> lines_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<std::string>> ranked_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, ExitInfo> exits_ ABSL_GUARDED_BY(mu_);
};

bool WaitFor(const std::function<bool()>& ready, int timeout_ms) {
  for (int waited = 0; !ready(); waited += 10) {
    if (waited >= timeout_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

pid_t ReadPid(const std::string& path) {
  pid_t pid = 0;
  std::ifstream(path) >> pid;
  return pid;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// A preempted command job: its stop signal (here SIGUSR2) reaches every
// process of it - the leader, a process that left its group with setsid
// after a double fork (found only by the job's containment: its mark, or
// its cgroup) - and what ignores the signal is killed at the grace.
class PreemptSignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "preempt_signal_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void RunPreempted(const JobContainment& containment) {
    constexpr int64_t kGraceMs = 1500;
    SubprocessRunner runner(SystemClock::Get(), containment);
    RecordingEvents events;
    runner.Attach(&events);
    SubprocessOptions job;
    job.cwd = dir_;
    // The leader notes the signal and runs on; the escapee notes it and
    // exits; the ignorer (a child of the leader) ignores it.
    job.argv = {"sh", "-c",
                "trap 'echo leader > got-leader' USR2\n"
                "(setsid sh -c 'trap \"echo escapee > got-escapee; exit 0\" "
                "USR2; echo $$ > pid-escapee; while :; do sleep 0.05; done' "
                "</dev/null >/dev/null 2>&1 &)\n"
                "sh -c 'trap \"\" USR2; echo $$ > pid-ignorer; exec sleep "
                "1000' &\n"
                "echo ready\n"
                "while :; do sleep 0.05; done\n"};
    job.linger_ms = 10000;  // the grace, not the linger, ends the job
    runner.Start(1, job);
    ASSERT_TRUE(events.WaitStarted(1, absl::Seconds(10)).ok());
    const std::string escapee_file = dir_ + "/pid-escapee";
    const std::string ignorer_file = dir_ + "/pid-ignorer";
    ASSERT_TRUE(WaitFor(
        [&] {
          return events.HasLine(1, "ready") && ReadPid(escapee_file) > 0 &&
                 ReadPid(ignorer_file) > 0;
        },
        10000))
        << "the job's processes never got ready";
    const pid_t escapee = ReadPid(escapee_file);
    const pid_t ignorer = ReadPid(ignorer_file);
    ASSERT_NE(getpgid(escapee), getpgid(ignorer))
        << "the escapee did not setsid";

    const int64_t start = SystemClock::Get()->MonotonicMs();
    runner.Terminate(1, SIGUSR2, kGraceMs);
    EXPECT_TRUE(WaitFor(
        [&] {
          return Exists(dir_ + "/got-leader") && Exists(dir_ + "/got-escapee");
        },
        kGraceMs - 200))
        << "leader " << Exists(dir_ + "/got-leader") << ", escapee "
        << Exists(dir_ + "/got-escapee");
    EXPECT_EQ(kill(ignorer, 0), 0) << "killed before the grace";

    std::optional<ExitInfo> info = events.WaitExit(1, absl::Seconds(10));
    ASSERT_TRUE(info.has_value()) << "the job did not end after its grace";
    EXPECT_GE(SystemClock::Get()->MonotonicMs() - start, kGraceMs - 10);
    EXPECT_TRUE(info->killed_after_grace);
    EXPECT_EQ(info->term_signal, SIGKILL);
    EXPECT_EQ(kill(ignorer, 0), -1) << "the ignorer outlived the grace";
    EXPECT_EQ(kill(escapee, 0), -1) << "the escapee did not stop";
    runner.Shutdown();
  }

  std::string dir_;
};

TEST_F(PreemptSignalTest, ReachesEveryMarkedProcessAndKillsAtTheGrace) {
  JobContainment containment;
  containment.mark_prefix = absl::StrCat("preempt-test-", getpid(), ":");
  RunPreempted(containment);
}

TEST_F(PreemptSignalTest, ReachesEveryProcessOfTheCgroupAndKillsAtTheGrace) {
  auto root = MakeCgroupRoot(absl::StrCat("dlbatch-preempt-test-", getpid()));
  if (!root.ok()) GTEST_SKIP() << "no cgroup to make: " << root.status();
  JobContainment containment;
  containment.cgroup_root = *root;
  RunPreempted(containment);
  rmdir(root->c_str());
}

// A part of several processes (launch: per-node or per-slot): each is a
// stream of its own labelled with its rank, a stop reaches every one, and
// the part's end is the first failure's, naming its rank.
class RankProcessesTest : public PreemptSignalTest {
 protected:
  static SubprocessOptions Ranks(std::string script, std::vector<int> ranks) {
    SubprocessOptions job;
    job.argv = {"sh", "-c", std::move(script)};
    for (int r : ranks) {
      SubprocessOptions::RankProcess p;
      p.rank = r;
      p.env = {{"RANK", absl::StrCat(r)}};
      job.ranks.push_back(std::move(p));
    }
    return job;
  }
};

TEST_F(RankProcessesTest, EachRankIsAStreamOfItsOwnLabelledWithItsRank) {
  SubprocessRunner runner(SystemClock::Get());
  RecordingEvents events;
  runner.Attach(&events);
  runner.Start(
      1, Ranks("echo out $RANK; echo err $RANK >&2; echo again $RANK", {3, 4}));
  ASSERT_TRUE(events.WaitStarted(1, absl::Seconds(10)).ok());
  std::optional<ExitInfo> info = events.WaitExit(1, absl::Seconds(10));
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->exit_code, 0);
  EXPECT_EQ(info->rank, -1);
  std::vector<std::string> lines = events.Ranked(1);
  for (int r : {3, 4}) {
    // Each rank's own stdout in its order, and its stderr apart.
    std::vector<std::string> out;
    for (const std::string& l : lines) {
      if (l.rfind(absl::StrCat(r, ":1:"), 0) == 0) out.push_back(l);
    }
    EXPECT_EQ(out, (std::vector<std::string>{absl::StrCat(r, ":1:out ", r),
                                             absl::StrCat(r, ":1:again ", r)}));
    EXPECT_NE(
        std::find(lines.begin(), lines.end(), absl::StrCat(r, ":2:err ", r)),
        lines.end());
  }
  EXPECT_EQ(lines.size(), 6u);
  runner.Shutdown();
}

TEST_F(RankProcessesTest, OneRankFailingEndsThePartNamingItAndStopsTheRest) {
  SubprocessRunner runner(SystemClock::Get());
  RecordingEvents events;
  runner.Attach(&events);
  const int64_t start = SystemClock::Get()->MonotonicMs();
  runner.Start(
      1, Ranks("if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 1000",
               {0, 1, 2}));
  ASSERT_TRUE(events.WaitStarted(1, absl::Seconds(10)).ok());
  std::optional<ExitInfo> info = events.WaitExit(1, absl::Seconds(20));
  ASSERT_TRUE(info.has_value()) << "the others were not stopped";
  EXPECT_LT(SystemClock::Get()->MonotonicMs() - start, 8000);
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(info->exit_code, 3);
  EXPECT_EQ(info->Describe(), "rank 1: exit code 3");
  runner.Shutdown();
}

TEST_F(RankProcessesTest, AStopReachesEveryRankInItsMarkedContainment) {
  JobContainment containment;
  containment.mark_prefix = absl::StrCat("rank-test-", getpid(), ":");
  SubprocessRunner runner(SystemClock::Get(), containment);
  RecordingEvents events;
  runner.Attach(&events);
  SubprocessOptions job = Ranks(
      "trap 'echo $RANK > got-$RANK; exit 0' USR2; echo ready; "
      "case $DLBATCH_JOB_MARK in *:7/$RANK/) ;; *) exit 9;; esac; "
      "while :; do sleep 0.05; done",
      {0, 1});
  job.cwd = dir_;
  runner.Start(7, job);
  ASSERT_TRUE(events.WaitStarted(7, absl::Seconds(10)).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        return events.HasLine(7, "ready") && events.Ranked(7).size() == 2;
      },
      10000));
  runner.Terminate(7, SIGUSR2, 5000);
  std::optional<ExitInfo> info = events.WaitExit(7, absl::Seconds(10));
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->exit_code, 0) << info->Describe();
  EXPECT_FALSE(info->killed_after_grace);
  EXPECT_TRUE(Exists(dir_ + "/got-0"));
  EXPECT_TRUE(Exists(dir_ + "/got-1"));
  runner.Shutdown();
}

TEST_F(RankProcessesTest, AStopReachesEveryRankOfTheJobsCgroup) {
  auto root = MakeCgroupRoot(absl::StrCat("dlbatch-rank-test-", getpid()));
  if (!root.ok()) GTEST_SKIP() << "no cgroup to make: " << root.status();
  JobContainment containment;
  containment.cgroup_root = *root;
  SubprocessRunner runner(SystemClock::Get(), containment);
  RecordingEvents events;
  runner.Attach(&events);
  // Each rank leaves a process that ignores the stop: the grace kills it.
  runner.Start(
      7, Ranks("(trap '' USR2; exec sleep 1000) & echo ready; wait", {0, 1}));
  ASSERT_TRUE(events.WaitStarted(7, absl::Seconds(10)).ok());
  ASSERT_TRUE(WaitFor([&] { return events.Ranked(7).size() == 2; }, 10000));
  EXPECT_EQ(CgroupProcs(*root + "/job-7/rank-0").size(), 2u);
  EXPECT_EQ(CgroupProcs(*root + "/job-7/rank-1").size(), 2u);
  runner.Terminate(7, SIGUSR2, 1000);
  std::optional<ExitInfo> info = events.WaitExit(7, absl::Seconds(10));
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->killed_after_grace);
  EXPECT_FALSE(Exists(*root + "/job-7")) << "the job's cgroup was left";
  runner.Shutdown();
  rmdir(root->c_str());
}

// A rank that cannot start fails the part's start, once the ranks started
// before it are gone.
TEST_F(RankProcessesTest, ARankThatCannotStartFailsTheStartAfterTheOthersGo) {
  SubprocessRunner runner(SystemClock::Get());
  RecordingEvents events;
  runner.Attach(&events);
  SubprocessOptions job = Ranks("exec sleep 1000", {0, 1});
  job.ranks[1].env.emplace_back("BAD=NAME", "x");
  runner.Start(1, job);
  absl::Status s = events.WaitStarted(1, absl::Seconds(10));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("rank 1: "), std::string::npos) << s;
  EXPECT_FALSE(events.WaitExit(1, absl::Milliseconds(200)).has_value());
  runner.Shutdown();
}

}  // namespace
}  // namespace dlbatch::worker
