// dlbatch-scheduler's flags as the daemon runs with them: the defaults,
// what scheduler.yaml sets, the flag over the file, no environment
// variable in between, and each bad value refused with what to write
// (scheduler/daemon_options.h; the profiles through startup.h's
// DeclaredProfiles, as main reads them).
#include "scheduler/daemon_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "scheduler/startup.h"
#include "tests/common/temp_file.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kDayMs = int64_t{24} * 3600 * 1000;

// The daemon's command line as main declares it, read as main reads it:
// the file, the flags, the profiles, then the options.
struct DaemonCommandLine {
  CLI::App app{"test"};
  DaemonFlags flags;
  std::unique_ptr<ConfigBinding> config =
      AddDaemonFlags(app, &flags, "/nonexistent/scheduler.yaml");

  absl::StatusOr<DaemonOptions> Run(std::vector<std::string> args) {
    args.insert(args.begin(), "dlbatch-scheduler");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    const int argc = static_cast<int>(argv.size());
    if (absl::Status s = config->Load(argc, argv.data()); !s.ok()) return s;
    try {
      app.parse(argc, argv.data());
    } catch (const CLI::ParseError& e) {
      return absl::InvalidArgumentError(e.what());
    }
    absl::StatusOr<std::vector<ProfileDeclaration>> profiles =
        DeclaredProfiles(flags, *config);
    if (!profiles.ok()) return profiles.status();
    return DaemonOptionsFromFlags(flags, *std::move(profiles));
  }
  ConfigSetting Setting(const std::string& key) const {
    for (const ConfigSetting& s : config->Settings()) {
      if (s.key == key) return s;
    }
    return {};
  }
};

// The message a command line is refused with ("" when it is not).
std::string Refusal(std::vector<std::string> args) {
  DaemonCommandLine cli;
  absl::StatusOr<DaemonOptions> options = cli.Run(std::move(args));
  return options.ok() ? "" : std::string(options.status().message());
}

TEST(DaemonOptionsTest, Defaults) {
  DaemonCommandLine cli;
  absl::StatusOr<DaemonOptions> o = cli.Run({"--state-dir", "/var/lib/s"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->state_dir, "/var/lib/s");
  EXPECT_EQ(o->listen, "127.0.0.1:7070");
  EXPECT_FALSE(o->endpoint.is_unix);
  EXPECT_EQ(o->endpoint.host, "127.0.0.1");
  EXPECT_EQ(o->endpoint.port, 7070);
  const SchedulerOptions& s = o->scheduler;
  EXPECT_EQ(s.heartbeat_interval_ms, 1000);
  EXPECT_EQ(s.heartbeat_timeout_ms, 10000);
  EXPECT_EQ(s.cancel_grace_ms, 10000);
  EXPECT_EQ(s.max_attempts, 3);
  EXPECT_EQ(s.max_diary_bytes, int64_t{64} << 20);
  EXPECT_EQ(s.max_output_bytes, 0);
  EXPECT_EQ(s.keep_ended_ms, 30 * kDayMs);
  EXPECT_EQ(s.retention_interval_ms, 60000);  // a tenth, at most a minute
  EXPECT_EQ(s.forget_offline_ms, 3600 * 1000);
  EXPECT_EQ(s.fair_share_half_life_ms, 7 * kDayMs);
  EXPECT_EQ(s.restart_grace_ms, 0);  // twice the heartbeat timeout
  EXPECT_TRUE(s.profiles.empty());
  EXPECT_TRUE(o->profiles.empty());
  EXPECT_FALSE(o->sync_full);
  EXPECT_EQ(o->min_free_bytes, int64_t{64} << 20);
  EXPECT_EQ(o->ready_file, "");
  EXPECT_FALSE(o->shared_visibility);
  EXPECT_EQ(o->max_unauthenticated, 256);
  EXPECT_EQ(o->auth_deadline_ms, 10000);
  EXPECT_EQ(o->metrics_listen, "");
  EXPECT_EQ(cli.Setting("listen").source, ConfigSource::kDefault);
  EXPECT_THAT(cli.Setting("listen").values, ElementsAre("127.0.0.1:7070"));
  EXPECT_EQ(cli.config->path(), "");  // the default file is missing
}

TEST(DaemonOptionsTest, TheFileSetsWhatTheFlagsWould) {
  TempFile file(
      "state_dir: /var/lib/s\n"
      "listen: unix:/run/dlbatch.sock\n"
      "heartbeat_interval: 500ms\n"
      "keep_ended: never\n"
      "forget_offline_after: 0\n"
      "fair_share_half_life: 0\n"
      "restart_grace: 1m\n"
      "max_diary_bytes: 1GiB\n"
      "max_output_bytes: 10G\n"
      "min_free_mb: 1\n"
      "socket_mode: '0666'\n"
      "shared_visibility: true\n"
      "sync_full: true\n"
      "profile: [cpu, gpu=4]\n"
      "profiles:\n"
      "  big: {max_pool: 16}\n");
  DaemonCommandLine cli;
  absl::StatusOr<DaemonOptions> o = cli.Run({"--config", file.path()});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->state_dir, "/var/lib/s");
  EXPECT_TRUE(o->endpoint.is_unix);
  EXPECT_EQ(o->endpoint.path, "/run/dlbatch.sock");
  EXPECT_EQ(o->scheduler.heartbeat_interval_ms, 500);
  EXPECT_EQ(o->scheduler.keep_ended_ms, 0);
  EXPECT_EQ(o->scheduler.retention_interval_ms, 60000);  // unused
  EXPECT_EQ(o->scheduler.forget_offline_ms, 0);
  EXPECT_EQ(o->scheduler.fair_share_half_life_ms, 0);
  EXPECT_EQ(o->scheduler.restart_grace_ms, 60000);
  EXPECT_EQ(o->scheduler.max_diary_bytes, int64_t{1} << 30);
  EXPECT_EQ(o->scheduler.max_output_bytes, int64_t{10} << 30);
  EXPECT_EQ(o->min_free_bytes, int64_t{1} << 20);
  EXPECT_EQ(o->socket_mode, 0666u);
  EXPECT_TRUE(o->shared_visibility);
  EXPECT_TRUE(o->sync_full);
  // The flags' profiles first, then the file's section.
  ASSERT_EQ(o->profiles.size(), 3u);
  EXPECT_EQ(o->profiles[2].name, "big");
  EXPECT_EQ(o->profiles[2].origin, "file " + file.path() + ":16");
  EXPECT_EQ(o->scheduler.profiles, (std::vector<std::pair<std::string, int>>{
                                       {"cpu", 0}, {"gpu", 4}, {"big", 16}}));
  EXPECT_EQ(cli.Setting("listen").origin, "file " + file.path() + ":2");
  EXPECT_EQ(cli.config->path(), file.path());
}

TEST(DaemonOptionsTest, AFlagBeatsTheFile) {
  TempFile file(
      "state_dir: /from/file\n"
      "listen: unix:/from/file.sock\n"
      "heartbeat_timeout: 30s\n"
      "profile: [a]\n");
  DaemonCommandLine cli;
  absl::StatusOr<DaemonOptions> o =
      cli.Run({"--config", file.path(), "--listen", "unix:/from/flag.sock",
               "--heartbeat-timeout", "45s", "--profile", "c"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->state_dir, "/from/file");
  EXPECT_EQ(o->endpoint.path, "/from/flag.sock");
  EXPECT_EQ(o->scheduler.heartbeat_timeout_ms, 45000);
  // A list's flag replaces the file's list.
  ASSERT_EQ(o->profiles.size(), 1u);
  EXPECT_EQ(o->profiles[0].name, "c");
  EXPECT_EQ(cli.Setting("listen").origin, "flag --listen");
  EXPECT_EQ(cli.Setting("state_dir").origin, "file " + file.path() + ":1");
}

TEST(DaemonOptionsTest, NoEnvironmentVariableStandsBetween) {
  TempFile file("state_dir: /from/file\nlisten: unix:/from/file.sock\n");
  ::setenv("DLBATCH_SCHEDULER", "unix:/from/env.sock", 1);
  ::setenv("DLBATCH_CA", "/from/env/ca.pem", 1);
  DaemonCommandLine cli;
  absl::StatusOr<DaemonOptions> o = cli.Run({"--config", file.path()});
  ::unsetenv("DLBATCH_SCHEDULER");
  ::unsetenv("DLBATCH_CA");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint.path, "/from/file.sock");
  for (const ConfigSetting& s : cli.config->Settings()) {
    EXPECT_NE(s.source, ConfigSource::kEnv) << s.key;
  }
}

TEST(DaemonOptionsTest, ShortRetentionIsLookedAtOftenEnough) {
  DaemonCommandLine twelve_hours;
  auto o = twelve_hours.Run({"--state-dir", "/s", "--keep-ended", "12h"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->scheduler.keep_ended_ms, 12 * 3600 * 1000);
  EXPECT_EQ(o->scheduler.retention_interval_ms, 60000);
  DaemonCommandLine one_second;
  o = one_second.Run({"--state-dir", "/s", "--keep-ended", "1000ms"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->scheduler.keep_ended_ms, 1000);
  EXPECT_EQ(o->scheduler.retention_interval_ms, 200);
}

TEST(DaemonOptionsTest, SlurmProfilesNeedTcp) {
  TempFile file(
      "state_dir: /s\n"
      "profiles:\n"
      "  cluster: {type: slurm, partition: gpu}\n");
  EXPECT_EQ(Refusal({"--config", file.path(), "--listen", "unix:/s.sock"}),
            "profile 'cluster' (file " + file.path() +
                ":3) is of type slurm: its jobs' workers reach the scheduler "
                "over TCP with a token of their own; listen on TCP (--listen "
                "HOST:PORT)");
  DaemonCommandLine cli;
  auto o = cli.Run({"--config", file.path(), "--listen", "0.0.0.0:7070"});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->scheduler.slurm_profiles.size(), 1u);
  EXPECT_EQ(o->scheduler.slurm_profiles[0].partition, "gpu");
}

TEST(DaemonOptionsTest, EachListenerChecksOnlyItsOwnFlags) {
  // A Unix socket has no certificate; TCP has no socket mode.
  EXPECT_EQ(Refusal({"--state-dir", "/s", "--listen", "unix:/s.sock",
                     "--tls-cert", "/c.pem", "--tls-name", "bad name!"}),
            "");
  EXPECT_EQ(Refusal({"--state-dir", "/s", "--listen", "127.0.0.1:0",
                     "--socket-mode", "999"}),
            "");
  // The operator's certificate names itself: --tls-name is not looked at.
  EXPECT_EQ(Refusal({"--state-dir", "/s", "--tls-cert", "/c.pem", "--tls-key",
                     "/k.pem", "--tls-name", "bad name!"}),
            "");
}

struct BadValue {
  std::vector<std::string> args;
  std::string message;
};

TEST(DaemonOptionsTest, BadValuesSayWhatToWrite) {
  const std::string duration =
      " is not a duration; write e.g. 90s, 30m, 1h30m or 2d";
  const std::string size = ": write a size in bytes, e.g. 1048576, 64MiB or 2G";
  const std::string unix_listen = "--listen=unix:/s.sock";
  const std::vector<BadValue> cases = {
      {{"--listen", "nonsense"},
       "address 'nonsense' is neither unix:PATH nor HOST:PORT"},
      {{"--heartbeat-interval", "soon"},
       "--heartbeat-interval: 'soon'" + duration},
      {{"--heartbeat-timeout", "0"}, "--heartbeat-timeout: '0'" + duration},
      {{"--cancel-grace", "5x"}, "--cancel-grace: '5x'" + duration},
      {{"--max-diary-bytes", "lots"}, "--max-diary-bytes lots" + size},
      {{"--max-output-bytes", "-1"}, "--max-output-bytes -1" + size},
      {{"--keep-ended", "eternity"}, "--keep-ended: 'eternity'" + duration},
      {{"--forget-offline-after", "x"},
       "--forget-offline-after: 'x'" + duration},
      {{"--fair-share-half-life", "never"},
       "--fair-share-half-life: 'never'" + duration},
      {{"--restart-grace", "x"}, "--restart-grace: 'x'" + duration},
      {{"--auth-deadline", "x"}, "--auth-deadline: 'x'" + duration},
      {{"--max-unauthenticated", "0"},
       "--max-unauthenticated must be at least 1"},
      {{unix_listen, "--socket-mode", "999"},
       "--socket-mode 999: write permissions in octal, e.g. 0600 or 0666"},
      {{unix_listen, "--socket-mode", "07777"},
       "--socket-mode 07777: write permissions in octal, e.g. 0600 or 0666"},
      {{unix_listen, "--socket-mode", ""},
       "--socket-mode : write permissions in octal, e.g. 0600 or 0666"},
      {{"--tls-cert", "/c.pem"},
       "--tls-cert and --tls-key go together; pass both"},
      {{"--tls-key", "/k.pem"},
       "--tls-cert and --tls-key go together; pass both"},
      {{"--tls-name", "bad name!"},
       "--tls-name 'bad name!': write a DNS name (letters, digits, '-', '.') "
       "or an IP address clients reach the scheduler by"},
      {{"--profile", "bad=x"}, "--profile bad=x: write NAME or NAME=MAX_POOL"},
  };
  for (const BadValue& c : cases) {
    std::vector<std::string> args = {"--state-dir", "/s"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    EXPECT_EQ(Refusal(args), c.message) << c.args[0];
  }
}

TEST(DaemonOptionsTest, TheFirstBadValueIsTheOneReported) {
  EXPECT_THAT(Refusal({"--state-dir", "/s", "--listen", "nonsense",
                       "--heartbeat-interval", "soon"}),
              HasSubstr("address 'nonsense'"));
  EXPECT_THAT(Refusal({"--state-dir", "/s", "--auth-deadline", "x",
                       "--heartbeat-interval", "soon"}),
              HasSubstr("--heartbeat-interval"));
  EXPECT_THAT(Refusal({"--state-dir", "/s", "--tls-cert", "/c.pem",
                       "--max-unauthenticated", "0"}),
              HasSubstr("--max-unauthenticated"));
}

TEST(DaemonOptionsTest, TheCommandLineItselfIsCheckedByItsParser) {
  EXPECT_THAT(Refusal({}), HasSubstr("--state-dir is required"));
  EXPECT_THAT(Refusal({"--state-dir", "/s", "--max-attempts", "0"}),
              HasSubstr("--max-attempts: Value 0 not in range"));
  EXPECT_THAT(Refusal({"--state-dir", "/s", "--bogus"}), HasSubstr("--bogus"));
}

TEST(DaemonOptionsTest, ABadFileNamesItsLineAndKey) {
  TempFile typo("state_dir: /s\nlisten_typo: 1\n");
  EXPECT_THAT(Refusal({"--config", typo.path()}),
              HasSubstr(typo.path() + ":2: unknown key 'listen_typo'"));
  // A value the file sets is checked as the flag's would be.
  TempFile bad("state_dir: /s\nheartbeat_interval: soon\n");
  EXPECT_EQ(Refusal({"--config", bad.path()}),
            "--heartbeat-interval: 'soon'"
            " is not a duration; write e.g. 90s, 30m, 1h30m or 2d");
  EXPECT_THAT(Refusal({"--config", "/nonexistent/s.yaml", "--state-dir", "/s"}),
              HasSubstr("cannot read configuration file /nonexistent/s.yaml"));
}

}  // namespace
}  // namespace dlbatch::scheduler

namespace dlbatch::scheduler {
namespace {

TEST(DaemonOptionsTest, TheWebFaceIsOffUnlessListenedFor) {
  DaemonCommandLine off;
  auto options = off.Run({"--state-dir", "/tmp/s"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->web);
  EXPECT_EQ(options->web_session_ms, 12 * 3600 * 1000);
  struct Case {
    std::string flag, host;
    int port;
  };
  for (const Case& c : std::vector<Case>{{"8443", "127.0.0.1", 8443},
                                         {":0", "127.0.0.1", 0},
                                         {"0.0.0.0:443", "0.0.0.0", 443},
                                         {"[::1]:8443", "::1", 8443}}) {
    DaemonCommandLine cli;
    auto on = cli.Run({"--state-dir", "/tmp/s", "--web-listen", c.flag,
                       "--web-session-hours", "2"});
    ASSERT_TRUE(on.ok()) << c.flag << ": " << on.status();
    EXPECT_TRUE(on->web);
    EXPECT_EQ(on->web_host, c.host) << c.flag;
    EXPECT_EQ(on->web_port, c.port) << c.flag;
    EXPECT_EQ(on->web_session_ms, 2 * 3600 * 1000);
  }
  for (const std::string bad :
       {"localhost:8443", "127.0.0.1:70000", "::1:80", "1.2.3.4:x", "[::1]"}) {
    EXPECT_THAT(Refusal({"--state-dir", "/tmp/s", "--web-listen", bad}),
                HasSubstr("--web-listen " + bad + ": "))
        << bad;
  }
  EXPECT_THAT(Refusal({"--state-dir", "/tmp/s", "--web-session-hours", "0"}),
              HasSubstr("--web-session-hours 0: write a number of hours"));
}

}  // namespace
}  // namespace dlbatch::scheduler
