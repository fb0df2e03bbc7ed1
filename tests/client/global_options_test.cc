// The CLI's global options as the commands see them: their defaults, what
// config.yaml presets, what the environment overrides, and the flag over
// both (client/global_options.h, client/commands_config.h); and the exit
// codes of command lines that fail before any scheduler is asked
// (client/app.h).
#include "client/global_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/app.h"
#include "client/commands_config.h"
#include "common/usage_exit.h"
#include "tests/common/temp_file.h"

namespace dlbatch::client {
namespace {

using ::testing::HasSubstr;

// A fake environment, read by the configuration binding and by
// ChooseScheduler as the CLI reads the real one.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> Getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

// The global options and the configuration binding as the CLI declares
// them, with one command (`jobs`) that only records that it ran.
struct GlobalCommandLine {
  CLI::App app{"test"};
  GlobalFlags flags;
  int rc = -1;
  bool ran = false;
  FakeEnv env;
  std::unique_ptr<ConfigBinding> binding;

  GlobalCommandLine() {
    app.require_subcommand(1);
    AddGlobalOptions(app, &flags);
    app.add_subcommand("jobs", "List jobs")->callback([this] { ran = true; });
    binding = AddConfigCommands(app, &flags, &rc);
  }
  // Load, then parse; "" on success, else the error.
  std::string Run(std::vector<std::string> args) {
    args.insert(args.begin(), "dlbatch");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    absl::Status s =
        binding->Load(static_cast<int>(argv.size()), argv.data(), env.Getenv());
    if (!s.ok()) return std::string(s.message());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  }
  ConfigSetting Setting(const std::string& key) const {
    for (const ConfigSetting& s : binding->Settings()) {
      if (s.key == key) return s;
    }
    return {};
  }
};

TEST(GlobalOptionsTest, DefaultsAreTheLocalClusterAndThirtySecondsOfRetry) {
  GlobalCommandLine cli;
  ASSERT_EQ(cli.Run({"--config", "", "jobs"}), "");
  EXPECT_TRUE(cli.ran);
  EXPECT_EQ(cli.flags.scheduler, "");
  EXPECT_EQ(cli.flags.token_file, "");
  EXPECT_EQ(cli.flags.ca_file, "");
  EXPECT_EQ(cli.flags.retry_for_ms, 30000);
  EXPECT_EQ(cli.flags.default_profile, "");
  EXPECT_EQ(cli.Setting("retry_for").source, ConfigSource::kDefault);
  EXPECT_THAT(cli.Setting("retry_for").values, ::testing::ElementsAre("30s"));
  EXPECT_EQ(cli.binding->path(), "");
}

TEST(GlobalOptionsTest, TheConfigurationFilePresetsEachOption) {
  TempFile file(
      "scheduler: sched.example:7070\n"
      "token_file: /home/ann/token\n"
      "ca_file: /home/ann/ca.pem\n"
      "retry_for: 2m\n"
      "default_profile: gpu\n");
  GlobalCommandLine cli;
  ASSERT_EQ(cli.Run({"--config", file.path(), "jobs"}), "");
  EXPECT_EQ(cli.flags.scheduler, "sched.example:7070");
  EXPECT_EQ(cli.flags.token_file, "/home/ann/token");
  EXPECT_EQ(cli.flags.ca_file, "/home/ann/ca.pem");
  EXPECT_EQ(cli.flags.retry_for_ms, 120000);
  EXPECT_EQ(cli.flags.default_profile, "gpu");
  EXPECT_EQ(cli.Setting("scheduler").origin, "file " + file.path() + ":1");
  EXPECT_EQ(cli.Setting("retry_for").origin, "file " + file.path() + ":4");
  EXPECT_EQ(cli.binding->path(), file.path());
}

TEST(GlobalOptionsTest, AnEnvironmentVariableKeepsTheFilesValueOut) {
  TempFile file(
      "scheduler: unix:/from/file.sock\n"
      "token_file: /from/file/token\n"
      "ca_file: /from/file/ca.pem\n");
  GlobalCommandLine cli;
  cli.env.vars = {{"DLBATCH_SCHEDULER", "unix:/from/env.sock"},
                  {"DLBATCH_TOKEN", "secret-from-env"},
                  {"DLBATCH_CA", "/from/env/ca.pem"}};
  ASSERT_EQ(cli.Run({"--config", file.path(), "jobs"}), "");
  // The flags stay empty: the connection reads the variables itself.
  EXPECT_EQ(cli.flags.scheduler, "");
  EXPECT_EQ(cli.flags.token_file, "");
  EXPECT_EQ(cli.flags.ca_file, "");
  const SchedulerChoice choice = ChooseScheduler(cli.flags, cli.env.Getenv());
  EXPECT_EQ(choice.address, "unix:/from/env.sock");
  EXPECT_EQ(choice.token_file, "");
  EXPECT_EQ(choice.token, "secret-from-env");
  EXPECT_EQ(cli.Setting("scheduler").origin, "env DLBATCH_SCHEDULER");
  EXPECT_EQ(cli.Setting("ca_file").origin, "env DLBATCH_CA");
  // The token itself is never shown, only that it is set.
  EXPECT_EQ(cli.Setting("token_file").origin, "env DLBATCH_TOKEN");
  EXPECT_TRUE(cli.Setting("token_file").values.empty());
}

TEST(GlobalOptionsTest, AFlagBeatsTheEnvironmentAndTheFile) {
  TempFile file(
      "scheduler: unix:/from/file.sock\n"
      "retry_for: 2m\n"
      "default_profile: gpu\n");
  GlobalCommandLine cli;
  cli.env.vars["DLBATCH_SCHEDULER"] = "unix:/from/env.sock";
  ASSERT_EQ(
      cli.Run({"--config", file.path(), "--scheduler", "unix:/from/flag.sock",
               "--retry-for", "0", "--default-profile", "cpu", "jobs"}),
      "");
  EXPECT_EQ(cli.flags.scheduler, "unix:/from/flag.sock");
  EXPECT_EQ(ChooseScheduler(cli.flags, cli.env.Getenv()).address,
            "unix:/from/flag.sock");
  EXPECT_EQ(cli.flags.retry_for_ms, 0);
  EXPECT_EQ(cli.flags.default_profile, "cpu");
  EXPECT_EQ(cli.Setting("scheduler").origin, "flag --scheduler");
  EXPECT_EQ(cli.Setting("retry_for").origin, "flag --retry-for");
}

TEST(GlobalOptionsTest, GlobalOptionsMayFollowTheCommand) {
  GlobalCommandLine cli;
  ASSERT_EQ(cli.Run({"jobs", "--config", "", "--scheduler", "unix:/s.sock",
                     "--retry-for", "90s"}),
            "");
  EXPECT_TRUE(cli.ran);
  EXPECT_EQ(cli.flags.scheduler, "unix:/s.sock");
  EXPECT_EQ(cli.flags.retry_for_ms, 90000);
}

TEST(GlobalOptionsTest, ABadRetryForIsAUsageErrorThatSaysWhatADurationIs) {
  GlobalCommandLine cli;
  std::vector<const char*> argv = {"dlbatch",     "--config", "",
                                   "--retry-for", "soon",     "jobs"};
  ASSERT_TRUE(
      cli.binding->Load(static_cast<int>(argv.size()), argv.data()).ok());
  try {
    cli.app.parse(static_cast<int>(argv.size()), argv.data());
    FAIL() << "parsed a bad --retry-for";
  } catch (const CLI::ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--retry-for: 'soon' is not a duration; "
                                    "write e.g. 90s"));
    testing::internal::CaptureStderr();
    EXPECT_EQ(ExitForParseError(cli.app, e), kExitUsage);
    testing::internal::GetCapturedStderr();
  }
  EXPECT_FALSE(cli.ran);
}

TEST(GlobalOptionsTest, ABadValueInTheFileNamesItsLineAndTheFlag) {
  TempFile file("scheduler: unix:/s.sock\nretry_for: soon\n");
  GlobalCommandLine cli;
  const std::string error = cli.Run({"--config", file.path(), "jobs"});
  EXPECT_EQ(error, file.path() +
                       ":2: key 'retry_for': --retry-for: 'soon' is not a "
                       "duration; write e.g. 90s, 30m, 1h30m or 2d; fix it "
                       "in " +
                       file.path() + " or pass --retry-for");
  EXPECT_FALSE(cli.ran);
}

TEST(GlobalOptionsTest, AnUnknownKeyInTheFileSuggestsTheNearest) {
  TempFile file("schedular: unix:/s.sock\n");
  GlobalCommandLine cli;
  EXPECT_THAT(cli.Run({"--config", file.path(), "jobs"}),
              HasSubstr(":1: unknown key 'schedular' (did you mean "
                        "'scheduler'?); known keys: scheduler, token_file, "
                        "ca_file, retry_for, default_profile"));
}

TEST(ParseRetryForMsTest, ZeroOrADuration) {
  EXPECT_EQ(*ParseRetryForMs("0"), 0);
  EXPECT_EQ(*ParseRetryForMs("90s"), 90000);
  EXPECT_EQ(*ParseRetryForMs("2m"), 120000);
  EXPECT_EQ(*ParseRetryForMs("1h30m"), 5400000);
  EXPECT_THAT(ParseRetryForMs("soon").status().message(),
              HasSubstr("'soon' is not a duration"));
  EXPECT_FALSE(ParseRetryForMs("").ok());
}

TEST(ChooseSchedulerTest, TheFlagThenTheEnvironmentThenTheLocalCluster) {
  FakeEnv env;
  GlobalFlags flags;
  EXPECT_EQ(ChooseScheduler(flags, env.Getenv()).address, "");  // local
  env.vars["DLBATCH_SCHEDULER"] = "";
  EXPECT_EQ(ChooseScheduler(flags, env.Getenv()).address, "");
  env.vars["DLBATCH_SCHEDULER"] = "h:1";
  EXPECT_EQ(ChooseScheduler(flags, env.Getenv()).address, "h:1");
  flags.scheduler = "unix:/s.sock";
  EXPECT_EQ(ChooseScheduler(flags, env.Getenv()).address, "unix:/s.sock");
}

TEST(ChooseSchedulerTest, ATokenFileBeatsTheTokenInTheEnvironment) {
  FakeEnv env;
  GlobalFlags flags;
  SchedulerChoice none = ChooseScheduler(flags, env.Getenv());
  EXPECT_EQ(none.token_file, "");
  EXPECT_EQ(none.token, "");
  env.vars["DLBATCH_TOKEN"] = "abc";
  SchedulerChoice from_env = ChooseScheduler(flags, env.Getenv());
  EXPECT_EQ(from_env.token_file, "");
  EXPECT_EQ(from_env.token, "abc");
  flags.token_file = "/t/token";
  SchedulerChoice from_file = ChooseScheduler(flags, env.Getenv());
  EXPECT_EQ(from_file.token_file, "/t/token");
  EXPECT_EQ(from_file.token, "");
}

// RunCommandLine with `args` after the program's name; stderr is dropped.
int RunCli(std::vector<std::string> args) {
  args.insert(args.begin(), "dlbatch");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  const int rc = RunCommandLine(static_cast<int>(args.size()), argv.data());
  testing::internal::GetCapturedStdout();
  testing::internal::GetCapturedStderr();
  return rc;
}

TEST(RunCommandLineTest, ExitCodesBeforeAnySchedulerIsAsked) {
  EXPECT_EQ(RunCli({"--help"}), 0);
  EXPECT_EQ(RunCli({"--version"}), 0);
  EXPECT_EQ(RunCli({"--config", "", "config"}), 0);
  EXPECT_EQ(RunCli({"--config", ""}), kExitUsage);  // no command: the list
  EXPECT_EQ(RunCli({"--config", "", "dairy", "3"}), kExitUsage);
  EXPECT_EQ(RunCli({"--config", "", "--retry-for", "soon", "jobs"}),
            kExitUsage);
  EXPECT_EQ(RunCli({"--config", "", "wait", "1", "--timeout", "xyz"}),
            kExitUsage);
  EXPECT_EQ(RunCli({"--config", "", "show"}), kExitUsage);
  EXPECT_EQ(RunCli({"--config", "/nonexistent/config.yaml", "jobs"}), 1);
  // An unreachable scheduler, tried once.
  EXPECT_EQ(
      RunCli({"--config", "", "--scheduler", "unix:/nonexistent/dlbatch.sock",
              "--retry-for", "0", "jobs"}),
      1);
}

}  // namespace
}  // namespace dlbatch::client
