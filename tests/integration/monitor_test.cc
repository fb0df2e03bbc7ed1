// `dlbatch monitor` and the WatchEvents stream behind it, with the real
// scheduler, worker and CLI: the plain snapshot, the stream's promptness,
// and the full-screen monitor driven through tmux.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr char kSleepJob[] = "command: [sleep, \"60\"]\n";

TEST(Monitor, WithoutATerminalPrintsOneSnapshotOfWorkersAndJobs) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id =
      c.Submit(c.JobFile("sleep.yaml", kSleepJob), {"--name", "sleeper"});
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING"));

  Result r = c.Cli({"monitor"});  // stdout is a pipe here
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("w1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("online"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1=#" + std::to_string(id)), std::string::npos) << r.out;
  bool row = false;
  std::string line;
  for (size_t at = 0; at < r.out.size();) {
    size_t end = r.out.find('\n', at);
    line = r.out.substr(
        at, end == std::string::npos ? std::string::npos : end - at);
    if (line.rfind(std::to_string(id) + " ", 0) == 0 &&
        line.find("sleeper") != std::string::npos &&
        line.find("running") != std::string::npos) {
      row = true;
    }
    if (end == std::string::npos) break;
    at = end + 1;
  }
  EXPECT_TRUE(row) << r.out;
  EXPECT_EQ(c.Cli({"monitor", "--once"}).code, 0);
  c.Cli({"cancel", std::to_string(id)});
}

TEST(Monitor, TheEventStreamCarriesANewJobWithinASecond) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));

  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(c.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->WatchEvents(&ctx, v1::WatchEventsRequest());
  v1::ClusterEvent event;
  bool worker = false, done = false;
  while (!done && reader->Read(&event)) {
    if (event.has_worker() && event.worker().name() == "w1") worker = true;
    done = event.snapshot_done();
  }
  ASSERT_TRUE(done);
  EXPECT_TRUE(worker);

  int64_t id = c.Submit(c.JobFile("sleep.yaml", kSleepJob));
  auto submitted = std::chrono::steady_clock::now();
  bool seen = false, running = false;
  while (!(seen && running) && reader->Read(&event)) {
    if (event.has_job() && event.job().id() == id) {
      if (!seen) {
        seen = true;
        EXPECT_LT(std::chrono::steady_clock::now() - submitted,
                  std::chrono::seconds(1));
      }
      running = event.job().state() == v1::JOB_STATE_RUNNING;
    }
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(running);
  ctx.TryCancel();
  reader->Finish();
  c.Cli({"cancel", std::to_string(id)});
}

// A private tmux server on a socket in the test's folder.
class Tmux {
 public:
  explicit Tmux(const std::string& dir) : socket_(dir + "/tmux.sock") {}
  ~Tmux() { Run({"kill-server"}); }

  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"tmux", "-S", socket_});
    return Exec(args, {{"TMUX", ""}, {"TERM", "xterm"}}, 20000);
  }
  std::string Screen() { return Run({"capture-pane", "-p", "-t", "mon"}).out; }
  bool WaitScreen(const std::function<bool(const std::string&)>& ready,
                  int timeout_ms, std::string* last) {
    return WaitFor(
        [&] {
          *last = Screen();
          return ready(*last);
        },
        timeout_ms);
  }

 private:
  std::string socket_;
};

bool HaveTmux() { return Exec({"tmux", "-V"}).code == 0; }

TEST(Monitor, InTmuxShowsTheRunningJobAndCancelsItWithC) {
  if (!HaveTmux())
    GTEST_SKIP() << "tmux is not installed (deploy/bootstrap.sh installs it)";
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));

  Tmux tmux(c.dir());
  std::string command = "env XDG_STATE_HOME=" + c.dir() + "/xdg " + BinDir() +
                        "/dlbatch --scheduler " + c.address() + " monitor";
  Result started = tmux.Run(
      {"new-session", "-d", "-s", "mon", "-x", "80", "-y", "24", command});
  ASSERT_EQ(started.code, 0) << started.err;
  std::string screen;
  ASSERT_TRUE(tmux.WaitScreen(
      [](const std::string& s) {
        return s.find(" w1 ") != std::string::npos &&
               s.find("(no jobs)") != std::string::npos;
      },
      10000, &screen))
      << screen;

  // Submitted after the monitor started: the row arrives through the stream.
  int64_t id =
      c.Submit(c.JobFile("sleep.yaml", kSleepJob), {"--name", "sleeper"});
  const std::string id_text = std::to_string(id);
  ASSERT_TRUE(tmux.WaitScreen(
      [&](const std::string& s) {
        size_t row = s.find(
            "> " + std::string(4 - std::min<size_t>(4, id_text.size()), ' ') +
            id_text + " sleeper");
        return row != std::string::npos &&
               s.find("running", row) != std::string::npos &&
               s.find("1=#" + id_text) != std::string::npos;
      },
      5000, &screen))
      << screen;

  tmux.Run({"send-keys", "-t", "mon", "c"});
  ASSERT_TRUE(tmux.WaitScreen(
      [&](const std::string& s) {
        return s.find("Cancel job " + id_text + "? [y/N]") != std::string::npos;
      },
      5000, &screen))
      << screen;
  tmux.Run({"send-keys", "-t", "mon", "y"});
  EXPECT_TRUE(c.WaitState(id, "JOB_STATE_CANCELLED", 20000)) << c.State(id);
  EXPECT_TRUE(tmux.WaitScreen(
      [](const std::string& s) {
        return s.find("cancelled") != std::string::npos;
      },
      5000, &screen))
      << screen;

  tmux.Run({"send-keys", "-t", "mon", "q"});
  EXPECT_TRUE(WaitFor(
      [&] {
        return tmux.Run({"has-session", "-t", "mon"}).code != 0;
      },
      5000))
      << "the monitor did not exit on q:\n"
      << tmux.Screen();
}

TEST(Monitor, InTmuxTheDiaryOfAJobOfTwoPartsLabelsEachLineWithItsRank) {
  if (!HaveTmux())
    GTEST_SKIP() << "tmux is not installed (deploy/bootstrap.sh installs it)";
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  c.StartWorker("w2", 1);
  ASSERT_TRUE(c.WaitWorkers(2));
  const int64_t id = c.Submit(
      c.JobFile("two.yaml",
                "name: two\npool: 2\nmax_nodes: 2\ncommand: [sh, -c, 'echo "
                "\"from part $DLBATCH_PART\"']\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED")) << c.Logs();

  Tmux tmux(c.dir());
  std::string command = "env XDG_STATE_HOME=" + c.dir() + "/xdg " + BinDir() +
                        "/dlbatch --scheduler " + c.address() + " monitor";
  Result started = tmux.Run(
      {"new-session", "-d", "-s", "mon", "-x", "80", "-y", "24", command});
  ASSERT_EQ(started.code, 0) << started.err;
  std::string screen;
  ASSERT_TRUE(tmux.WaitScreen(
      [](const std::string& s) { return s.find(" two ") != std::string::npos; },
      10000, &screen))
      << screen;
  tmux.Run({"send-keys", "-t", "mon", "d"});
  EXPECT_TRUE(tmux.WaitScreen(
      [](const std::string& s) {
        return s.find("\n[0] from part 0") != std::string::npos &&
               s.find("\n[1] from part 1") != std::string::npos;
      },
      10000, &screen))
      << screen;
  tmux.Run({"send-keys", "-t", "mon", "q"});
  tmux.Run({"send-keys", "-t", "mon", "q"});
}

TEST(Monitor, InTmuxATrainJobsRowShowsItsProgressBarLossAndAccuracy) {
  if (!HaveTmux())
    GTEST_SKIP() << "tmux is not installed (deploy/bootstrap.sh installs it)";
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (access((data + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0)
    GTEST_SKIP() << "Fashion-MNIST is missing (Debian's dataset-fashion-mnist)";
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  // Long enough to be watched; cancelled once seen.
  const int64_t id = c.Submit(c.JobFile(
      "lenet.yaml",
      std::string("name: lenet-mon\ntrain:") + kLenetNetworkYaml +
          "  data:\n    train: {format: idx, images: " + data +
          "/train-images-idx3-ubyte.gz, labels: " + data +
          "/train-labels-idx1-ubyte.gz}\n  options:\n"
          "    max_iterations: 100000\n    verbose_frequency: 1000\n"));

  Tmux tmux(c.dir());
  std::string command = "env XDG_STATE_HOME=" + c.dir() + "/xdg " + BinDir() +
                        "/dlbatch --scheduler " + c.address() + " monitor";
  ASSERT_EQ(tmux.Run({"new-session", "-d", "-s", "mon", "-x", "80", "-y", "24",
                      command})
                .code,
            0);
  // The job's row: a bar, a percentage, a loss and an accuracy, updated as
  // the trainer reports (iteration > 0 makes the loss a number).
  std::string screen, row;
  ASSERT_TRUE(tmux.WaitScreen(
      [&](const std::string& s) {
        size_t at = s.find(" lenet-mon");
        if (at == std::string::npos) return false;
        size_t begin = s.rfind('\n', at);
        row = s.substr(
            begin == std::string::npos ? 0 : begin + 1,
            s.find('\n', at) - (begin == std::string::npos ? 0 : begin + 1));
        return row.find("running") != std::string::npos &&
               row.find('%') != std::string::npos &&
               row.find(" - ") == std::string::npos;
      },
      60000, &screen))
      << screen << "\n"
      << c.Cli({"diary", std::to_string(id)}).out;
  EXPECT_LE(row.size(), 80u) << row;
  // The same numbers the scheduler holds.
  nlohmann::json p = c.ShowJson(id)["progress"];
  EXPECT_GT(p.value("loss", 0.0), 0.0) << p.dump();
  c.Cli({"cancel", std::to_string(id)});
  tmux.Run({"send-keys", "-t", "mon", "q"});
}

}  // namespace
}  // namespace dlbatch::testing
