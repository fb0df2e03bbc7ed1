// Configuration files and versions with the real binaries: a scheduler, a
// worker and the CLI configured by their files alone; bad keys that stop a
// daemon naming file, line and key; `dlbatch config` naming where each
// value came from; --version on every binary; a worker too old for the
// scheduler refused with both versions named.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A daemon started with exactly `argv` (no flags of the harness), its
// output in `log`; killed and reaped at the end of the test.
class Daemon {
 public:
  Daemon(const std::vector<std::string>& argv, const std::string& log)
      : pid_(SpawnLogged(argv, log)) {}
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

 private:
  pid_t pid_ = 0;
};

// `dlbatch config --json`'s setting for `key`.
nlohmann::json SettingOf(const std::string& json_text, const std::string& key) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded()) return {};
  for (const auto& s : j["settings"]) {
    if (s["key"] == key) return s;
  }
  return {};
}

TEST(ConfigFiles, SchedulerWorkerAndCliConfiguredByTheirFilesAlone) {
  Cluster c;
  const std::string dir = c.dir();
  const std::string sock = "unix:" + dir + "/from-file.sock";
  const std::string scheduler_yaml = dir + "/scheduler.yaml";
  WriteAll(scheduler_yaml,
           "# the scheduler's settings\n"
           "state_dir: " +
               dir +
               "/state\n"
               "listen: " +
               sock +
               "\n"
               "ready_file: " +
               dir +
               "/ready\n"
               "heartbeat_interval: 1s\n"
               "profile: [local, big=8]\n");
  Daemon scheduler(
      {BinDir() + "/dlbatch-scheduler", "--config", scheduler_yaml},
      dir + "/scheduler.log");
  ASSERT_TRUE(WaitFor([&] { return !ReadAll(dir + "/ready").empty(); }, 15000))
      << ReadAll(dir + "/scheduler.log");
  EXPECT_EQ(ReadAll(dir + "/ready"), sock + "\n");
  EXPECT_THAT(ReadAll(dir + "/scheduler.log"),
              HasSubstr("configuration " + scheduler_yaml));
  EXPECT_THAT(ReadAll(dir + "/scheduler.log"),
              HasSubstr("listen=" + sock + " (file " + scheduler_yaml + ":3)"));

  const std::string worker_yaml = dir + "/worker.yaml";
  WriteAll(worker_yaml, "scheduler: " + sock + "\nwork_dir: " + dir +
                            "/work\nname: from-file\ncpu_slots: 3\n"
                            "profile: big\n");
  Daemon worker({BinDir() + "/dlbatch-worker", "--config", worker_yaml},
                dir + "/worker.log");

  // The CLI finds the scheduler through config.yaml alone (no flag, no
  // DLBATCH_SCHEDULER; without the file it would start a local cluster).
  std::filesystem::create_directories(dir + "/xdg-config/dlbatch");
  const std::string client_yaml = dir + "/xdg-config/dlbatch/config.yaml";
  WriteAll(client_yaml, "scheduler: " + sock + "\ndefault_profile: big\n");
  const std::map<std::string, std::string> env = {
      {"XDG_CONFIG_HOME", dir + "/xdg-config"},
      {"XDG_STATE_HOME", dir + "/xdg"}};
  Result workers;
  ASSERT_TRUE(WaitFor(
      [&] {
        workers = Exec({BinDir() + "/dlbatch", "workers", "--json"}, env);
        return workers.code == 0 &&
               workers.out.find("from-file") != std::string::npos &&
               workers.out.find("\"online\": true") != std::string::npos;
      },
      15000))
      << workers.out << workers.err << ReadAll(dir + "/worker.log");
  nlohmann::json listed = nlohmann::json::parse(workers.out);
  ASSERT_EQ(listed["workers"].size(), 1u) << workers.out;
  const nlohmann::json& w = listed["workers"][0];
  EXPECT_EQ(w["profile"], "big");
  EXPECT_EQ(w["devices"].size(), 3u);
  EXPECT_EQ(w["version"], std::string(Version()));
  EXPECT_FALSE(std::filesystem::exists(dir + "/xdg/dlbatch"))
      << "the CLI started a local cluster instead of reading config.yaml";

  // A submit without a profile goes to config.yaml's default_profile.
  std::string job = c.JobFile("j.yaml", "command: [\"true\"]\n");
  Result submitted = Exec({BinDir() + "/dlbatch", "submit", "-q", job}, env);
  ASSERT_EQ(submitted.code, 0) << submitted.err;
  Result shown = Exec({BinDir() + "/dlbatch", "show", "--json",
                       submitted.out.substr(0, submitted.out.find('\n'))},
                      env);
  EXPECT_THAT(shown.out, HasSubstr("\"profile\": \"big\"")) << shown.out;

  // `dlbatch config`: where each value came from.
  Result config = Exec({BinDir() + "/dlbatch", "config", "--json"}, env);
  ASSERT_EQ(config.code, 0) << config.err;
  nlohmann::json s = SettingOf(config.out, "scheduler");
  EXPECT_EQ(s["value"], sock) << config.out;
  EXPECT_EQ(s["source"], "file");
  EXPECT_EQ(s["origin"], "file " + client_yaml + ":1");
  EXPECT_EQ(SettingOf(config.out, "default_profile")["origin"],
            "file " + client_yaml + ":2");
  EXPECT_EQ(SettingOf(config.out, "token_file")["source"], "default");
  EXPECT_EQ(SettingOf(config.out, "retry_for")["value"], "30s");

  auto env_too = env;
  env_too["DLBATCH_SCHEDULER"] = "unix:/elsewhere.sock";
  env_too["DLBATCH_TOKEN"] = "t0ken";
  config = Exec({BinDir() + "/dlbatch", "config", "--json"}, env_too);
  EXPECT_EQ(SettingOf(config.out, "scheduler")["origin"],
            "env DLBATCH_SCHEDULER")
      << config.out;
  EXPECT_EQ(SettingOf(config.out, "token_file")["origin"], "env DLBATCH_TOKEN");
  EXPECT_EQ(config.out.find("t0ken"), std::string::npos)
      << "a token is never printed";
  config =
      Exec({BinDir() + "/dlbatch", "config", "--scheduler", "unix:/f.sock"},
           env_too);
  EXPECT_THAT(config.out, HasSubstr("unix:/f.sock"));
  EXPECT_THAT(config.out, HasSubstr("flag --scheduler"));
  EXPECT_THAT(config.out, HasSubstr("configuration file: " + client_yaml));
}

// A profile's preemption is read, checked and said in the log.
TEST(ConfigFiles, PreemptionIsReadAndTheLogSaysWhatItDoes) {
  Cluster c;
  const std::string dir = c.dir();
  const std::string scheduler_yaml = dir + "/scheduler.yaml";
  WriteAll(scheduler_yaml, "state_dir: " + dir + "/state\nlisten: unix:" + dir +
                               "/p.sock\nready_file: " + dir +
                               "/ready\nprofiles:\n  gpu:\n"
                               "    preemption: {mode: priority, grace: 1m}\n"
                               "  batch:\n    max_pool: 4\n");
  Daemon scheduler(
      {BinDir() + "/dlbatch-scheduler", "--config", scheduler_yaml},
      dir + "/scheduler.log");
  ASSERT_TRUE(WaitFor([&] { return !ReadAll(dir + "/ready").empty(); }, 15000))
      << ReadAll(dir + "/scheduler.log");
  const std::string log = ReadAll(dir + "/scheduler.log");
  EXPECT_THAT(log, HasSubstr("profile 'gpu': preemption by priority (grace "
                             "1m, min_run 10m; jobs preemptible unless they "
                             "say)"));
  EXPECT_THAT(log, Not(HasSubstr("not acted on")));
  EXPECT_THAT(log, Not(HasSubstr("profile 'batch': preemption")));
}

TEST(ConfigFiles, BadKeysStopTheDaemonsNamingFileLineAndKey) {
  Cluster c;
  const std::string yaml = c.dir() + "/scheduler.yaml";
  WriteAll(yaml, "state_dir: " + c.dir() + "/state\n\nlisen: unix:x.sock\n");
  Result r =
      Exec({BinDir() + "/dlbatch-scheduler", "--config", yaml}, {}, 20000);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr(yaml + ":3: unknown key 'lisen' (did you mean "
                                      "'listen'?)"));
  EXPECT_FALSE(std::filesystem::exists(c.dir() + "/state"))
      << "nothing is made before the configuration is read";

  WriteAll(yaml, "state_dir: " + c.dir() + "/state\nmax_attempts: lots\n");
  r = Exec({BinDir() + "/dlbatch-scheduler", "--config", yaml}, {}, 20000);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr(yaml + ":2: key 'max_attempts': expected an "
                                      "integer, got 'lots'"));

  const std::string worker_yaml = c.dir() + "/worker.yaml";
  WriteAll(worker_yaml, "work_dir: " + c.dir() + "/w\ncpu_slots: 0\n");
  r = Exec({BinDir() + "/dlbatch-worker", "--config", worker_yaml,
            "--scheduler", "unix:" + c.dir() + "/none.sock"},
           {}, 20000);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr(worker_yaml + ":2: key 'cpu_slots'"));

  r = Exec(
      {BinDir() + "/dlbatch-scheduler", "--config", c.dir() + "/missing.yaml"},
      {}, 20000);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("cannot read configuration file " + c.dir() +
                               "/missing.yaml"));

  std::filesystem::create_directories(c.dir() + "/xdg-config/dlbatch");
  WriteAll(c.dir() + "/xdg-config/dlbatch/config.yaml", "schedular: x\n");
  r = Exec({BinDir() + "/dlbatch", "config"},
           {{"XDG_CONFIG_HOME", c.dir() + "/xdg-config"}}, 20000);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("config.yaml:1: unknown key 'schedular' (did "
                               "you mean 'scheduler'?)"));
}

TEST(Versions, EveryBinaryPrintsItsVersion) {
  for (const char* program :
       {"dlbatch", "dlbatch-scheduler", "dlbatch-worker", "dlbatch-train"}) {
    const std::string path = BinDir() + "/" + program;
    if (!std::filesystem::exists(path)) {
      ADD_FAILURE() << path << " is not built";
      continue;
    }
    Result r = Exec({path, "--version"}, {}, 20000);
    EXPECT_EQ(r.code, 0) << program << ": " << r.err;
    EXPECT_THAT(r.out,
                HasSubstr(std::string(program) + " " + std::string(Version())));
    EXPECT_THAT(r.out, HasSubstr("GPU backend:"));
    EXPECT_THAT(r.out, HasSubstr("build type:"));
  }
}

TEST(Versions, TooOldWorkerIsRefusedWithBothVersionsAndStops) {
  Cluster c;
  c.StartScheduler();
  Result r = Exec({BinDir() + "/dlbatch-worker", "--config", "", "--scheduler",
                   c.address(), "--work-dir", c.dir() + "/old", "--cpu-slots",
                   "1", "--report-version", "0.0.1"},
                  {}, 30000);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("timed out")));
  const std::string both =
      "worker version 0.0.1 is older than " + std::string(kMinWorkerVersion) +
      ", the oldest that scheduler version " + std::string(Version());
  EXPECT_THAT(r.err, HasSubstr(both));
  EXPECT_THAT(c.Logs(), HasSubstr(both));
  Result workers = c.Cli({"workers", "--json"});
  EXPECT_EQ(workers.out.find("\"online\": true"), std::string::npos)
      << workers.out;
}

}  // namespace
}  // namespace dlbatch::testing
