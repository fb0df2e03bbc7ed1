// A preempted train job whose trainer does not stop within the profile's
// grace, through the real binaries: the worker kills it (SIGKILL) at the
// grace, the job is still queued again as preempted (uncounted), and its
// next attempt resumes from the checkpoint stored before the signal and
// ends with the model an uninterrupted run gives; the preempting job
// starts once the grace is over, nothing waits longer.
//
// The trainer is held in a ptrace stop while it is asked to stop: unlike
// SIGSTOP, which the worker's SIGCONT after its signal would end, no
// signal but SIGKILL ends that stop, so the trainer can neither take the
// request nor finish its step, however fast the machine (as a trainer hung
// in a step, or one whose step outlasts the grace).
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;
constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";
constexpr int kGraceS = 2;

// The threads of process `pid` (its /proc/PID/task).
std::set<pid_t> ThreadsOf(pid_t pid) {
  std::set<pid_t> tids;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    int tid = 0;
    if (absl::SimpleAtoi(e.path().filename().string(), &tid)) tids.insert(tid);
  }
  return tids;
}

// The parent of process `pid`; 0 if it has gone.
pid_t ParentOf(pid_t pid) {
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == npos) return 0;
  std::vector<std::string> f =
      absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  int ppid = 0;
  return f.size() > 1 && absl::SimpleAtoi(f[1], &ppid) ? ppid : 0;
}

// The dlbatch-train processes below process `ancestor`.
std::vector<pid_t> TrainersBelow(pid_t ancestor) {
  std::vector<pid_t> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    if (!absl::StrContains(ReadAll(e.path() / "cmdline"), "dlbatch-train"))
      continue;
    for (pid_t p = ParentOf(pid); p > 1; p = ParentOf(p)) {
      if (p == ancestor) {
        found.push_back(pid);
        break;
      }
    }
  }
  return found;
}

// Holds every thread of a process in a ptrace stop (see the file's
// comment). The thread that made it is the tracer: it alone calls the
// methods. Detaches, letting the process run on, when destroyed while the
// process lives.
class HeldProcess {
 public:
  HeldProcess() = default;
  HeldProcess(const HeldProcess&) = delete;
  HeldProcess& operator=(const HeldProcess&) = delete;
  ~HeldProcess() {
    for (pid_t tid : held_) ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
  }

  // Stops every thread of `pid` (those it starts meanwhile too); "" once
  // they are stopped, else why not (ptrace refused here).
  std::string Hold(pid_t pid) {
    // A thread started while the others are seized is found by the next
    // look, until one finds none.
    for (int look = 0; look < 5; ++look) {
      bool fresh = false;
      for (pid_t tid : ThreadsOf(pid)) {
        if (held_.count(tid) > 0) continue;
        fresh = true;
        if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
          if (errno == ESRCH) continue;  // it ended meanwhile
          return std::string("PTRACE_SEIZE: ") + std::strerror(errno);
        }
        held_.insert(tid);
        if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
          return std::string("PTRACE_INTERRUPT: ") + std::strerror(errno);
        }
        int status = 0;
        if (waitpid(tid, &status, __WALL) != tid || !WIFSTOPPED(status)) {
          return "thread " + std::to_string(tid) + " did not stop";
        }
      }
      if (!fresh) return "";
    }
    return "the process kept starting threads";
  }

  // Waits until every held thread has been killed, taking each one's last
  // report (the process's parent sees its end only once the tracer has).
  // A thread's other reports (a clone, a signal's arrival) are answered by
  // keeping it stopped. False if any lives on after `timeout_ms`.
  bool WaitKilled(int timeout_ms) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(timeout_ms);
    while (!held_.empty()) {
      for (auto it = held_.begin(); it != held_.end();) {
        int status = 0;
        const pid_t got = waitpid(*it, &status, __WALL | WNOHANG);
        if ((got == *it && (WIFEXITED(status) || WIFSIGNALED(status))) ||
            (got < 0 && errno == ECHILD)) {
          it = held_.erase(it);
        } else {
          ++it;
        }
      }
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

 private:
  std::set<pid_t> held_;
};

class PreemptGraceTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kDataDir) +
                                 "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << kDataDir
                   << " (Debian's dataset-fashion-mnist)";
    }
    setenv("XDG_CACHE_HOME", (c_.dir() + "/cache").c_str(), 1);
    const std::string yaml = c_.dir() + "/scheduler.yaml";
    WriteAll(yaml, "profiles:\n  t: {preemption: {mode: priority, grace: " +
                       std::to_string(kGraceS) + "s, min_run: 0}}\n");
    c_.StartScheduler({"--config", yaml});
    c_.StartWorker("w", 1, "t");
    ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
  }
  void TearDown() override { unsetenv("XDG_CACHE_HOME"); }

  // Every job is named "lenet": the model's graph carries the name.
  int64_t Lenet(const std::string& file) {
    return c_.Submit(c_.JobFile(
        file + ".yaml", LenetJob(kDataDir, R"(    mini_batch_size: 64
    max_iterations: 400
    verbose_frequency: 50
    checkpoint_frequency: 100
    checkpoint_frequency_unit: iteration
)",
                                 "name: lenet\npool: 1\nprofile: t\n")));
  }
  int64_t Progress(int64_t id, const char* key) {
    return JsonInt(c_.ShowJson(id).value("progress", nlohmann::json()), key);
  }
  std::string ModelSha(int64_t id) {
    const std::string out = c_.dir() + "/out-" + std::to_string(id);
    Result fetch =
        c_.Cli({"fetch-outputs", std::to_string(id), "--output", out});
    EXPECT_EQ(fetch.code, 0) << fetch.err;
    Result sha = Exec({"sha256sum", out + "/model.onnx"});
    return sha.out.substr(0, 64);
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }

  Cluster c_;
};

TEST_F(
    PreemptGraceTrain,
    ATrainerThatDoesNotStopWithinTheGraceIsKilledAndResumesFromItsCheckpoint) {
  const int64_t reference = Lenet("reference");
  ASSERT_EQ(c_.Cli({"wait", std::to_string(reference)}, {}, 180000).code, 0)
      << Diary(reference) << c_.Logs();
  const std::string want = ModelSha(reference);
  ASSERT_EQ(want.size(), 64u);

  const int64_t a = Lenet("a");
  // A checkpoint stored, and the run past it: the kill loses those steps.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Progress(a, "checkpoint_iteration") >= 100 &&
               Progress(a, "iteration") > Progress(a, "checkpoint_iteration");
      },
      120000))
      << Diary(a) << c_.Logs();
  const std::vector<pid_t> trainers = TrainersBelow(c_.worker_pid(0));
  ASSERT_EQ(trainers.size(), 1u) << "one trainer process for a pool-1 job";
  HeldProcess held;
  if (const std::string why = held.Hold(trainers[0]); !why.empty()) {
    GTEST_SKIP() << "cannot hold the trainer in a ptrace stop here: " << why;
  }
  // What the trainer said before it was held reaches the scheduler.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t stored = Progress(a, "checkpoint_iteration");

  const int64_t h =
      c_.Submit(c_.JobFile("high.yaml", "profile: t\ncommand: [echo, high]\n"),
                {"--priority", "10"});
  // Killed at the grace: the trainer's threads end, and their ends reach
  // the worker through this tracer.
  ASSERT_TRUE(held.WaitKilled((kGraceS + 30) * 1000))
      << "the worker did not kill a trainer that ignored its stop request"
      << Diary(a) << c_.Logs();
  ASSERT_TRUE(c_.WaitState(h, "JOB_STATE_FINISHED", 60000)) << c_.Logs();
  ASSERT_EQ(c_.Cli({"wait", std::to_string(a)}, {}, 180000).code, 0)
      << Diary(a) << c_.Logs();

  const nlohmann::json j = c_.ShowJson(a);
  ASSERT_EQ(j["preemptions"].size(), 1u) << j.dump();
  const nlohmann::json& p = j["preemptions"][0];
  EXPECT_EQ(JsonInt(p, "by_job"), h);
  EXPECT_TRUE(p.value("done", false)) << p.dump();
  // Queued again as preempted, from the checkpoint stored before the
  // signal; not counted against its attempts.
  EXPECT_EQ(j.value("attempt", 0), 2) << j.dump();
  EXPECT_EQ(JsonInt(p, "resume_iteration"), stored) << p.dump();
  // The steps since that checkpoint are lost.
  EXPECT_GT(p.value("lost_s", 0.0), 0.0) << p.dump();
  // The preempting job waited for the kill at the grace, and no longer.
  const int64_t started = JsonTimeMs(c_.ShowJson(h)["start_time"]);
  std::cout << "[ measured ] preemption to the preempting job's start: "
            << started - JsonTimeMs(p["time"]) << " ms (grace " << kGraceS
            << " s), resumed from iteration " << stored << "\n";
  EXPECT_GE(started, JsonTimeMs(p["time"]) + kGraceS * 1000 - 500) << p.dump();
  EXPECT_LT(started, JsonTimeMs(p["time"]) + kGraceS * 1000 + 10000)
      << p.dump();
  const std::string diary = Diary(a);
  EXPECT_EQ(diary.find("on request (preempted)"), npos)
      << "the held trainer stopped by itself\n"
      << diary;
  EXPECT_NE(diary.find("checkpointing and stopping (SIGUSR1; killed in " +
                       std::to_string(kGraceS) + "s"),
            npos)
      << diary;
  EXPECT_NE(diary.find("resuming from the stored checkpoint at iteration " +
                       std::to_string(stored)),
            npos)
      << diary;
  EXPECT_EQ(ModelSha(a), want)
      << "the resumed run ended with another model than an uninterrupted run";
}

}  // namespace
}  // namespace dlbatch::testing
