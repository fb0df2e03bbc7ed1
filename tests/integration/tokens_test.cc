// Per-user tokens on a TCP listener: `dlbatch admin user add` makes a token
// that acts as its user, only admins administer, a worker credential only
// registers workers (and no other credential takes its workers' names),
// and a revoke is in force at once, open streams included. Users are
// `nobody` and `daemon`, who exist on every Debian system, so the root
// worker can run their jobs as them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root: the worker runs jobs as their owners";
    }
    // The jobs' users must pass through the test's folder to their own.
    ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
    c_.StartScheduler({}, "127.0.0.1:0");
    admin_file_ = c_.scheduler_state() + "/token";
    admin_ = Trim(ReadAll(admin_file_));
    ASSERT_FALSE(admin_.empty());
  }

  // The CLI presenting `token`.
  Result As(const std::string& token, const std::vector<std::string>& args,
            int timeout_ms = 60000) {
    return c_.Cli(args, {{"DLBATCH_TOKEN", token}}, timeout_ms);
  }
  // A new credential's token, made by the first admin.
  std::string Issue(const std::vector<std::string>& args) {
    Result r = As(admin_, args);
    EXPECT_EQ(r.code, 0) << r.err;
    return Trim(r.out);
  }
  std::string TokenFile(const std::string& name, const std::string& token) {
    std::string path = c_.dir() + "/" + name + ".token";
    WriteAll(path, token + "\n");
    return path;
  }
  int64_t SubmitAs(const std::string& token, const std::string& yaml) {
    Result r = As(token, {"submit", "-q", c_.JobFile("job.yaml", yaml)});
    EXPECT_EQ(r.code, 0) << r.err << c_.Logs();
    return r.code == 0 ? std::stoll(r.out) : -1;
  }
  std::string StateOf(int64_t id) {
    Result r = As(admin_, {"show", "--json", std::to_string(id)});
    auto at = r.out.find("\"state\": \"");
    if (at == std::string::npos) return "";
    at += 10;
    // "running" as the proto names it, as the tests compare it.
    std::string state = r.out.substr(at, r.out.find('"', at) - at);
    for (char& ch : state) ch = static_cast<char>(toupper(ch));
    return "JOB_STATE_" + state;
  }
  bool WaitStateOf(int64_t id, const std::string& state) {
    return WaitFor([&] { return StateOf(id) == state; }, 30000);
  }
  bool WorkerOnline(const std::string& name) {
    Result r = As(admin_, {"workers"});
    for (const std::string& line : Lines(r.out)) {
      if (line.find(" " + name + " ") != std::string::npos &&
          line.find("online") != std::string::npos) {
        return true;
      }
    }
    return false;
  }
  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      lines.push_back(text.substr(start, nl - start));
    }
    return lines;
  }

  Cluster c_;
  std::string admin_file_;
  std::string admin_;
};

TEST_F(TokensTest, ATokenActsAsItsUserAndOnlyAdminsAdminister) {
  const std::string nobody = Issue({"admin", "user", "add", "nobody"});
  const std::string daemon = Issue({"admin", "user", "add", "daemon"});
  const std::string ops = Issue({"admin", "user", "add", "ops", "--admin"});
  ASSERT_EQ(nobody.rfind("dlbu_", 0), 0u) << nobody;
  ASSERT_NE(nobody, daemon);
  // A name holds one token; a second add says how to replace it.
  Result again = As(admin_, {"admin", "user", "add", "nobody"});
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("already has a token"), std::string::npos)
      << again.err;

  const std::string nodes = Issue({"admin", "worker-token", "nodes"});
  ASSERT_EQ(nodes.rfind("dlbw_", 0), 0u) << nodes;
  c_.StartWorker("w1", 2, "local", {"--token-file", TokenFile("nodes", nodes)});
  ASSERT_TRUE(WaitFor([&] { return WorkerOnline("w1"); }, 15000)) << c_.Logs();

  // nobody's job is nobody's whatever the CLI (run as root) claims, and
  // runs as nobody.
  const int64_t job =
      SubmitAs(nobody, "command: [sh, -c, 'id -u; sleep 300']\n");
  ASSERT_GT(job, 0);
  ASSERT_TRUE(WaitStateOf(job, "JOB_STATE_RUNNING")) << c_.Logs();
  Result shown = As(nobody, {"show", "--json", std::to_string(job)});
  EXPECT_NE(shown.out.find("\"user\": \"nobody\""), std::string::npos)
      << shown.out << shown.err;
  ASSERT_TRUE(WaitFor(
      [&] {
        return As(nobody, {"diary", std::to_string(job)}).out == "65534\n";
      },
      10000));

  // daemon reaches none of it.
  const std::string denied =
      "permission denied: job " + std::to_string(job) + " belongs to nobody";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"show", std::to_string(job)},
                                             {"diary", std::to_string(job)},
                                             {"cancel", std::to_string(job)}}) {
    Result r = As(daemon, args);
    EXPECT_NE(r.code, 0) << args[0];
    EXPECT_NE(r.err.find(denied), std::string::npos) << args[0] << r.err;
  }
  EXPECT_EQ(StateOf(job), "JOB_STATE_RUNNING");
  // Administering is for admins.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"admin", "user", "list"},
           {"admin", "user", "add", "mallory"},
           {"admin", "user", "revoke", "daemon"},
           {"admin", "worker-token", "mine"}}) {
    Result r = As(nobody, args);
    EXPECT_NE(r.code, 0) << args[2];
    EXPECT_NE(r.err.find("is for admins"), std::string::npos) << r.err;
  }
  // The worker credential registers workers and nothing else ...
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"jobs"}, {"show", std::to_string(job)}, {"submit", "-q", "x"}}) {
    Result r = As(nodes, args);
    EXPECT_NE(r.code, 0) << args[0];
    if (args[0] != "submit") {
      EXPECT_NE(r.err.find("is a worker credential"), std::string::npos)
          << r.err;
    }
  }
  // ... and a user's token registers no worker.
  Result rogue = Exec(
      {BinDir() + "/dlbatch-worker", "--scheduler", c_.address(), "--name",
       "rogue", "--work-dir", c_.dir() + "/rogue", "--cpu-slots", "1",
       "--token-file", TokenFile("nobody", nobody), "--ca-file", c_.ca_file()},
      {}, 20000);
  EXPECT_NE(rogue.code, 0);
  EXPECT_NE((rogue.out + rogue.err).find("may not register a worker"),
            std::string::npos)
      << rogue.out << rogue.err;

  // An admin's token reaches every job: ops cancels nobody's.
  Result cancelled = As(ops, {"cancel", std::to_string(job)});
  EXPECT_EQ(cancelled.code, 0) << cancelled.err;
  EXPECT_TRUE(WaitStateOf(job, "JOB_STATE_CANCELLED"));

  // The list shows names and kinds, never a token.
  Result list = As(ops, {"admin", "user", "list"});
  EXPECT_EQ(list.code, 0) << list.err;
  for (const char* want : {"nobody", "daemon", "ops", "nodes", "root"}) {
    EXPECT_NE(list.out.find(want), std::string::npos) << list.out;
  }
  EXPECT_NE(list.out.find("worker"), std::string::npos) << list.out;
  EXPECT_EQ(list.out.find(nobody), std::string::npos);
  EXPECT_EQ(list.out.find(nobody.substr(5)), std::string::npos);

  // Tokens are kept (as hashes) across a scheduler crash.
  c_.KillScheduler(SIGKILL);
  c_.StartScheduler();
  Result after = As(daemon, {"jobs"});
  EXPECT_EQ(after.code, 0) << after.err;
  const std::string db = ReadAll(c_.scheduler_state() + "/dlbatch.db");
  EXPECT_EQ(db.find(daemon.substr(5)), std::string::npos)
      << "a token is stored in the clear";
}

TEST_F(TokensTest, ARevokeEndsOpenStreamsAtOnceAndLaterCallsFail) {
  const std::string nobody = Issue({"admin", "user", "add", "nobody"});
  const std::string nodes = Issue({"admin", "worker-token", "nodes"});
  c_.StartWorker("w1", 1, "local", {"--token-file", TokenFile("nodes", nodes)});
  ASSERT_TRUE(WaitFor([&] { return WorkerOnline("w1"); }, 15000)) << c_.Logs();
  const int64_t job =
      SubmitAs(nobody, "command: [sh, -c, 'echo started; sleep 300']\n");
  ASSERT_GT(job, 0);
  ASSERT_TRUE(WaitStateOf(job, "JOB_STATE_RUNNING")) << c_.Logs();

  // nobody follows the diary; the follow stays open while the job runs.
  Result follow;
  std::chrono::steady_clock::time_point follow_ended;
  std::thread follower([&] {
    follow = As(nobody, {"diary", "-f", std::to_string(job)}, 60000);
    follow_ended = std::chrono::steady_clock::now();
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));

  const auto revoked_at = std::chrono::steady_clock::now();
  Result revoke = As(admin_, {"admin", "user", "revoke", "nobody"});
  EXPECT_EQ(revoke.code, 0) << revoke.err;
  EXPECT_NE(revoke.out.find("1 open call ended"), std::string::npos)
      << revoke.out;
  follower.join();
  // Ended by the revoke, not by the job (which runs for 300 s) or the
  // 60 s limit; a revoke is meant to end it within a second, 3 s leaves
  // room for a loaded machine.
  EXPECT_LT(follow_ended - revoked_at, std::chrono::seconds(3));
  EXPECT_NE(follow.code, 0);
  EXPECT_NE(follow.out.find("started"), std::string::npos) << follow.out;
  EXPECT_NE(follow.err.find("not valid"), std::string::npos) << follow.err;
  Result later = As(nobody, {"jobs"});
  EXPECT_NE(later.code, 0);
  EXPECT_NE(later.err.find("not valid"), std::string::npos) << later.err;
  // The revoke ends no job.
  EXPECT_EQ(StateOf(job), "JOB_STATE_RUNNING");
  Result again = As(admin_, {"admin", "user", "revoke", "nobody"});
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("no user named 'nobody'"), std::string::npos)
      << again.err;

  // Revoking the worker credential disconnects its worker for good.
  Result off = As(admin_, {"admin", "worker-token", "nodes", "--revoke"});
  EXPECT_EQ(off.code, 0) << off.err;
  EXPECT_TRUE(WaitFor([&] { return !WorkerOnline("w1"); }, 10000))
      << As(admin_, {"workers"}).out;
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_FALSE(WorkerOnline("w1")) << "the worker got back in";
}

TEST_F(TokensTest, AWorkersNameIsNotTakenByAnotherCredential) {
  const std::string nodes = Issue({"admin", "worker-token", "nodes"});
  const std::string other = Issue({"admin", "worker-token", "other"});
  c_.StartWorker("w1", 1, "local", {"--token-file", TokenFile("nodes", nodes)});
  ASSERT_TRUE(WaitFor([&] { return WorkerOnline("w1"); }, 15000)) << c_.Logs();
  const std::string admin_yaml = "command: [sh, -c, 'echo mine; sleep 300']\n";
  const int64_t job = SubmitAs(admin_, admin_yaml);
  ASSERT_TRUE(WaitStateOf(job, "JOB_STATE_RUNNING")) << c_.Logs();

  Result taker = Exec(
      {BinDir() + "/dlbatch-worker", "--scheduler", c_.address(), "--name",
       "w1", "--work-dir", c_.dir() + "/taker", "--cpu-slots", "1",
       "--token-file", TokenFile("other", other), "--ca-file", c_.ca_file()},
      {}, 20000);
  EXPECT_NE(taker.code, 0);
  EXPECT_NE((taker.out + taker.err)
                .find("belongs to a worker connected under "
                      "another credential"),
            std::string::npos)
      << taker.out << taker.err;
  // The first w1 keeps its name and its job.
  EXPECT_TRUE(WorkerOnline("w1"));
  EXPECT_EQ(StateOf(job), "JOB_STATE_RUNNING");
  // Its own credential may: a restarted w1 takes its place.
  c_.KillWorker(0, SIGKILL);
  c_.RestartWorker(0);
  EXPECT_TRUE(WaitFor([&] { return WorkerOnline("w1"); }, 15000)) << c_.Logs();
}

}  // namespace
}  // namespace dlbatch::testing
