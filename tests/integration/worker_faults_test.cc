// Faults of a job's processes, of the link and of transfers, with the real
// scheduler, worker and CLI. Nothing of a job outlives it:
// processes that fork away, setsid, stop themselves or ignore SIGTERM die
// with their job - at its end, at cancel, and when the worker is killed -
// both where the worker keeps each job in a cgroup and where it cannot
// (--no-cgroups). A worker reconnects quickly after a scheduler restart. One
// job's large outputs delay no other job.
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "worker/job_cgroups.h"

namespace dlbatch::testing {
namespace {

// Processes whose environment holds `entry` (NAME=VALUE), from /proc.
std::vector<pid_t> ProcessesWithEnv(const std::string& entry) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (const struct dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid == getpid()) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/environ");
    std::string env((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    std::istringstream entries(env);
    for (std::string item; std::getline(entries, item, '\0');) {
      if (item == entry) {
        // A zombie runs nothing and holds nothing.
        std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
        std::string s((std::istreambuf_iterator<char>(stat)),
                      std::istreambuf_iterator<char>());
        size_t paren = s.rfind(')');
        if (paren != std::string::npos && paren + 2 < s.size() &&
            s[paren + 2] == 'Z')
          break;
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return out;
}

// Processes whose parent is `ppid`.
std::vector<pid_t> ProcessesWithPpid(pid_t ppid) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (const struct dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string s((std::istreambuf_iterator<char>(stat)),
                  std::istreambuf_iterator<char>());
    size_t paren = s.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(s.substr(paren + 2));
    char state;
    long parent = 0;
    rest >> state >> parent;
    if (parent == ppid) out.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return out;
}

std::string UniqueMark() {
  std::random_device rd;
  return "m" + std::to_string(rd()) + std::to_string(getpid());
}

bool HaveCgroup2() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.find(" - cgroup2 ") != std::string::npos) return true;
  }
  return false;
}

// Param: true = the worker keeps jobs in cgroups; false = --no-cgroups.
class WorkerFaultsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      if (geteuid() != 0) GTEST_SKIP() << "cgroups need root to make here";
      if (!HaveCgroup2()) GTEST_SKIP() << "no cgroup2 hierarchy is mounted";
      // Where the worker would make its cgroups, can this process?
      auto probe = worker::MakeCgroupRoot("dlbatch-faults-probe-" +
                                          std::to_string(getpid()));
      if (!probe.ok())
        GTEST_SKIP() << "cannot make a cgroup: " << probe.status();
      rmdir(probe->c_str());
    }
    mark_ = UniqueMark();
  }
  void Start(std::vector<std::string> scheduler_extra = {}) {
    c_.StartScheduler(scheduler_extra);
    worker_ = c_.StartWorker("w1", 2, "local", WorkerFlags());
    ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
    // The mode under test is the one the worker took.
    const std::string log = ReadAll(c_.dir() + "/worker-w1.log");
    if (GetParam()) {
      ASSERT_NE(log.find("each job in a cgroup"), std::string::npos) << log;
    } else {
      ASSERT_NE(log.find("without cgroups"), std::string::npos) << log;
    }
  }
  std::vector<std::string> WorkerFlags() const {
    if (GetParam()) return {};
    return {"--no-cgroups"};
  }
  // A job running `script` (sh) with the test's mark in its environment.
  int64_t SubmitScript(const std::string& name, const std::string& script) {
    const std::string path = c_.dir() + "/" + name + ".sh";
    WriteAll(path, script);
    return c_.Submit(c_.JobFile(name + ".yaml",
                                "name: " + name + "\ncommand: [sh, " + path +
                                    "]\nenv:\n  FAULT_MARK: " + mark_ + "\n"));
  }
  std::vector<pid_t> Alive() { return ProcessesWithEnv("FAULT_MARK=" + mark_); }
  bool WaitAlive(size_t n, int timeout_ms = 10000) {
    return WaitFor([&] { return Alive().size() >= n; }, timeout_ms);
  }
  bool WaitNoneAlive(int timeout_ms) {
    return WaitFor([&] { return Alive().empty(); }, timeout_ms);
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }

  Cluster c_;
  int worker_ = -1;
  std::string mark_;
};

INSTANTIATE_TEST_SUITE_P(Modes, WorkerFaultsTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Cgroups" : "NoCgroups";
                         });

TEST_P(WorkerFaultsTest, WorkerKilledTakesTheJobsChildAndSetsidGrandchild) {
  Start();
  // The work in a child of the job's shell, and in a setsid'd grandchild.
  int64_t a = SubmitScript("child", "sleep 300; echo done\n");
  int64_t b = SubmitScript("grandchild",
                           "sh -c 'setsid sleep 301 & sleep 302'; echo done\n");
  ASSERT_TRUE(c_.WaitState(a, "JOB_STATE_RUNNING")) << c_.Logs();
  ASSERT_TRUE(c_.WaitState(b, "JOB_STATE_RUNNING")) << c_.Logs();
  // sh, sleep; sh, sh, setsid sleep, sleep.
  ASSERT_TRUE(WaitAlive(6)) << Alive().size();
  c_.KillWorker(worker_, SIGKILL);
  EXPECT_TRUE(WaitNoneAlive(2000))
      << Alive().size() << " process(es) of the jobs outlived the worker by 2 s"
      << c_.Logs();
}

TEST_P(WorkerFaultsTest, CancelKillsForkedSetsidStoppedAndTermIgnoring) {
  Start({"--cancel-grace", "1s"});
  int64_t id = SubmitScript("escapes",
                            // A double fork whose grandchild setsids away.
                            "(setsid sh -c 'sleep 310' &)\n"
                            // A stopped process.
                            "sleep 311 &\n"
                            "kill -STOP $!\n"
                            // One that ignores SIGTERM (so do its children).
                            "sh -c \"trap '' TERM; sleep 312; sleep 313\" &\n"
                            "sleep 314\n");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING")) << c_.Logs();
  ASSERT_TRUE(WaitAlive(6)) << Alive().size();
  Result r = c_.Cli({"cancel", std::to_string(id)});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_CANCELLED", 15000)) << c_.Logs();
  // Cancelled means gone: nothing is left when the state says so.
  EXPECT_TRUE(Alive().empty()) << Alive().size() << " survived the cancel";
  // The TERM-ignoring ones outlived the grace; the diary names them.
  const std::string diary = Diary(id);
  EXPECT_NE(diary.find("stopping the job"), std::string::npos) << diary;
  EXPECT_NE(diary.find("left behind: "), std::string::npos) << diary;
}

TEST_P(WorkerFaultsTest, JobEndsOnlyWhenItsSetsidDaemonIsKilled) {
  Start();
  int64_t id = SubmitScript("daemon",
                            "setsid sh -c 'sleep 320; echo late' &\n"
                            "echo started\n"
                            "exit 0\n");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 20000)) << c_.Logs();
  EXPECT_TRUE(Alive().empty())
      << "the job was finished while its daemon still ran";
  const std::string diary = Diary(id);
  EXPECT_NE(diary.find("started"), std::string::npos) << diary;
  EXPECT_NE(diary.find("left behind"), std::string::npos) << diary;
  EXPECT_NE(diary.find("sleep"), std::string::npos) << diary;
}

// The worker and its guard both die (as in a machine's OOM kill); the
// restarted worker still finds a daemon that setsid'd and left the job's
// folder for "/".
TEST_P(WorkerFaultsTest, ChdirRootDaemonDoesNotSurviveAWorkerRestart) {
  Start();
  // The restarted worker no longer runs attempt 1, so the scheduler starts
  // attempt 2 at once: that one does nothing.
  int64_t id = SubmitScript("chdir",
                            "[ \"$DLBATCH_ATTEMPT\" = 1 ] || exit 0\n"
                            "(setsid sh -c 'cd /; exec sleep 330' &)\n"
                            "sleep 331\n");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING")) << c_.Logs();
  ASSERT_TRUE(WaitAlive(3)) << Alive().size();
  // The guard first (a child of the worker named dlbatch-guard).
  const pid_t worker_pid = c_.worker_pid(worker_);
  for (pid_t pid : ProcessesWithPpid(worker_pid)) {
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "dlbatch-guard") kill(pid, SIGKILL);
  }
  c_.KillWorker(worker_, SIGKILL);
  c_.RestartWorker(worker_);
  EXPECT_TRUE(WaitNoneAlive(5000))
      << Alive().size() << " process(es) survived the worker's restart"
      << c_.Logs();
}

// A worker stopped by SIGTERM (as systemd stops the unit) leaves only after
// its guard has ended: the guard must not outlive its worker's main
// process, or the service manager SIGKILLs it as a leftover of the unit.
// This test process becomes the subreaper of what the worker leaves, so a
// guard still running when the worker exited is reparented here.
TEST(WorkerStopTest, GuardEndsBeforeTheWorkerExits) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
  Cluster c;
  c.StartScheduler();
  const int w = c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1)) << c.Logs();
  int64_t id = c.Submit(c.JobFile("long.yaml", "command: [sleep, '300']\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING")) << c.Logs();
  pid_t guard = 0;
  for (pid_t pid : ProcessesWithPpid(c.worker_pid(w))) {
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "dlbatch-guard") guard = pid;
  }
  ASSERT_GT(guard, 0) << "no dlbatch-guard child of the worker";
  c.KillWorker(w, SIGTERM);  // returns once the worker has exited
  errno = 0;
  const pid_t r = waitpid(guard, nullptr, WNOHANG);
  EXPECT_TRUE(r < 0 && errno == ECHILD)
      << "the guard (pid " << guard << ") was left running when the worker "
      << "exited" << c.Logs();
  if (r == 0) waitpid(guard, nullptr, 0);
}

// The worker reconnects within 2 s of a restarted scheduler listening.
TEST(SchedulerRestartTest, WorkerReconnectsWithinTwoSeconds) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1)) << c.Logs();
  int64_t id = c.Submit(c.JobFile("long.yaml", "command: [sleep, '300']\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING")) << c.Logs();
  c.KillScheduler(SIGKILL);
  // Long enough for the worker's backoff to grow.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  c.StartScheduler();  // returns once the ready file is written
  const auto listening = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.WaitWorkers(1, 10000)) << c.Logs();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - listening)
                      .count();
  std::printf("worker back %lld ms after the scheduler listened\n",
              static_cast<long long>(ms));
  EXPECT_LE(ms, 2000) << "the worker took " << ms << " ms to reconnect"
                      << c.Logs();
}

}  // namespace
}  // namespace dlbatch::testing

namespace dlbatch::testing {
namespace {

// Two jobs' large outputs upload while a third job runs: it starts and ends
// at once instead of waiting for a transfer thread (the old worker had two,
// both taken by the large outputs).
TEST(TransfersTest, LargeOutputsOfTwoJobsDoNotDelayAThird) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 3);
  ASSERT_TRUE(c.WaitWorkers(1)) << c.Logs();
  const std::string big = c.JobFile("big.yaml",
                                    "command: [sh, -c, 'truncate -s 768M "
                                    "\"$DLBATCH_OUTPUT_DIR/big.bin\"']\n");
  int64_t a = c.Submit(big);
  int64_t b = c.Submit(big);
  // Both have exited and are uploading (they stay running until uploaded).
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadAll(c.dir() + "/worker-w1.log").find("job 2 (attempt 1)") !=
               std::string::npos;
      },
      10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(c.State(a), "JOB_STATE_RUNNING") << "uploaded too fast to test";
  ASSERT_EQ(c.State(b), "JOB_STATE_RUNNING") << "uploaded too fast to test";
  int64_t ok = c.Submit(c.JobFile("ok.yaml", "command: [echo, ok]\n"));
  EXPECT_TRUE(c.WaitState(ok, "JOB_STATE_FINISHED", 5000))
      << "a small job waited behind other jobs' uploads: " << c.State(ok)
      << c.Logs();
}

}  // namespace
}  // namespace dlbatch::testing
