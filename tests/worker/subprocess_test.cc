#include "worker/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "worker/job_cgroups.h"

namespace dlbatch::worker {
namespace {

using Key = SubprocessSet::Key;

// Real monotonic time (timers must run) with a fixed wall clock, so the
// test sees which clock stamps the lines.
class FixedWallClock : public Clock {
 public:
  static constexpr int64_t kWallMs = 1'700'000'000'123;
  int64_t NowMs() const override { return kWallMs; }
  int64_t MonotonicMs() const override {
    return SystemClock::Get()->MonotonicMs();
  }
};

int64_t MonoMs() { return SystemClock::Get()->MonotonicMs(); }

// Children of this process that are zombies (nobody reaped them).
int ZombieChildren() {
  int count = 0;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return 0;
  while (const struct dirent* e = readdir(dir)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::ifstream in(absl::StrCat("/proc/", e->d_name, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 1));
    char state;
    long ppid;
    if (fields >> state >> ppid && ppid == getpid() && state == 'Z') ++count;
  }
  closedir(dir);
  return count;
}

class SubprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "subprocess_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    set_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  SubprocessSet& Set(const Clock* clock = SystemClock::Get()) {
    if (set_ == nullptr) {
      set_ = std::make_unique<SubprocessSet>(
          clock,
          [this](Key key, const OutputLine& line) {
            if (exits_.count(key) != 0) {
              ADD_FAILURE()
                  << "line after exit for key " << key << ": " << line.text;
            }
            lines_[key].push_back(line);
          },
          [this](Key key, const ExitInfo& info) {
            if (!exits_.emplace(key, info).second) {
              ADD_FAILURE() << "second exit for key " << key;
            }
          });
    }
    return *set_;
  }

  SubprocessOptions Options(std::vector<std::string> argv) {
    SubprocessOptions options;
    options.argv = std::move(argv);
    options.cwd = dir_;
    return options;
  }

  SubprocessOptions Shell(const std::string& script) {
    return Options({"sh", "-c", script});
  }

  // Polls until `key` has exited; false after timeout_ms.
  bool WaitExit(Key key, int64_t timeout_ms = 10000) {
    int64_t deadline = MonoMs() + timeout_ms;
    while (exits_.count(key) == 0) {
      if (MonoMs() > deadline) return false;
      set_->Poll(100);
    }
    return true;
  }

  // Polls until `key` printed `text` on stdout; false after timeout_ms.
  bool WaitLine(Key key, const std::string& text, int64_t timeout_ms = 10000) {
    int64_t deadline = MonoMs() + timeout_ms;
    for (;;) {
      for (const OutputLine& line : lines_[key]) {
        if (line.text == text) return true;
      }
      if (MonoMs() > deadline || exits_.count(key) != 0) return false;
      set_->Poll(100);
    }
  }

  // Runs to completion; returns the exit info (fails the test on timeout).
  ExitInfo Run(Key key, const SubprocessOptions& options) {
    auto pid = Set().Start(key, options);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return ExitInfo();
    EXPECT_TRUE(WaitExit(key)) << "no exit within 10 s";
    EXPECT_FALSE(Set().IsRunning(key));
    return exits_[key];
  }

  std::vector<std::string> Texts(Key key, int stream) {
    std::vector<std::string> out;
    for (const OutputLine& line : lines_[key]) {
      if (line.stream == stream) out.push_back(line.text);
    }
    return out;
  }

  void WriteFile(const std::string& path, const std::string& content,
                 mode_t mode) {
    std::ofstream(path) << content;
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
  }

  FixedWallClock fixed_clock_;  // outlives set_, which may use it
  std::string dir_;
  std::unique_ptr<SubprocessSet> set_;
  std::map<Key, std::vector<OutputLine>> lines_;
  std::map<Key, ExitInfo> exits_;
};

TEST(ExitInfoTest, Describe) {
  ExitInfo exited;
  exited.exited = true;
  exited.exit_code = 3;
  EXPECT_EQ(exited.Describe(), "exit code 3");
  ExitInfo killed;
  killed.term_signal = 9;
  EXPECT_EQ(killed.Describe(), "killed by signal 9 (Killed)");
}

TEST(ProcessGroupAliveTest, ZombieCountsUntilReaped) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);
    _exit(0);
  }
  // Wait until it has exited, without reaping it.
  siginfo_t info;
  ASSERT_EQ(waitid(P_PID, pid, &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(ProcessGroupAlive(pid)) << "a zombie is still a member";
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_FALSE(ProcessGroupAlive(pid));
  EXPECT_FALSE(ProcessGroupAlive(0));
}

TEST_F(SubprocessTest, StreamsKeepTheirLinesInOrder) {
  Set(&fixed_clock_);
  ExitInfo info = Run(1, Shell("echo o1; echo e1 >&2; echo o2; echo e2 >&2; "
                               "echo o3"));
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.exit_code, 0);
  EXPECT_EQ(Texts(1, 1), (std::vector<std::string>{"o1", "o2", "o3"}));
  EXPECT_EQ(Texts(1, 2), (std::vector<std::string>{"e1", "e2"}));
  for (const OutputLine& line : lines_[1]) {
    EXPECT_EQ(line.time_ms, FixedWallClock::kWallMs);
  }
}

TEST_F(SubprocessTest, LastLineWithoutNewlineAndCrlf) {
  Run(1, Shell(R"(printf 'a\nb\nlast')"));
  EXPECT_EQ(Texts(1, 1), (std::vector<std::string>{"a", "b", "last"}));
  Run(2, Shell(R"(printf 'dos\r\n\nunix\n' >&2)"));
  EXPECT_EQ(Texts(2, 2), (std::vector<std::string>{"dos", "", "unix"}));
}

TEST_F(SubprocessTest, LineEndingsGiveBackTheStreamsExactBytes) {
  const std::string printed = "dos\r\n\nunix\nlong line\r\nlast\r";
  SubprocessOptions options = Shell(
      "printf 'dos\\r\\n\\nunix\\nlong line"
      "\\r\\nlast\\r'");
  options.max_line_bytes = 4;
  Run(1, options);
  std::string bytes;
  for (const OutputLine& line : lines_[1]) {
    bytes += line.text;
    bytes += line.ending == OutputLine::kNewline ? "\n"
             : line.ending == OutputLine::kCrlf  ? "\r\n"
                                                 : "";
  }
  EXPECT_EQ(bytes, printed);
  ASSERT_FALSE(lines_[1].empty());
  EXPECT_EQ(lines_[1].back().text, "\r");  // "last\r": a piece of 4, then 1
  EXPECT_EQ(lines_[1].back().ending, OutputLine::kNone);
  EXPECT_EQ(lines_[1].front().text, "dos");
  EXPECT_EQ(lines_[1].front().ending, OutputLine::kCrlf);
}

TEST_F(SubprocessTest, EachProcessesLinesCarryTheRankItWasStartedWith) {
  // Two processes side by side, as one part's per-slot launch runs them;
  // every piece of every line (a long one split, a last one unended) is
  // labelled with its own process's rank.
  SubprocessOptions zero = Shell("echo a; echo b >&2; printf 'long line'");
  zero.rank = 0;
  zero.max_line_bytes = 4;
  SubprocessOptions three = Shell("echo c; echo d >&2");
  three.rank = 3;
  ASSERT_TRUE(Set().Start(1, zero).ok());
  ASSERT_TRUE(Set().Start(2, three).ok());
  ASSERT_TRUE(WaitExit(1));
  ASSERT_TRUE(WaitExit(2));
  ASSERT_EQ(lines_[1].size(), 5u);  // a, b, "long", " lin", "e"
  for (const OutputLine& line : lines_[1]) EXPECT_EQ(line.rank, 0) << line.text;
  ASSERT_EQ(lines_[2].size(), 2u);
  for (const OutputLine& line : lines_[2]) EXPECT_EQ(line.rank, 3) << line.text;
  Run(3, Shell("echo unlabelled"));
  ASSERT_EQ(lines_[3].size(), 1u);
  EXPECT_EQ(lines_[3][0].rank, -1);
}

TEST_F(SubprocessTest, ExitCodesAndSignals) {
  ExitInfo info = Run(1, Shell("echo last; exit 3"));
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.exit_code, 3);
  EXPECT_EQ(info.Describe(), "exit code 3");
  EXPECT_EQ(Texts(1, 1), std::vector<std::string>{"last"});
  EXPECT_FALSE(info.killed_after_grace);
  EXPECT_EQ(info.leftover_killed, 0);

  info = Run(2, Shell("echo before; kill -KILL $$"));
  EXPECT_FALSE(info.exited);
  EXPECT_EQ(info.term_signal, SIGKILL);
  EXPECT_EQ(info.Describe(), "killed by signal 9 (Killed)");
  EXPECT_EQ(Texts(2, 1), std::vector<std::string>{"before"});
  EXPECT_EQ(Set().running(), 0u);
}

TEST_F(SubprocessTest, HundredThousandLinesThenImmediateExitLosesNone) {
  ExitInfo info = Run(1, Options({"seq", "1", "100000"}));
  EXPECT_TRUE(info.exited);
  std::vector<std::string> texts = Texts(1, 1);
  ASSERT_EQ(texts.size(), 100000u);
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_EQ(texts[i], std::to_string(i + 1)) << "line " << i;
  }
  Run(2, Shell("seq 1 100000 >&2"));
  texts = Texts(2, 2);
  ASSERT_EQ(texts.size(), 100000u);
  EXPECT_EQ(texts.back(), "100000");
}

TEST_F(SubprocessTest, LongLinesAreSplit) {
  SubprocessOptions options = Shell(
      "head -c 2500 /dev/zero | tr '\\0' x; echo; "
      "head -c 1000 /dev/zero | tr '\\0' y; printf '\\r\\n'; "
      "head -c 1200 /dev/zero | tr '\\0' z");
  options.max_line_bytes = 1000;
  Run(1, options);
  std::vector<std::string> texts = Texts(1, 1);
  EXPECT_EQ(texts, (std::vector<std::string>{
                       std::string(1000, 'x'), std::string(1000, 'x'),
                       std::string(500, 'x'), std::string(1000, 'y'),
                       std::string(1000, 'z'), std::string(200, 'z')}));
}

TEST_F(SubprocessTest, EnvironmentOverridesAndPathLookup) {
  ASSERT_EQ(setenv("DLBATCH_SUBPROCESS_TEST_PARENT", "from-parent", 1), 0);
  ASSERT_EQ(setenv("DLBATCH_SUBPROCESS_TEST_REPLACED", "old", 1), 0);
  SubprocessOptions options = Shell(
      "echo \"$DLBATCH_SUBPROCESS_TEST_PARENT|"
      "$DLBATCH_SUBPROCESS_TEST_REPLACED|$DLBATCH_SUBPROCESS_TEST_NEW\"");
  options.env = {{"DLBATCH_SUBPROCESS_TEST_REPLACED", "new"},
                 {"DLBATCH_SUBPROCESS_TEST_NEW", "a b=c"}};
  Run(1, options);
  EXPECT_EQ(Texts(1, 1), std::vector<std::string>{"from-parent|new|a b=c"});
  unsetenv("DLBATCH_SUBPROCESS_TEST_PARENT");
  unsetenv("DLBATCH_SUBPROCESS_TEST_REPLACED");

  // argv[0] is looked up on the child's PATH, not the caller's.
  std::string bin = dir_ + "/bin";
  ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
  WriteFile(bin + "/dlbatch-test-tool", "#!/bin/sh\necho tool-ran \"$@\"\n",
            0755);
  SubprocessOptions tool = Options({"dlbatch-test-tool", "arg"});
  EXPECT_FALSE(Set().Start(2, tool).ok());
  tool.env = {{"PATH", bin + ":/usr/bin:/bin"}};
  Run(3, tool);
  EXPECT_EQ(Texts(3, 1), std::vector<std::string>{"tool-ran arg"});
}

TEST_F(SubprocessTest, WorkingDirectoryIsHonoured) {
  Run(1, Options({"pwd", "-P"}));
  EXPECT_EQ(Texts(1, 1), std::vector<std::string>{
                             std::filesystem::canonical(dir_).string()});

  SubprocessOptions missing = Options({"pwd"});
  missing.cwd = dir_ + "/no-such-dir";
  auto pid = Set().Start(2, missing);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("no-such-dir"), std::string::npos)
      << pid.status();
  EXPECT_EQ(Set().running(), 0u);
}

TEST_F(SubprocessTest, StdinIsDevNull) {
  int64_t start = MonoMs();
  ExitInfo info = Run(1, Options({"cat"}));
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.exit_code, 0);
  EXPECT_TRUE(lines_[1].empty());
  EXPECT_LT(MonoMs() - start, 5000);
  Run(2, Options({"readlink", "/proc/self/fd/0"}));
  EXPECT_EQ(Texts(2, 1), std::vector<std::string>{"/dev/null"});
}

TEST_F(SubprocessTest, UnrunnableProgramsAreErrorsFromStart) {
  auto pid = Set().Start(1, Options({"dlbatch-no-such-program-xyz"}));
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(pid.status().message().find("dlbatch-no-such-program-xyz"),
            std::string::npos);
  EXPECT_NE(pid.status().message().find("No such file"), std::string::npos)
      << pid.status();

  std::string script = dir_ + "/not-executable";
  WriteFile(script, "#!/bin/sh\necho hi\n", 0644);
  pid = Set().Start(2, Options({script}));
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(pid.status().message().find("not-executable"), std::string::npos);
  EXPECT_NE(pid.status().message().find("Permission denied"), std::string::npos)
      << pid.status();

  EXPECT_EQ(Set().running(), 0u);
  EXPECT_FALSE(Set().IsRunning(1));
  EXPECT_EQ(ZombieChildren(), 0) << "a failed child was not reaped";
  Set().Poll(0);
  EXPECT_TRUE(exits_.empty()) << "no exit for a process never started";
}

TEST_F(SubprocessTest, DuplicateKeyIsRefused) {
  ASSERT_TRUE(Set().Start(1, Options({"sleep", "1000"})).ok());
  auto again = Set().Start(1, Options({"true"}));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Set().running(), 1u);
}

TEST_F(SubprocessTest, TerminateKillsTheWholeGroupAfterGrace) {
  // Ignores SIGTERM, and so do its children (an ignored disposition is
  // inherited).
  std::string script =
      "trap '' TERM\n"
      "sleep 1000 & echo $! > pids\n"
      "sleep 1000 & echo $! >> pids\n"
      "echo ready\n"
      "wait\n";
  auto pid = Set().Start(1, Shell(script));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitLine(1, "ready"));
  std::vector<pid_t> children;
  std::ifstream in(dir_ + "/pids");
  for (pid_t child; in >> child;) children.push_back(child);
  ASSERT_EQ(children.size(), 2u);
  for (pid_t child : children) ASSERT_EQ(kill(child, 0), 0);

  int64_t start = MonoMs();
  Set().Terminate(1, SIGTERM, 300);
  ASSERT_TRUE(WaitExit(1));
  EXPECT_GE(MonoMs() - start, 290);
  const ExitInfo& info = exits_[1];
  EXPECT_TRUE(info.killed_after_grace);
  EXPECT_EQ(info.term_signal, SIGKILL);
  EXPECT_FALSE(ProcessGroupAlive(*pid));
  for (pid_t child : children) {
    EXPECT_EQ(kill(child, 0), -1) << "pid " << child << " still exists";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST_F(SubprocessTest, TerminateLetsAGracefulProgramExit) {
  auto pid =
      Set().Start(1, Shell("trap 'echo got-term; exit 0' TERM; echo ready; "
                           "while :; do sleep 0.05; done"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitLine(1, "ready"));
  Set().Terminate(1, SIGTERM, 5000);
  int64_t start = MonoMs();
  ASSERT_TRUE(WaitExit(1));
  EXPECT_LT(MonoMs() - start, 3000);
  EXPECT_FALSE(exits_[1].killed_after_grace);
  EXPECT_TRUE(exits_[1].exited);
  EXPECT_EQ(Texts(1, 1), (std::vector<std::string>{"ready", "got-term"}));
  Set().Terminate(1, SIGTERM, 0);  // unknown key now: ignored
}

TEST_F(SubprocessTest, LeftoverHoldingStdoutIsKilledAfterLinger) {
  SubprocessOptions options = Shell("sleep 1000 & echo started");
  options.linger_ms = 300;
  int64_t start = MonoMs();
  auto pid = Set().Start(1, options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitExit(1));
  EXPECT_GE(MonoMs() - start, 290);
  const ExitInfo& info = exits_[1];
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.exit_code, 0);
  EXPECT_GE(info.leftover_killed, 1);
  EXPECT_FALSE(info.killed_after_grace);
  EXPECT_EQ(Texts(1, 1), std::vector<std::string>{"started"});
  EXPECT_FALSE(ProcessGroupAlive(*pid));
}

TEST_F(SubprocessTest, LeftoverWithClosedPipesIsKilledAfterLinger) {
  SubprocessOptions options =
      Shell("sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > pid");
  options.linger_ms = 200;
  auto pid = Set().Start(1, options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitExit(1));
  EXPECT_EQ(exits_[1].leftover_killed, 1);
  pid_t sleeper = 0;
  std::ifstream(dir_ + "/pid") >> sleeper;
  ASSERT_GT(sleeper, 0);
  EXPECT_EQ(kill(sleeper, 0), -1);
  EXPECT_FALSE(ProcessGroupAlive(*pid));
}

TEST_F(SubprocessTest, ExitedMembersAreReapedSoTheGroupEmpties) {
  // The background child outlives the leader by 300 ms, then becomes a
  // zombie of this process (the subreaper): the set must wait for it, then
  // reap it instead of waiting out the 10 s linger.
  SubprocessOptions options =
      Shell("sleep 0.3 >/dev/null 2>&1 & echo $! > pid; exit 4");
  options.linger_ms = 10000;
  int64_t start = MonoMs();
  auto pid = Set().Start(1, options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitExit(1));
  int64_t elapsed = MonoMs() - start;
  EXPECT_GE(elapsed, 250) << "done before the group emptied";
  EXPECT_LT(elapsed, 5000) << "waited for the linger";
  EXPECT_EQ(exits_[1].exit_code, 4);
  EXPECT_EQ(exits_[1].leftover_killed, 0);
  EXPECT_FALSE(ProcessGroupAlive(*pid));
  pid_t sleeper = 0;
  std::ifstream(dir_ + "/pid") >> sleeper;
  ASSERT_GT(sleeper, 0);
  EXPECT_EQ(kill(sleeper, 0), -1) << "the zombie was not reaped";
}

TEST_F(SubprocessTest, EscapedPipeHolderDoesNotKeepTheJobRunning) {
  // The escaped sleep holds both pipes open; what the group printed,
  // unterminated last line included, still arrives.
  SubprocessOptions options =
      Shell("setsid sleep 1000 & echo $!; printf 'no newline'");
  options.linger_ms = 10000;
  int64_t start = MonoMs();
  ASSERT_TRUE(Set().Start(1, options).ok());
  ASSERT_TRUE(WaitExit(1));
  EXPECT_LT(MonoMs() - start, 5000);
  EXPECT_EQ(exits_[1].leftover_killed, 0);
  std::vector<std::string> texts = Texts(1, 1);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[1], "no newline");
  pid_t escaped = std::atoi(texts[0].c_str());
  ASSERT_GT(escaped, 0);
  EXPECT_EQ(kill(escaped, SIGKILL), 0) << "expected the escaped sleep alive";
  waitpid(escaped, nullptr, 0);  // reparented here (subreaper)
}

// With a mark in its environment, a process that setsid'd away from the
// job is still the job's: the job ends only once it is killed, and says so.
TEST_F(SubprocessTest, MarkedSetsidEscapeeIsKilledAfterLinger) {
  const std::string mark = absl::StrCat("test-", getpid(), ":1/");
  SubprocessOptions options =
      Shell("setsid sleep 1000 >/dev/null 2>&1 & echo $! > pid");
  options.env.emplace_back(kJobMarkVar, mark);
  options.mark = mark;
  options.linger_ms = 200;
  ExitInfo info = Run(1, options);
  EXPECT_EQ(info.leftover_killed, 1);
  EXPECT_NE(info.leftover_names.find("sleep (pid"), std::string::npos)
      << info.leftover_names;
  pid_t escaped = 0;
  std::ifstream(dir_ + "/pid") >> escaped;
  ASSERT_GT(escaped, 0);
  Set().Poll(50);  // reaps it (this process is the subreaper)
  EXPECT_TRUE(kill(escaped, 0) == -1 || MarkedProcesses(mark).empty());
}

// In a cgroup, nothing escapes: a double fork with setsid and no mark is
// killed at the end, and a stopped, TERM-ignoring one at a terminate.
TEST_F(SubprocessTest, CgroupHoldsEveryProcessOfTheJob) {
  auto root =
      MakeCgroupRoot(absl::StrCat("dlbatch-subprocess-test-", getpid()));
  if (!root.ok()) GTEST_SKIP() << "no cgroup to make: " << root.status();
  const std::string cg = *root + "/job-1";
  // (Left over by an earlier run of a process with this pid: reused.)
  ASSERT_TRUE(mkdir(cg.c_str(), 0755) == 0 || errno == EEXIST)
      << strerror(errno);
  SubprocessOptions options = Shell(
      "(setsid sh -c 'trap \"\" TERM; kill -STOP $$; sleep 1000' "
      ">/dev/null 2>&1 &); sleep 1000");
  options.cgroup = cg;
  auto pid = Set().Start(1, options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  // sh, sleep 1000, and the setsid'd sh, which has stopped itself (so its
  // trap is set: counting processes alone raced it on a quiet machine).
  auto stopped = [&cg] {
    for (pid_t pid : CgroupProcs(cg)) {
      std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
      std::string text((std::istreambuf_iterator<char>(stat)), {});
      const size_t close = text.rfind(')');
      if (close != std::string::npos && close + 2 < text.size() &&
          text[close + 2] == 'T')
        return true;
    }
    return false;
  };
  for (int i = 0; i < 100 && !stopped(); ++i) Set().Poll(20);
  ASSERT_TRUE(stopped()) << "the setsid'd shell never stopped itself";
  EXPECT_GE(CgroupProcs(cg).size(), 3u);
  Set().Terminate(1, SIGTERM, 300);
  ASSERT_TRUE(WaitExit(1));
  EXPECT_TRUE(exits_[1].killed_after_grace);
  EXPECT_TRUE(CgroupProcs(cg).empty());
  EXPECT_NE(access(cg.c_str(), F_OK), 0) << "the job's cgroup is removed";
  rmdir(root->c_str());
}

TEST_F(SubprocessTest, ParentDescriptorsAreNotInherited) {
  std::string path = dir_ + "/open-file";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0600);  // no O_CLOEXEC
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(fd, 100), 100);
  close(fd);
  Run(1, Options({"ls", "/proc/self/fd"}));
  close(100);
  std::vector<std::string> fds = Texts(1, 1);
  // 0, 1, 2 and the directory ls itself has open.
  EXPECT_LE(fds.size(), 4u);
  EXPECT_EQ(std::count(fds.begin(), fds.end(), "100"), 0);
  EXPECT_EQ(std::count(fds.begin(), fds.end(), "2"), 1);
}

TEST_F(SubprocessTest, ChannelIsDescriptorThreeAndArrivesAsStreamThree) {
  SubprocessOptions options = Shell(
      "echo out; echo '{\"n\": 1}' >&3; echo err >&2; echo '{\"n\": 2}' >&3");
  options.channel = true;
  ExitInfo info = Run(1, options);
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.exit_code, 0);
  std::vector<std::string> channel, out;
  for (const OutputLine& line : lines_[1]) {
    if (line.stream == 3) channel.push_back(line.text);
    if (line.stream == 1) out.push_back(line.text);
  }
  EXPECT_EQ(channel, (std::vector<std::string>{"{\"n\": 1}", "{\"n\": 2}"}));
  EXPECT_EQ(out, std::vector<std::string>{"out"});
}

TEST_F(SubprocessTest, WithoutAChannelDescriptorThreeIsClosed) {
  ExitInfo info = Run(1, Shell("if { echo x >&3; } 2>/dev/null; then echo "
                               "open; else echo closed; fi"));
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(Texts(1, 1), std::vector<std::string>{"closed"});
}

TEST_F(SubprocessTest, SignalMaskAndDispositionsAreReset) {
  sigset_t block, saved;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &block, &saved), 0);
  struct sigaction ignore = {}, old_int = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGINT, &ignore, &old_int), 0);
  Run(1, Options({"cat", "/proc/self/status"}));
  sigaction(SIGINT, &old_int, nullptr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  int checked = 0;
  for (const std::string& line : Texts(1, 1)) {
    if (line.rfind("SigBlk:", 0) == 0 || line.rfind("SigIgn:", 0) == 0) {
      EXPECT_EQ(line.substr(line.find_first_not_of(" \t", 7)),
                "0000000000000000")
          << line;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
}

TEST_F(SubprocessTest, WakeEndsAPollEarly) {
  Set();
  std::thread waker([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    set_->Wake();
  });
  int64_t start = MonoMs();
  set_->Poll(10000);
  EXPECT_LT(MonoMs() - start, 5000);
  waker.join();
}

TEST_F(SubprocessTest, DestructorKillsAndReapsWhatRuns) {
  auto pid = Set().Start(1, Shell("sleep 1000 & echo $! > pid; sleep 1000"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  pid_t child = 0;
  for (int i = 0; i < 200 && child == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream(dir_ + "/pid") >> child;
  }
  ASSERT_GT(child, 0);
  set_.reset();
  EXPECT_TRUE(exits_.empty());
  EXPECT_EQ(kill(*pid, 0), -1);
  EXPECT_EQ(kill(child, 0), -1);
  EXPECT_FALSE(ProcessGroupAlive(*pid));
}

}  // namespace
}  // namespace dlbatch::worker
