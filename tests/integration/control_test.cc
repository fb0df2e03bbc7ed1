// Worker administration and job control through the real binaries: drain,
// resume and remove a worker, lost workers forgotten after
// --forget-offline-after with the queued jobs that can then never run
// failed; hold, release, requeue and submit --after; each kept across a
// scheduler restart.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;

std::string WorkerOf(Cluster& c, int64_t id) {
  const nlohmann::json job = c.ShowJson(id);
  if (!job.contains("placement") || job["placement"].empty()) return "";
  return job["placement"][0].value("worker_name", "");
}

std::string Field(Cluster& c, int64_t id, const char* key) {
  return c.ShowJson(id).value(key, "");
}

void Restart(Cluster& c, std::vector<std::string> flags, int workers) {
  c.KillScheduler(SIGKILL);
  c.StartScheduler(std::move(flags));
  ASSERT_TRUE(c.WaitWorkers(workers)) << c.Logs();
}

TEST(Control, DrainKeepsNewJobsOffAWorkerAcrossARestartUntilResumed) {
  Cluster c;
  const std::vector<std::string> flags = {"--heartbeat-interval", "200ms"};
  c.StartScheduler(flags);
  c.StartWorker("w1", 2);
  c.StartWorker("w2", 2);
  ASSERT_TRUE(c.WaitWorkers(2));
  const std::string sleep =
      c.JobFile("sleep.yaml", "command: [sleep, '300']\n");
  const int64_t a = c.Submit(sleep);
  ASSERT_TRUE(c.WaitState(a, "JOB_STATE_RUNNING")) << c.Logs();
  const std::string x = WorkerOf(c, a);
  const std::string y = x == "w1" ? "w2" : "w1";

  Result drain = c.Cli({"admin", "drain", x, "--reason", "new fans"});
  ASSERT_EQ(drain.code, 0) << drain.err;
  EXPECT_NE(drain.out.find("draining: new fans; still running job"), npos)
      << drain.out;
  Result workers = c.Cli({"workers"});
  EXPECT_NE(workers.out.find("draining (new fans)"), npos) << workers.out;
  Result monitor = c.Cli({"monitor", "--once"});
  EXPECT_NE(monitor.out.find("draining (new fans)"), npos) << monitor.out;
  // Best fit would put a pool-1 job beside job a; the drained worker takes
  // none, and the running job goes on.
  const int64_t b = c.Submit(sleep);
  ASSERT_TRUE(c.WaitState(b, "JOB_STATE_RUNNING")) << c.Logs();
  EXPECT_EQ(WorkerOf(c, b), y);
  EXPECT_EQ(c.State(a), "JOB_STATE_RUNNING");
  // Submit counts the drained worker (jobs queue for it), not more.
  Result big = c.Cli({"submit", "--pool", "5", sleep});
  EXPECT_NE(big.code, 0);
  EXPECT_NE(big.err.find("pool 5 exceeds profile 'local' (4 slots on 2 "
                         "workers)"),
            npos)
      << big.err;
  // A connected worker is removed only once drained and idle.
  Result busy = c.Cli({"admin", "remove", x});
  EXPECT_NE(busy.code, 0);
  EXPECT_NE(busy.err.find("still runs job " + std::to_string(a)), npos)
      << busy.err;
  Result undrained = c.Cli({"admin", "remove", y});
  EXPECT_NE(undrained.err.find("drain it first (dlbatch admin drain " + y),
            npos)
      << undrained.err;

  Restart(c, flags, 2);
  workers = c.Cli({"workers"});
  EXPECT_NE(workers.out.find("draining (new fans)"), npos) << workers.out;
  const int64_t d = c.Submit(sleep);
  ASSERT_TRUE(c.WaitState(d, "JOB_STATE_RUNNING")) << c.Logs();
  EXPECT_EQ(WorkerOf(c, d), y);
  const int64_t e = c.Submit(sleep);  // y is full; x is drained
  ASSERT_TRUE(
      WaitFor([&] { return !Field(c, e, "wait_reason").empty(); }, 5000));
  EXPECT_EQ(c.State(e), "JOB_STATE_QUEUED");

  Result resume = c.Cli({"admin", "resume", x});
  ASSERT_EQ(resume.code, 0) << resume.err;
  EXPECT_NE(resume.out.find("' online"), npos) << resume.out;
  ASSERT_TRUE(c.WaitState(e, "JOB_STATE_RUNNING")) << c.Logs();
  EXPECT_EQ(WorkerOf(c, e), x);
  Result unknown = c.Cli({"admin", "drain", "nope"});
  EXPECT_NE(unknown.err.find("no worker 'nope'"), npos) << unknown.err;
}

TEST(Control, RemovedAndForgottenWorkersLeaveTheirProfileAndFailJobs) {
  Cluster c;
  c.StartScheduler({"--heartbeat-interval", "200ms", "--heartbeat-timeout",
                    "1s", "--forget-offline-after", "3s"});
  c.StartWorker("w1", 2);
  c.StartWorker("w2", 2);
  c.StartWorker("w3", 2);
  ASSERT_TRUE(c.WaitWorkers(3));
  const std::string sleep =
      c.JobFile("sleep.yaml", "command: [sleep, '300']\n");
  // Each worker busy; then jobs that need two and three workers wait.
  int64_t on_w3 = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t id = c.Submit(sleep, {"--pool", "2"});
    ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING")) << c.Logs();
    if (WorkerOf(c, id) == "w3") on_w3 = id;
  }
  ASSERT_NE(on_w3, 0);
  const std::string wide =
      c.JobFile("wide.yaml", "command: [sleep, '1']\nmax_nodes: 3\n");
  const int64_t six = c.Submit(wide, {"--pool", "6"});
  const int64_t four = c.Submit(wide, {"--pool", "4"});
  EXPECT_EQ(c.State(six), "JOB_STATE_QUEUED");

  // w3 dies: once lost (its job is requeued), submit no longer counts it.
  c.KillWorker(2, SIGKILL);
  ASSERT_TRUE(c.WaitState(on_w3, "JOB_STATE_QUEUED", 10000)) << c.Logs();
  Result refused = c.Cli({"submit", "--pool", "6", wide});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("pool 6 exceeds profile 'local' (4 slots on 2 "
                             "online workers; 'w3' is offline since "),
            npos)
      << refused.err;
  EXPECT_NE(refused.err.find("use --pool 4, or wait for w3 to return"), npos)
      << refused.err;
  EXPECT_EQ(c.State(six), "JOB_STATE_QUEUED");  // w3 may come back

  // Removed by hand: the pool-6 job can never run and fails, saying why.
  Result removed = c.Cli({"admin", "remove", "w3"});
  ASSERT_EQ(removed.code, 0) << removed.err;
  EXPECT_NE(removed.out.find("failed 1 queued job(s) that can no longer run: " +
                             std::to_string(six)),
            npos)
      << removed.out;
  EXPECT_EQ(c.State(six), "JOB_STATE_FAILED");
  EXPECT_NE(Field(c, six, "reason")
                .find("can never start: pool 6 exceeds profile 'local' (4 "
                      "slots on 2 workers)"),
            npos)
      << Field(c, six, "reason");
  EXPECT_EQ(c.State(four), "JOB_STATE_QUEUED");
  EXPECT_EQ(c.Cli({"workers"}).out.find("w3"), npos);

  // w2 dies and is forgotten by itself after --forget-offline-after; the
  // pool-4 job then fails too.
  c.KillWorker(1, SIGKILL);
  ASSERT_TRUE(c.WaitState(four, "JOB_STATE_FAILED", 20000)) << c.Logs();
  EXPECT_NE(Field(c, four, "reason").find("--forget-offline-after"), npos)
      << Field(c, four, "reason");
  Result workers = c.Cli({"workers"});
  EXPECT_EQ(workers.out.find("w2"), npos) << workers.out;
}

TEST(Control, HoldReleaseAndRequeueSurviveARestart) {
  Cluster c;
  ASSERT_EQ(chmod(c.dir().c_str(), 0711), 0);
  const std::vector<std::string> flags = {"--socket-mode", "0666"};
  c.StartScheduler(flags);
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  const int64_t blocker = c.Submit(
      c.JobFile("sleep.yaml", "command: [sleep, '300']\n"), {"--pool", "2"});
  ASSERT_TRUE(c.WaitState(blocker, "JOB_STATE_RUNNING")) << c.Logs();
  const int64_t held =
      c.Submit(c.JobFile("echo.yaml", "command: [echo, released]\n"));
  const std::string id = std::to_string(held);
  Result hold = c.Cli({"hold", id});
  ASSERT_EQ(hold.code, 0) << hold.err;
  EXPECT_EQ(hold.out, "job " + id + " held\n");
  // Another user may not touch it.
  auto nobody = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups"};
    for (const std::string& a : c.CliArgv(args)) argv.push_back(a);
    return Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
  };
  Result other = nobody({"release", id});
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.err.find("permission denied: job " + id), npos) << other.err;
  // Workers are the admins' to drain.
  Result drain = nobody({"admin", "drain", "w1"});
  EXPECT_NE(drain.code, 0);
  EXPECT_NE(drain.err.find("permission denied: draining workers is for "
                           "admins"),
            npos)
      << drain.err;

  Result cancel = c.Cli({"cancel", std::to_string(blocker)});
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  ASSERT_TRUE(c.WaitState(blocker, "JOB_STATE_CANCELLED")) << c.Logs();
  Restart(c, flags, 1);
  EXPECT_EQ(c.State(held), "JOB_STATE_QUEUED");
  EXPECT_EQ(Field(c, held, "wait_reason"),
            "held; `dlbatch release " + id + "` lets it start");
  Result jobs = c.Cli({"jobs"});
  EXPECT_NE(jobs.out.find(" held "), npos) << jobs.out;
  Result show = c.Cli({"show", id});
  EXPECT_NE(show.out.find("State:      held"), npos) << show.out;
  Result release = c.Cli({"release", id});
  ASSERT_EQ(release.code, 0) << release.err;
  ASSERT_TRUE(c.WaitState(held, "JOB_STATE_FINISHED")) << c.Logs();
  Result again = c.Cli({"release", id});
  EXPECT_NE(again.err.find("has already finished"), npos) << again.err;

  // Requeue of a running job: stopped, queued again, a new attempt.
  const int64_t run = c.Submit(c.JobFile(
      "attempts.yaml",
      "command: [sh, -c, 'echo attempt $DLBATCH_ATTEMPT; sleep 300']\n"));
  ASSERT_TRUE(c.WaitState(run, "JOB_STATE_RUNNING")) << c.Logs();
  Result requeue = c.Cli({"requeue", std::to_string(run)});
  ASSERT_EQ(requeue.code, 0) << requeue.err;
  ASSERT_TRUE(WaitFor(
      [&] {
        const nlohmann::json j = c.ShowJson(run);
        return j.value("attempt", 0) == 2 && j.value("state", "") == "running";
      },
      30000))
      << c.ShowJson(run).dump() << c.Logs();
  Result diary = c.Cli({"diary", std::to_string(run)});
  EXPECT_NE(diary.out.find("requeue requested"), npos) << diary.out;
  EXPECT_NE(diary.out.find("job requeued by request"), npos) << diary.out;

  // Requeue of a failed job: queued again and run as attempt 2.
  const int64_t fails =
      c.Submit(c.JobFile("fail.yaml", "command: [sh, -c, 'exit 3']\n"));
  ASSERT_TRUE(c.WaitState(fails, "JOB_STATE_FAILED")) << c.Logs();
  ASSERT_EQ(c.Cli({"requeue", std::to_string(fails)}).code, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        const nlohmann::json j = c.ShowJson(fails);
        return j.value("attempt", 0) == 2 && j.value("state", "") == "failed";
      },
      30000))
      << c.ShowJson(fails).dump();
  const int64_t done = c.Submit(c.JobFile("ok.yaml", "command: [echo, ok]\n"));
  ASSERT_TRUE(c.WaitState(done, "JOB_STATE_FINISHED"));
  Result finished = c.Cli({"requeue", std::to_string(done)});
  EXPECT_NE(finished.err.find("finished well"), npos) << finished.err;
}

TEST(Control, AfterStartsOnlyOnceItsJobsFinishedWell) {
  Cluster c;
  const std::vector<std::string> flags;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  const int64_t first =
      c.Submit(c.JobFile("first.yaml", "command: [sleep, '3']\n"));
  ASSERT_TRUE(c.WaitState(first, "JOB_STATE_RUNNING"));
  const std::string f = std::to_string(first);
  const int64_t next = c.Submit(
      c.JobFile("next.yaml", "command: [echo, next]\n"), {"--after", f});
  EXPECT_EQ(c.State(next), "JOB_STATE_QUEUED");
  EXPECT_EQ(Field(c, next, "wait_reason"),
            "waiting for job #" + f + " (running) to finish (--after)");
  // Across a restart too.
  Restart(c, flags, 1);
  ASSERT_TRUE(c.WaitState(first, "JOB_STATE_FINISHED")) << c.Logs();
  ASSERT_TRUE(c.WaitState(next, "JOB_STATE_FINISHED")) << c.Logs();
  EXPECT_GE(JsonInt(c.ShowJson(next), "start_time_ms"),
            JsonInt(c.ShowJson(first), "end_time_ms"));

  // One that fails fails the jobs after it, in turn.
  const int64_t bad =
      c.Submit(c.JobFile("bad.yaml", "command: [sh, -c, 'sleep 1; exit 4']\n"));
  const std::string b = std::to_string(bad);
  const int64_t second =
      c.Submit(c.JobFile("second.yaml", "command: [echo, never]\n"),
               {"--after", b + "," + f});
  const int64_t third =
      c.Submit(c.JobFile("third.yaml", "command: [echo, never]\n"),
               {"--after", std::to_string(second)});
  ASSERT_TRUE(c.WaitState(second, "JOB_STATE_FAILED")) << c.Logs();
  ASSERT_TRUE(c.WaitState(third, "JOB_STATE_FAILED")) << c.Logs();
  EXPECT_NE(Field(c, second, "reason")
                .find("job " + b + " it was to start after (--after) failed"),
            npos)
      << Field(c, second, "reason");
  // Refused at submit: an unknown id, a job already failed.
  Result unknown = c.Cli(
      {"submit", "--after", "9999", c.JobFile("x.yaml", "command: [true]\n")});
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.err.find("--after 9999: no job 9999"), npos) << unknown.err;
  Result failed = c.Cli({"submit", "--after", b, c.dir() + "/x.yaml"});
  EXPECT_NE(failed.err.find("job " + b + " has failed"), npos) << failed.err;
}

}  // namespace
}  // namespace dlbatch::testing
