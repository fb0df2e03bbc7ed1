// What the CLI and the daemons tell a user and a script, through the real
// scheduler and worker: lists carry what `show` does, `diary --raw` gives
// the job's exact bytes and `diary --json` numbers a job's own lines, usage
// errors exit 2 (and `dlbatch` alone lists the commands), `wait` on no job
// exits 4, a lost worker's reason is in human units, a removed worker
// leaves without reconnecting, and a stopped scheduler takes its socket
// file with it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;

class CliMessages : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartScheduler();
    c_.StartWorker("w1", 1);
    ASSERT_TRUE(c_.WaitWorkers(1));
  }
  int64_t SubmitQ(std::vector<std::string> args) {
    args.insert(args.begin(), {"submit", "-q"});
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r.code == 0 ? std::stoll(r.out) : -1;
  }
  // The job of `id` in `jobs --json ARGS...`; null if it is not listed.
  nlohmann::json Listed(int64_t id, std::vector<std::string> args = {}) {
    args.insert(args.begin(), {"jobs", "--json"});
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    const nlohmann::json listed = nlohmann::json::parse(r.out);
    for (const auto& j : listed["jobs"]) {
      if (j["id"] == id) return j;
    }
    return nullptr;
  }
  std::vector<int64_t> ListedIds(std::vector<std::string> args) {
    args.insert(args.begin(), {"jobs", "--json"});
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    std::vector<int64_t> ids;
    const nlohmann::json listed = nlohmann::json::parse(r.out);
    for (const auto& j : listed["jobs"]) ids.push_back(j["id"].get<int64_t>());
    return ids;
  }
  Cluster c_;
};

TEST_F(CliMessages, ListsCarryPlacementAfterAndHeldAsShowDoes) {
  const std::string release = c_.dir() + "/release";
  const int64_t running =
      SubmitQ({"--", "sh", "-c",
               "while [ ! -f " + release + " ]; do sleep 0.05; done"});
  ASSERT_TRUE(c_.WaitState(running, "JOB_STATE_RUNNING")) << c_.Logs();
  const int64_t after =
      SubmitQ({"--after", std::to_string(running), "--", "true"});
  const int64_t held = SubmitQ({"--", "true"});
  ASSERT_EQ(c_.Cli({"hold", std::to_string(held)}).code, 0);

  nlohmann::json shown = c_.ShowJson(running);
  ASSERT_EQ(shown["placement"].size(), 1u) << shown.dump();
  EXPECT_EQ(shown["placement"][0]["worker_name"], "w1");
  EXPECT_EQ(Listed(running)["placement"], shown["placement"]);
  EXPECT_EQ(c_.ShowJson(after)["after"], nlohmann::json::array({running}));
  EXPECT_EQ(Listed(after)["after"], nlohmann::json::array({running}));
  EXPECT_EQ(Listed(held)["held"], true);

  // held: the held queued jobs, as the STATE column names them.
  EXPECT_EQ(ListedIds({"--state", "held"}), std::vector<int64_t>({held}));
  EXPECT_EQ(ListedIds({"--state", "held", "--limit", "1"}),
            std::vector<int64_t>({held}));
  EXPECT_EQ(ListedIds({"--state", "held,running"}),
            std::vector<int64_t>({running, held}));
  EXPECT_EQ(ListedIds({"--state", "queued"}),
            std::vector<int64_t>({after, held}));
  Result table = c_.Cli({"jobs", "--state", "held", "--format", "id,state"});
  EXPECT_EQ(table.out, "ID  STATE\n" + std::to_string(held) + "   held\n")
      << table.out << table.err;
  Result unknown = c_.Cli({"jobs", "--state", "hold"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("unknown state 'hold'; use queued, held, running"),
            npos)
      << unknown.err;
  Result help = c_.Cli({"jobs", "--help"});
  EXPECT_NE(help.out.find("queued, held, running"), npos) << help.out;
  WriteAll(release, "");
}

TEST_F(CliMessages, DiaryRawIsTheJobsBytesAndJsonNumbersTheJobsLines) {
  const int64_t first = SubmitQ({"--", "sh", "-c", "echo x; echo y; echo z"});
  ASSERT_TRUE(c_.WaitState(first, "JOB_STATE_FINISHED")) << c_.Logs();
  const int64_t id =
      SubmitQ({"--", "sh", "-c", "printf 'a\\r\\nb\\n'; printf 'c\\nd'"});
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  Result raw = c_.Cli({"diary", "--raw", std::to_string(id)});
  ASSERT_EQ(raw.code, 0) << raw.err;
  EXPECT_EQ(raw.out, "a\r\nb\nc\nd");
  // Without --raw each line is one line of the terminal's.
  EXPECT_EQ(c_.Cli({"diary", std::to_string(id)}).out, "a\nb\nc\nd\n");

  Result json = c_.Cli({"diary", "--json", std::to_string(id)});
  ASSERT_EQ(json.code, 0) << json.err;
  std::vector<int64_t> numbers;
  std::vector<std::string> endings;
  std::stringstream lines(json.out);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line);
    numbers.push_back(j["n"].get<int64_t>());
    endings.push_back(j["ending"].get<std::string>());
  }
  // The second job's lines are its lines 1 to 4, whatever came before.
  EXPECT_EQ(numbers, std::vector<int64_t>({1, 2, 3, 4})) << json.out;
  EXPECT_EQ(endings, std::vector<std::string>({"\r\n", "\n", "\n", ""}));
  // --tail still takes the last lines.
  EXPECT_EQ(c_.Cli({"diary", "--raw", "--tail", "1", std::to_string(id)}).out,
            "d");
}

TEST_F(CliMessages, UsageErrorsExitTwoAndWaitOnNoJobExitsFour) {
  // No command at all: the list --help prints, on stderr.
  std::map<std::string, std::string> env = c_.CliEnv();
  Result alone = Exec({BinDir() + "/dlbatch"}, env);
  EXPECT_EQ(alone.code, 2) << alone.err;
  Result help = Exec({BinDir() + "/dlbatch", "--help"}, env);
  EXPECT_EQ(help.code, 0);
  EXPECT_EQ(alone.err, help.out);
  EXPECT_EQ(alone.err.find("A subcommand is required"), npos);
  EXPECT_NE(alone.err.find("submit"), npos) << alone.err;
  Result local = c_.Cli({"local"});
  EXPECT_EQ(local.code, 2);
  EXPECT_NE(local.err.find("status"), npos) << local.err;

  const struct {
    std::vector<std::string> args;
    const char* says;
  } usage[] = {
      {{"jobs", "--no-such-flag"}, "--no-such-flag"},
      {{"diary"}, "id is required"},
      {{"diary", "x"}, "x"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"show"}, "give a job id"},
      {{"wait", "--timeout", "soon", "1"}, "--timeout soon"},
      {{"jobs", "--format", "colour"}, "no column 'colour'"},
      {{"jobs", "--limit"}, "--limit"},
  };
  for (const auto& u : usage) {
    Result r = c_.Cli(u.args);
    EXPECT_EQ(r.code, 2) << u.args[0] << " " << r.err;
    EXPECT_NE(r.err.find(u.says), npos) << r.err;
  }
  // The examples of a bad duration, once.
  Result limit = c_.Cli({"submit", "--time-limit", "5x", "--", "true"});
  EXPECT_EQ(limit.code, 2);
  EXPECT_NE(limit.err.find("--time-limit 5x: '5x' is not a duration; write "
                           "e.g. 90s, 30m, 1h30m or 2d\n"),
            npos)
      << limit.err;
  EXPECT_EQ(limit.err.find("e.g.", limit.err.find("e.g.") + 1), npos)
      << limit.err;

  Result none = c_.Cli({"wait", "99999"});
  EXPECT_EQ(none.code, 4) << none.err;
  EXPECT_NE(none.err.find("no job 99999"), npos) << none.err;
  const int64_t failed = SubmitQ({"--", "sh", "-c", "exit 3"});
  EXPECT_EQ(c_.Cli({"wait", std::to_string(failed)}).code, 1);

  // The daemons' and the trainer's usage errors exit 2 as well.
  const std::string unused = c_.dir() + "/unused";
  const struct {
    const char* program;
    std::vector<std::string> args;  // what it requires, then the bad flag
  } daemons[] = {
      {"dlbatch-scheduler", {"--config", "", "--state-dir", unused}},
      {"dlbatch-worker", {"--config", "", "--work-dir", unused}},
      {"dlbatch-train", {}},
  };
  for (const auto& [daemon, required] : daemons) {
    const std::string path = BinDir() + "/" + daemon;
    if (access(path.c_str(), X_OK) != 0) continue;  // not built for this test
    std::vector<std::string> argv = {path};
    argv.insert(argv.end(), required.begin(), required.end());
    argv.push_back("--no-such-flag");
    Result r = Exec(argv);
    EXPECT_EQ(r.code, 2) << daemon << ": " << r.err;
    EXPECT_NE(r.err.find("--no-such-flag"), npos) << daemon << ": " << r.err;
  }
}

// True once `pid` has exited (without reaping it: the cluster does), with
// its exit status in *status.
bool Exited(pid_t pid, int* code) {
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  if (info.si_pid != pid) return false;
  *code = info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
  return true;
}

TEST(DaemonMessages, LostAndRemovedWorkersAreToldInPlainWords) {
  Cluster c;
  c.StartScheduler(
      {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s"});
  const int lost = c.StartWorker("w1", 1);
  const int removed = c.StartWorker("w2", 1);
  ASSERT_TRUE(c.WaitWorkers(2));

  // Removed by an admin: the worker leaves, saying so, and does not try
  // to come back.
  ASSERT_EQ(c.Cli({"admin", "drain", "w2"}).code, 0);
  Result remove = c.Cli({"admin", "remove", "w2"});
  ASSERT_EQ(remove.code, 0) << remove.err;
  int code = -1;
  ASSERT_TRUE(
      WaitFor([&] { return Exited(c.worker_pid(removed), &code); }, 15000))
      << c.Logs();
  EXPECT_EQ(code, 0);
  const std::string log = ReadAll(c.dir() + "/worker-w2.log");
  EXPECT_NE(log.find("leaving: the scheduler at"), npos) << log;
  EXPECT_NE(log.find("removed by an admin"), npos) << log;
  EXPECT_EQ(log.find("reconnecting"), npos) << log;
  EXPECT_EQ(log.find("OK;"), npos) << log;

  // A worker gone silent is lost after the timeout, said in seconds.
  const std::string sleep = c.JobFile("sleep.yaml", "command: [sleep, '60']\n");
  const int64_t id = c.Submit(sleep);
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING")) << c.Logs();
  kill(c.worker_pid(lost), SIGSTOP);
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_QUEUED", 15000)) << c.Logs();
  std::string reasons;
  const nlohmann::json shown = c.ShowJson(id);
  for (const auto& h : shown["history"]) {
    reasons += h.value("reason", "") + "\n";
  }
  EXPECT_NE(reasons.find("worker 'w1' lost: silent for over 2s"), npos)
      << reasons;
  kill(c.worker_pid(lost), SIGCONT);
}

// A Unix socket bound at `path`, listening; its descriptor, or -1.
int ListeningSocket(const std::string& path) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return -1;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(DaemonMessages, AStoppedSchedulerRemovesItsOwnSocketFileOnly) {
  Cluster c;
  c.StartScheduler();
  const std::string socket = c.dir() + "/sched.sock";
  struct stat st;
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  c.KillScheduler(SIGTERM);
  EXPECT_NE(stat(socket.c_str(), &st), 0) << "the socket file was left";

  // Another's socket bound at the same path since: left alone.
  c.StartScheduler();
  ASSERT_EQ(unlink(socket.c_str()), 0);
  const int other = ListeningSocket(socket);
  ASSERT_GE(other, 0);
  c.KillScheduler(SIGTERM);
  EXPECT_EQ(stat(socket.c_str(), &st), 0) << "another's socket was removed";
  close(other);
}

}  // namespace
}  // namespace dlbatch::testing
