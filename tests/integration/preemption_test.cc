// Preemption through the real binaries: a more urgent job takes the slots
// of running jobs (by priority, or a fair-share reclaim), the victims get
// their signal, are killed at the grace if they ignore it, and are queued
// again as preempted (not counted against --max-attempts); jobs that may
// not be taken (preemptible: false, inside min_run, a profile with
// preemption off) never are; a scheduler or worker killed in the middle
// loses nothing and runs nothing twice; a job spanning workers is stopped
// on all of them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;
constexpr int kNobody = 65534;

// Profiles: p preempts by priority at once (grace 3s, no min_run), f by
// fair share, m only after an hour's run, n's jobs are not preemptible
// unless they say, o preempts nothing.
constexpr char kProfiles[] =
    "profiles:\n"
    "  p: {preemption: {mode: priority, grace: 3s, min_run: 0}}\n"
    "  f: {preemption: {mode: fair_share, grace: 3s, min_run: 0}}\n"
    "  g: {preemption: {mode: priority, grace: 3s, min_run: 0}}\n"
    "  m: {preemption: {mode: priority, grace: 3s, min_run: 1h}}\n"
    "  n: {preemption: {mode: priority, grace: 3s, min_run: 0, preemptible: "
    "false}}\n"
    "  o: {max_pool: 0}\n";

// A command job that says it is ready once its TERM trap is set, and exits
// at once on TERM, saying so.
constexpr char kStopsOnTerm[] =
    "command: [sh, -c, 'trap \"echo part $DLBATCH_PART got TERM; exit 143\" "
    "TERM; echo ready $DLBATCH_ATTEMPT; sleep 300 & wait']\n";
// One that ignores TERM (sleep inherits the ignored signal).
constexpr char kIgnoresTerm[] =
    "command: [sh, -c, 'trap \"\" TERM; echo ready $DLBATCH_ATTEMPT; sleep "
    "300']\n";

class PreemptionTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    const std::string yaml = c_.dir() + "/scheduler.yaml";
    WriteAll(yaml, kProfiles);
    std::vector<std::string> flags = {"--config", yaml};
    flags.insert(flags.end(), extra.begin(), extra.end());
    flags_ = flags;
    c_.StartScheduler(flags);
  }
  // A one-slot worker of profile p running a job that ignores TERM.
  void StartWithAVictimThatIgnoresTerm(int64_t* low) {
    Start();
    c_.StartWorker("w1", 1, "p");
    ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
    *low = c_.Submit(Job("low.yaml", kIgnoresTerm), {"--profile", "p"});
    ASSERT_TRUE(WaitDiary(*low, "ready 1")) << c_.Logs();
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }
  bool WaitDiary(int64_t id, const std::string& text, int timeout_ms = 30000) {
    return WaitFor([&] { return Diary(id).find(text) != npos; }, timeout_ms);
  }
  bool WaitRunningAttempt(int64_t id, int attempt, int timeout_ms = 30000) {
    return WaitFor(
        [&] {
          const nlohmann::json j = c_.ShowJson(id);
          return j.value("attempt", 0) == attempt &&
                 j.value("state", "") == "running";
        },
        timeout_ms);
  }
  std::string Job(const std::string& name, const std::string& yaml) {
    const std::string file = c_.JobFile(name, yaml);
    EXPECT_EQ(chmod(file.c_str(), 0644), 0);
    return file;
  }

  Cluster c_;
  std::vector<std::string> flags_;
};

TEST_F(PreemptionTest, APriorityJobTakesTheSlotsAndTheVictimIsQueuedAgain) {
  const int port = FreePort();
  Start({"--max-attempts", "2", "--metrics-listen",
         "127.0.0.1:" + std::to_string(port)});
  c_.StartWorker("w1", 2, "p");
  ASSERT_TRUE(c_.WaitWorkers(1)) << c_.Logs();
  const int64_t low = c_.Submit(Job("low.yaml", kStopsOnTerm),
                                {"--pool", "2", "--profile", "p"});
  ASSERT_TRUE(WaitDiary(low, "ready 1")) << c_.Logs();
  const int64_t high =
      c_.Submit(Job("high.yaml", "command: [echo, high]\n"),
                {"--pool", "2", "--priority", "10", "--profile", "p"});
  ASSERT_TRUE(c_.WaitState(high, "JOB_STATE_FINISHED")) << c_.Logs();
  // The victim exited on TERM: the job started at once, not at the grace.
  const nlohmann::json h = c_.ShowJson(high);
  nlohmann::json l = c_.ShowJson(low);
  ASSERT_EQ(l["preemptions"].size(), 1u) << l.dump();
  const nlohmann::json& p = l["preemptions"][0];
  EXPECT_EQ(JsonInt(p, "by_job"), high);
  EXPECT_EQ(p.value("by_priority", -1), 10);
  EXPECT_EQ(p.value("kind", ""), "priority");
  EXPECT_EQ(p.value("attempt", 0), 1);
  EXPECT_TRUE(p.value("done", false));
  EXPECT_LT(JsonTimeMs(h["start_time"]), JsonTimeMs(p["deadline"]))
      << h.dump() << p.dump();
  EXPECT_EQ(h.value("attempt", 0), 1);
  const std::string diary = Diary(low);
  EXPECT_NE(diary.find("part 0 got TERM"), npos) << diary;
  // The scheduler's decision, and the worker's signal.
  const std::string by =
      "preempted by job " + std::to_string(high) + " (priority 10): ";
  EXPECT_NE(diary.find(by + "attempt 1 is stopped (within 3s) and the job is "
                            "queued again"),
            npos)
      << diary;
  EXPECT_NE(diary.find(by + "sending SIGTERM (killed in 3s"), npos) << diary;
  EXPECT_NE(diary.find("a preemption does not count against its 2 attempts"),
            npos)
      << diary;
  ASSERT_TRUE(WaitRunningAttempt(low, 2)) << c_.ShowJson(low).dump();
  const std::string show = c_.Cli({"show", std::to_string(low)}).out;
  EXPECT_NE(show.find("  Preempted:  preempted by job " + std::to_string(high) +
                      " (priority 10) at "),
            npos)
      << show;
  bool requeued = false;
  l = c_.ShowJson(low);
  for (const auto& e : l["history"]) {
    requeued =
        requeued || (e.value("state", "") == "queued" &&
                     e.value("reason", "").find("preempted by job") == 0);
  }
  EXPECT_TRUE(requeued) << c_.ShowJson(low).dump();
  const std::string scrape = Get(port, "/metrics").body;
  EXPECT_EQ(
      Sample(scrape,
             "dlbatch_preemptions_total{kind=\"priority\",profile=\"p\"}"),
      1)
      << scrape;
  EXPECT_GE(Sample(scrape,
                   "dlbatch_preempted_work_lost_seconds_total{profile=\"p\"}"),
            0)
      << scrape;

  // Attempt 2 is the second start but the first counted: a worker lost now
  // queues it again (attempt 2 of 2 next), where a counted one would fail.
  ASSERT_TRUE(WaitDiary(low, "ready 2")) << c_.Logs();
  c_.KillWorker(0, SIGKILL);
  c_.RestartWorker(0);
  ASSERT_TRUE(WaitRunningAttempt(low, 3, 60000))
      << c_.ShowJson(low).dump() << Diary(low);
  EXPECT_NE(Diary(low).find("job requeued (attempt 2 of 2 next)"), npos)
      << Diary(low);
}

TEST_F(PreemptionTest, AVictimThatIgnoresTheSignalIsKilledAtTheGrace) {
  int64_t low = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithAVictimThatIgnoresTerm(&low));
  const int64_t high = c_.Submit(Job("high.yaml", "command: [echo, high]\n"),
                                 {"--priority", "5", "--profile", "p"});
  // While it stops, the waiting job says what it is doing.
  std::string reason;
  ASSERT_TRUE(WaitFor(
      [&] {
        reason = c_.ShowJson(high).value("wait_reason", "");
        return reason.find("preempting") != npos;
      },
      10000))
      << reason << c_.Logs();
  EXPECT_EQ(reason, "preempting job " + std::to_string(low) +
                        " (checkpointing; at most 3s)");
  // The victim's NOTE says it is stopping, and for whom.
  const std::string jobs = c_.Cli({"jobs"}).out;
  EXPECT_NE(
      jobs.find("preempted by job " + std::to_string(high) + ": stopping"),
      npos)
      << jobs;
  ASSERT_TRUE(c_.WaitState(high, "JOB_STATE_FINISHED")) << c_.Logs();
  const nlohmann::json p = c_.ShowJson(low)["preemptions"][0];
  const int64_t started = JsonTimeMs(c_.ShowJson(high)["start_time"]);
  // Killed at the grace, not before.
  EXPECT_GE(started, JsonTimeMs(p["time"]) + 2500) << p.dump();
  ASSERT_TRUE(WaitRunningAttempt(low, 2)) << c_.ShowJson(low).dump();
}

TEST_F(PreemptionTest, JobsThatMayNotBeTakenAreNeverTouched) {
  Start();
  c_.StartWorker("wp", 1, "p");
  c_.StartWorker("wm", 1, "m");
  c_.StartWorker("wn", 1, "n");
  c_.StartWorker("wo", 1, "o");
  ASSERT_TRUE(c_.WaitWorkers(4)) << c_.Logs();
  const std::string sleeper = "command: [sleep, '300']\n";
  const int64_t kept = c_.Submit(
      Job("kept.yaml", sleeper + "preemptible: false\n"), {"--profile", "p"});
  const int64_t young =
      c_.Submit(Job("young.yaml", sleeper), {"--profile", "m"});
  const int64_t by_default =
      c_.Submit(Job("default.yaml", sleeper), {"--profile", "n"});
  const int64_t off = c_.Submit(Job("off.yaml", sleeper), {"--profile", "o"});
  for (int64_t id : {kept, young, by_default, off}) {
    ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING")) << c_.Logs();
  }
  std::vector<int64_t> urgent;
  for (const char* profile : {"p", "m", "n", "o"}) {
    urgent.push_back(c_.Submit(Job("urgent.yaml", "command: [echo, urgent]\n"),
                               {"--priority", "10", "--profile", profile}));
  }
  // Passes run with every heartbeat: several go by.
  sleep(4);
  for (int64_t id : {kept, young, by_default, off}) {
    const nlohmann::json j = c_.ShowJson(id);
    EXPECT_EQ(j.value("state", ""), "running") << j.dump();
    EXPECT_EQ(j.value("attempt", 0), 1) << j.dump();
    EXPECT_TRUE(j["preemptions"].empty()) << j.dump();
  }
  for (int64_t id : urgent) {
    const nlohmann::json j = c_.ShowJson(id);
    EXPECT_EQ(j.value("state", ""), "queued") << j.dump();
    EXPECT_EQ(j.value("wait_reason", "").find("preempting"), npos) << j.dump();
  }
}

TEST_F(PreemptionTest, AUserBelowTheirFairShareReclaimsAtEqualPriority) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to submit as another user (setpriv)";
  }
  ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
  Start({"--socket-mode", "0666"});
  c_.StartWorker("wf", 1, "f");
  c_.StartWorker("wg", 1, "g");
  ASSERT_TRUE(c_.WaitWorkers(2)) << c_.Logs();
  // Root's jobs hold both profiles' slots and build up usage.
  const int64_t root_f =
      c_.Submit(Job("root-f.yaml", kStopsOnTerm), {"--profile", "f"});
  const int64_t root_g =
      c_.Submit(Job("root-g.yaml", kStopsOnTerm), {"--profile", "g"});
  ASSERT_TRUE(WaitDiary(root_f, "ready 1")) << c_.Logs();
  ASSERT_TRUE(WaitDiary(root_g, "ready 1")) << c_.Logs();
  sleep(2);
  auto submit_as_nobody = [&](const std::string& profile) -> int64_t {
    std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups"};
    for (const std::string& a :
         c_.CliArgv({"submit", "-q",
                     Job("nobody-" + profile + ".yaml",
                         "command: [echo, from nobody]\n"),
                     "--profile", profile})) {
      argv.push_back(a);
    }
    Result r =
        Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? std::stoll(r.out) : -1;
  };
  const int64_t theirs_f = submit_as_nobody("f");
  const int64_t theirs_g = submit_as_nobody("g");
  ASSERT_TRUE(c_.WaitState(theirs_f, "JOB_STATE_FINISHED")) << c_.Logs();
  const nlohmann::json j = c_.ShowJson(root_f);
  ASSERT_EQ(j["preemptions"].size(), 1u) << j.dump();
  EXPECT_EQ(j["preemptions"][0].value("kind", ""), "reclaim");
  EXPECT_EQ(JsonInt(j["preemptions"][0], "by_job"), theirs_f);
  EXPECT_NE(Diary(root_f).find("(a fair-share reclaim at priority 0)"), npos)
      << Diary(root_f);
  ASSERT_TRUE(WaitRunningAttempt(root_f, 2)) << c_.ShowJson(root_f).dump();
  // Priority mode: equal priority takes nothing, whatever the shares.
  EXPECT_EQ(c_.State(theirs_g), "JOB_STATE_QUEUED");
  EXPECT_TRUE(c_.ShowJson(root_g)["preemptions"].empty());
  EXPECT_EQ(c_.ShowJson(root_g).value("attempt", 0), 1);
}

TEST_F(PreemptionTest,
       ASchedulerKilledMidPreemptionResumesItAndRunsNothingTwice) {
  int64_t low = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithAVictimThatIgnoresTerm(&low));
  const int64_t high =
      c_.Submit(Job("high.yaml", "command: [sh, -c, 'echo high run']\n"),
                {"--priority", "10", "--profile", "p"});
  ASSERT_TRUE(WaitDiary(low, "preempted by job")) << c_.Logs();
  c_.KillScheduler(SIGKILL);
  c_.StartScheduler(flags_);
  ASSERT_TRUE(c_.WaitState(high, "JOB_STATE_FINISHED", 60000)) << c_.Logs();
  ASSERT_TRUE(WaitRunningAttempt(low, 2)) << c_.ShowJson(low).dump();
  const nlohmann::json h = c_.ShowJson(high);
  EXPECT_EQ(h.value("attempt", 0), 1) << h.dump();
  const std::string ran = Diary(high);
  EXPECT_EQ(ran.find("high run"), ran.rfind("high run")) << ran;
  const nlohmann::json l = c_.ShowJson(low);
  ASSERT_EQ(l["preemptions"].size(), 1u) << l.dump();
  EXPECT_TRUE(l["preemptions"][0].value("done", false));
}

TEST_F(PreemptionTest, AWorkerLostWhileStoppingQueuesThePreemptedJobAgain) {
  int64_t low = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithAVictimThatIgnoresTerm(&low));
  const int64_t high = c_.Submit(Job("high.yaml", "command: [echo, high]\n"),
                                 {"--priority", "10", "--profile", "p"});
  ASSERT_TRUE(WaitDiary(low, "preempted by job")) << c_.Logs();
  c_.KillWorker(0, SIGKILL);
  c_.RestartWorker(0);
  ASSERT_TRUE(c_.WaitState(high, "JOB_STATE_FINISHED", 60000)) << c_.Logs();
  ASSERT_TRUE(WaitRunningAttempt(low, 2)) << c_.ShowJson(low).dump();
  EXPECT_NE(Diary(low).find("restarted without the job while attempt 1 was "
                            "stopping, preempted by job"),
            npos)
      << Diary(low);
  EXPECT_TRUE(c_.ShowJson(low)["preemptions"][0].value("done", false));
}

TEST_F(PreemptionTest, AJobSpanningTwoWorkersIsStoppedOnBoth) {
  Start();
  c_.StartWorker("w1", 1, "p");
  c_.StartWorker("w2", 1, "p");
  ASSERT_TRUE(c_.WaitWorkers(2)) << c_.Logs();
  const int64_t low =
      c_.Submit(Job("low.yaml", kStopsOnTerm),
                {"--pool", "2", "--max-nodes", "2", "--profile", "p"});
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string d = Diary(low);
        return d.find("ready") != d.rfind("ready");
      },
      30000))
      << c_.Logs();
  const int64_t high = c_.Submit(Job("high.yaml", "command: [echo, high]\n"),
                                 {"--pool", "2", "--max-nodes", "2",
                                  "--priority", "10", "--profile", "p"});
  ASSERT_TRUE(c_.WaitState(high, "JOB_STATE_FINISHED")) << c_.Logs();
  const std::string diary = Diary(low);
  EXPECT_NE(diary.find("part 0 got TERM"), npos) << diary;
  EXPECT_NE(diary.find("part 1 got TERM"), npos) << diary;
  ASSERT_EQ(c_.ShowJson(low)["preemptions"].size(), 1u);
  ASSERT_TRUE(WaitRunningAttempt(low, 2)) << c_.ShowJson(low).dump();
}

}  // namespace
}  // namespace dlbatch::testing
