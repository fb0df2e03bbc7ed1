// Unit tests of configuration files (common/config_file.h, the pure core,
// and common/config_cli.h, its CLI11 glue) and of versions
// (common/version.h).
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/config_cli.h"
#include "common/config_file.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/temp_file.h"

namespace dlbatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ConfigKey Key(std::string name, ConfigType type = ConfigType::kString,
              bool list = false, std::string env = "",
              bool env_is_value = true) {
  ConfigKey key;
  key.name = std::move(name);
  key.type = type;
  key.list = list;
  key.env = std::move(env);
  key.env_is_value = env_is_value;
  return key;
}

std::vector<ConfigKey> SchedulerKeys() {
  return {Key("listen"), Key("state_dir"),
          Key("cpu_slots", ConfigType::kInteger),
          Key("sync_full", ConfigType::kBool),
          Key("tls_name", ConfigType::kString, /*list=*/true)};
}

TEST(ConfigFileTest, ReadsScalarsListsAndLines) {
  auto file = ParseConfigFile(
      "# a comment\n"
      "listen: 127.0.0.1:7070\n"
      "cpu_slots: 4\n"
      "sync_full: yes\n"
      "tls_name: [a.example, b.example]\n"
      "state_dir:\n",
      "/etc/s.yaml", SchedulerKeys());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->entries.size(), 4u);  // state_dir: with nothing is unset
  EXPECT_EQ(file->Find("listen")->line, 2);
  EXPECT_THAT(file->Find("listen")->values, ElementsAre("127.0.0.1:7070"));
  EXPECT_THAT(file->Find("cpu_slots")->values, ElementsAre("4"));
  EXPECT_THAT(file->Find("sync_full")->values, ElementsAre("true"));
  EXPECT_THAT(file->Find("tls_name")->values,
              ElementsAre("a.example", "b.example"));
  EXPECT_EQ(file->Find("state_dir"), nullptr);
}

TEST(ConfigFileTest, EmptyFileIsEmptyConfiguration) {
  auto file = ParseConfigFile("# nothing yet\n", "f.yaml", SchedulerKeys());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->entries.empty());
}

TEST(ConfigFileTest, UnknownKeyNamesFileLineKeyAndNearest) {
  auto file = ParseConfigFile("listen: x\n\nlistne: y\n", "/etc/s.yaml",
                              SchedulerKeys());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(),
              HasSubstr("/etc/s.yaml:3: unknown key 'listne' (did you mean "
                        "'listen'?)"));
  EXPECT_THAT(file.status().message(), HasSubstr("known keys: listen,"));
  // The flag's own spelling is pointed at its key.
  file = ParseConfigFile("state-dir: /x\n", "s.yaml", SchedulerKeys());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(),
              HasSubstr("s.yaml:1: unknown key 'state-dir' (did you mean "
                        "'state_dir'?)"));
}

TEST(ConfigFileTest, WrongTypesNameLineKeyAndExpected) {
  auto file = ParseConfigFile("listen: a\ncpu_slots: many\n", "w.yaml",
                              SchedulerKeys());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(),
              HasSubstr("w.yaml:2: key 'cpu_slots': expected an integer, got "
                        "'many'"));
  file = ParseConfigFile("sync_full: maybe\n", "w.yaml", SchedulerKeys());
  EXPECT_THAT(file.status().message(),
              HasSubstr("w.yaml:1: key 'sync_full': expected true or false"));
  file = ParseConfigFile("listen: [a, b]\n", "w.yaml", SchedulerKeys());
  EXPECT_THAT(file.status().message(),
              HasSubstr("w.yaml:1: key 'listen': expected a string, got a "
                        "list"));
  file = ParseConfigFile("tls_name:\n  - a\n  - {x: 1}\n", "w.yaml",
                         SchedulerKeys());
  EXPECT_THAT(file.status().message(),
              HasSubstr("w.yaml:3: key 'tls_name': expected a string or a "
                        "list of them, got a mapping"));
}

TEST(ConfigFileTest, RepeatedKeyAndNotAMappingAndBadYaml) {
  auto file =
      ParseConfigFile("listen: a\nlisten: b\n", "r.yaml", SchedulerKeys());
  EXPECT_THAT(file.status().message(),
              HasSubstr("r.yaml:2: key 'listen' given twice (first on line "
                        "1)"));
  file = ParseConfigFile("- listen\n", "r.yaml", SchedulerKeys());
  EXPECT_THAT(file.status().message(),
              HasSubstr("r.yaml:1: expected a mapping of settings"));
  file = ParseConfigFile("listen: [a\n", "r.yaml", SchedulerKeys());
  EXPECT_THAT(file.status().message(), HasSubstr("malformed YAML"));
}

TEST(ConfigFileTest, MissingFileOnlyAnErrorWhenNamed) {
  auto file = LoadConfigFile("/nonexistent/dlbatch.yaml", /*must_exist=*/false,
                             SchedulerKeys());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path, "");
  file = LoadConfigFile("/nonexistent/dlbatch.yaml", /*must_exist=*/true,
                        SchedulerKeys());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(),
              HasSubstr("cannot read configuration file "
                        "/nonexistent/dlbatch.yaml"));
}

TEST(ConfigFileTest, EnvironmentBeatsFileBeatsDefault) {
  ConfigKey ca = Key("ca_file", ConfigType::kString, false, "DLBATCH_CA");
  ConfigKey token = Key("token_file", ConfigType::kString, false,
                        "DLBATCH_TOKEN", /*env_is_value=*/false);
  auto file = ParseConfigFile("ca_file: /f/ca.pem\ntoken_file: /f/token\n",
                              "c.yaml", {ca, token});
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, std::string> env;
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto preset = PresetFor(ca, *file, getenv);
  ASSERT_TRUE(preset.has_value());
  EXPECT_EQ(preset->source, ConfigSource::kFile);
  EXPECT_EQ(preset->origin, "file c.yaml:1");
  env["DLBATCH_CA"] = "/env/ca.pem";
  env["DLBATCH_TOKEN"] = "secret";
  preset = PresetFor(ca, *file, getenv);
  EXPECT_EQ(preset->source, ConfigSource::kEnv);
  EXPECT_THAT(preset->values, ElementsAre("/env/ca.pem"));
  // A token in the environment: the file's token_file is not used, and the
  // token itself is not a value to show.
  preset = PresetFor(token, *file, getenv);
  EXPECT_EQ(preset->source, ConfigSource::kEnv);
  EXPECT_TRUE(preset->values.empty());
  EXPECT_FALSE(PresetFor(Key("listen"), *file, getenv).has_value());
}

// A scratch file removed at the end of the test.
ConfigSection Profiles() {
  return {"profiles",
          "profile",
          {Key("type"), Key("gpus_per_node", ConfigType::kInteger),
           Key("sbatch_args", ConfigType::kString, /*list=*/true)}};
}

TEST(ConfigSectionTest, ReadsItemsTheirKeysAndLines) {
  auto file = ParseConfigFile(
      "listen: a\n"
      "profiles:\n"
      "  cluster:\n"
      "    type: slurm\n"
      "    gpus_per_node: 4\n"
      "    sbatch_args: [--constraint=a100, --exclusive]\n"
      "  plain:\n"
      "  inline: {type: workers}\n",
      "/etc/s.yaml", SchedulerKeys(), {Profiles()});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->Find("listen")->values, ElementsAre("a"));
  const std::vector<ConfigItem>& items = file->Section("profiles");
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].name, "cluster");
  EXPECT_EQ(items[0].line, 3);
  EXPECT_EQ(items[0].Find("gpus_per_node")->line, 5);
  EXPECT_THAT(items[0].Find("sbatch_args")->values,
              ElementsAre("--constraint=a100", "--exclusive"));
  EXPECT_EQ(items[1].name, "plain");
  EXPECT_TRUE(items[1].entries.empty());
  EXPECT_THAT(items[2].Find("type")->values, ElementsAre("workers"));
  EXPECT_TRUE(file->Section("other").empty());
}

TEST(ConfigSectionTest, ErrorsNameFileLineItemAndKey) {
  auto error = [](const std::string& text) {
    auto file =
        ParseConfigFile(text, "/etc/s.yaml", SchedulerKeys(), {Profiles()});
    return file.ok() ? std::string() : std::string(file.status().message());
  };
  EXPECT_THAT(error("profiles:\n  c:\n    type: slurm\n    tpye: x\n"),
              HasSubstr("/etc/s.yaml:4: profile 'c': unknown key 'tpye' (did "
                        "you mean 'type'?); known keys: type, gpus_per_node"));
  EXPECT_THAT(error("profiles:\n  c:\n    gpus_per_node: many\n"),
              HasSubstr("/etc/s.yaml:3: profile 'c': key 'gpus_per_node': "
                        "expected an integer, got 'many'"));
  EXPECT_THAT(error("profiles:\n  c: {}\n  c: {}\n"),
              HasSubstr("/etc/s.yaml:3: profile 'c' given twice (first on "
                        "line 2)"));
  EXPECT_THAT(error("profiles: [a, b]\n"),
              HasSubstr("/etc/s.yaml:1: key 'profiles': expected a mapping of "
                        "profile names to their keys, got a list"));
  EXPECT_THAT(error("profiles:\n  c: slurm\n"),
              HasSubstr("/etc/s.yaml:2: profile 'c': expected a mapping of "
                        "its keys (type: ...), got 'slurm'"));
  EXPECT_THAT(error("profiles: {}\nprofiles: {}\n"),
              HasSubstr("/etc/s.yaml:2: key 'profiles' given twice"));
  // The section is a known key at the top, and suggested.
  EXPECT_THAT(error("profile: {}\n"),
              HasSubstr("unknown key 'profile' (did you mean 'profiles'?)"));
  // Without the section, `profiles:` is an unknown key like any other.
  auto file = ParseConfigFile("profiles: {}\n", "w.yaml", SchedulerKeys());
  EXPECT_THAT(file.status().message(),
              HasSubstr("w.yaml:1: unknown key 'profiles'"));
}

// A key of an item may be a mapping of its own keys, in flow or block
// style, each checked as the item's are.
TEST(ConfigSectionTest, MappingKeysHoldTheirOwnKeys) {
  ConfigSection section = Profiles();
  ConfigKey nested = Key("preemption");
  nested.fields = {Key("mode"), Key("grace")};
  section.keys.push_back(nested);
  auto parse = [&](const std::string& text) {
    return ParseConfigFile(text, "/etc/s.yaml", SchedulerKeys(), {section});
  };
  auto file = parse(
      "profiles:\n"
      "  a: {preemption: {mode: priority, grace: 2m}}\n"
      "  b:\n"
      "    preemption:\n"
      "      mode: off\n"
      "  c: {preemption: {}}\n"
      "  d: {preemption: }\n");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<ConfigItem>& items = file->Section("profiles");
  ASSERT_EQ(items.size(), 4u);
  const ConfigEntry* a = items[0].Find("preemption");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->values.empty());
  EXPECT_THAT(a->Field("mode")->values, ElementsAre("priority"));
  EXPECT_THAT(a->Field("grace")->values, ElementsAre("2m"));
  const ConfigEntry* b = items[1].Find("preemption");
  EXPECT_EQ(b->line, 4);
  EXPECT_EQ(b->Field("mode")->line, 5);
  EXPECT_THAT(b->Field("mode")->values, ElementsAre("off"));
  EXPECT_EQ(b->Field("grace"), nullptr);
  EXPECT_TRUE(items[2].Find("preemption")->fields.empty());
  EXPECT_EQ(items[3].Find("preemption"), nullptr);  // no value: unset

  auto error = [&](const std::string& text) {
    auto f = parse(text);
    return f.ok() ? std::string() : std::string(f.status().message());
  };
  EXPECT_THAT(error("profiles:\n  c:\n    preemption:\n      mdoe: off\n"),
              HasSubstr("/etc/s.yaml:4: profile 'c': key 'preemption': "
                        "unknown key 'mdoe' (did you mean 'mode'?); known "
                        "keys: mode, grace"));
  EXPECT_THAT(error("profiles:\n  c: {preemption: priority}\n"),
              HasSubstr("/etc/s.yaml:2: profile 'c': key 'preemption': "
                        "expected a mapping of its keys (mode, grace), got "
                        "'priority'"));
  EXPECT_THAT(error("profiles:\n  c: {preemption: {mode: [a]}}\n"),
              HasSubstr("profile 'c': key 'preemption': key 'mode': expected "
                        "a string, got a list"));
  EXPECT_THAT(
      error("profiles:\n  c: {preemption: {mode: off, mode: priority}}\n"),
      HasSubstr("profile 'c': key 'preemption': key 'mode' given twice"));
}

struct Program {
  CLI::App app{"test"};
  std::string listen = "127.0.0.1:7070";
  std::string ca_file;
  std::string state_dir;
  int cpu_slots = 0;
  bool sync_full = false;
  std::vector<std::string> tls_names;
  ConfigBinding binding{&app, "/nonexistent/default.yaml"};

  Program() {
    app.add_option("--listen", listen)->capture_default_str();
    app.add_option("--ca-file", ca_file);
    app.add_option("--state-dir", state_dir)->required();
    app.add_option("--cpu-slots", cpu_slots)->check(CLI::PositiveNumber);
    app.add_flag("--sync-full", sync_full);
    app.add_option("--tls-name", tls_names);
    binding.SetEnv("--ca-file", "DLBATCH_TEST_CA");
  }
  // Load, then parse; "" on success, else the error.
  std::string Run(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    absl::Status s = binding.Load(static_cast<int>(argv.size()), argv.data());
    if (!s.ok()) return std::string(s.message());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  }
  ConfigSetting Setting(const std::string& key) const {
    for (const ConfigSetting& s : binding.Settings()) {
      if (s.key == key) return s;
    }
    return {};
  }
};

TEST(ConfigBindingTest, FlagBeatsEnvBeatsFileBeatsDefault) {
  TempFile file(
      "state_dir: /from/file\n"
      "listen: 0.0.0.0:9000\n"
      "ca_file: /file/ca.pem\n"
      "cpu_slots: 3\n"
      "sync_full: true\n"
      "tls_name: [a, b]\n");
  ::setenv("DLBATCH_TEST_CA", "/env/ca.pem", 1);
  Program p;
  ASSERT_EQ(
      p.Run({"--config", file.path(), "--cpu-slots", "5", "--tls-name", "c"}),
      "");
  ::unsetenv("DLBATCH_TEST_CA");
  EXPECT_EQ(p.state_dir, "/from/file");  // required, given by the file
  EXPECT_EQ(p.listen, "0.0.0.0:9000");
  // The program reads DLBATCH_TEST_CA itself; the file's value stays out.
  EXPECT_EQ(p.ca_file, "");
  EXPECT_THAT(p.Setting("ca_file").values, ElementsAre("/env/ca.pem"));
  EXPECT_EQ(p.cpu_slots, 5);
  EXPECT_TRUE(p.sync_full);
  EXPECT_THAT(p.tls_names, ElementsAre("c"));  // the flag replaces the list
  EXPECT_EQ(p.Setting("state_dir").origin, "file " + file.path() + ":1");
  EXPECT_EQ(p.Setting("ca_file").origin, "env DLBATCH_TEST_CA");
  EXPECT_EQ(p.Setting("cpu_slots").origin, "flag --cpu-slots");
  EXPECT_THAT(p.Setting("cpu_slots").values, ElementsAre("5"));
  EXPECT_EQ(p.binding.path(), file.path());
  const std::string line = NonDefaultSettings(p.binding.Settings());
  EXPECT_THAT(line, HasSubstr("cpu_slots=5 (flag --cpu-slots)"));
  EXPECT_THAT(line, HasSubstr("ca_file=/env/ca.pem (env DLBATCH_TEST_CA)"));
  EXPECT_THAT(line, HasSubstr("tls_name=c (flag --tls-name)"));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("listen=127")));
}

TEST(ConfigBindingTest, DefaultsWhenNothingSetsThem) {
  Program p;
  ASSERT_EQ(p.Run({"--state-dir", "/s"}), "");
  EXPECT_EQ(p.listen, "127.0.0.1:7070");
  EXPECT_EQ(p.Setting("listen").source, ConfigSource::kDefault);
  EXPECT_THAT(p.Setting("listen").values, ElementsAre("127.0.0.1:7070"));
  EXPECT_THAT(p.Setting("sync_full").values, ElementsAre("false"));
  EXPECT_EQ(p.binding.path(), "");  // the default path is missing: no file
  std::string table = FormatSettings(p.binding.Settings(), "", false);
  EXPECT_THAT(table, HasSubstr("state_dir"));
  EXPECT_THAT(table, HasSubstr("flag --state-dir"));
  std::string json = FormatSettings(p.binding.Settings(), "", true);
  EXPECT_THAT(json, HasSubstr("\"source\": \"default\""));
}

TEST(ConfigBindingTest, IntegerOptionsWithValidatorsAreIntegerKeys) {
  TempFile file("state_dir: /s\ncpu_slots: lots\n");
  Program p;
  EXPECT_THAT(
      p.Run({"--config", file.path()}),
      HasSubstr(file.path() + ":2: key 'cpu_slots': expected an integer, got "
                              "'lots'"));
}

TEST(ConfigBindingTest, ValidatorFailureNamesFileLineAndKey) {
  TempFile file("state_dir: /s\ncpu_slots: -2\n");
  Program p;
  std::string error = p.Run({"--config=" + file.path()});
  EXPECT_THAT(error, HasSubstr(file.path() + ":2: key 'cpu_slots'"));
  EXPECT_THAT(error, HasSubstr("--cpu-slots"));
}

TEST(ConfigBindingTest, UnknownKeyAndMissingNamedFileAreErrors) {
  TempFile file("state_dir: /s\nlisten_address: x\n");
  Program p;
  EXPECT_THAT(p.Run({"--config", file.path()}),
              HasSubstr(file.path() + ":2: unknown key 'listen_address'"));
  Program q;
  EXPECT_THAT(q.Run({"--config", "/nonexistent/x.yaml"}),
              HasSubstr("cannot read configuration file /nonexistent/x.yaml"));
  Program r;  // --config '' reads no file
  EXPECT_EQ(r.Run({"--config", "", "--state-dir", "/s"}), "");
}

TEST(ConfigBindingTest, SectionsAreReadBesideTheFlags) {
  TempFile file(
      "state_dir: /s\nprofiles:\n  c:\n    type: slurm\n    "
      "gpus_per_node: 2\n");
  Program p;
  p.binding.AddSection(Profiles());
  EXPECT_EQ(p.Run({"--config", file.path()}), "");
  EXPECT_EQ(p.state_dir, "/s");
  ASSERT_EQ(p.binding.Section("profiles").size(), 1u);
  EXPECT_EQ(p.binding.Section("profiles")[0].name, "c");
  EXPECT_THAT(p.binding.Section("profiles")[0].Find("gpus_per_node")->values,
              ElementsAre("2"));
}

TEST(VersionTest, ComparesLeadingNumbers) {
  EXPECT_EQ(CompareVersions("0.1.0", "0.1.0+gabc.dirty"), 0);
  EXPECT_LT(CompareVersions("0.0.9", "0.1.0"), 0);
  EXPECT_GT(CompareVersions("v0.10.0", "0.9.5"), 0);
  EXPECT_EQ(CompareVersions("1", "1.0.0"), 0);
  EXPECT_LT(CompareVersions("garbage", "0.0.1"), 0);
}

TEST(VersionTest, TooOldWorkerNamesBothVersions) {
  EXPECT_TRUE(CheckWorkerVersion("0.2.0", "0.2.0", "0.3.1").ok());
  EXPECT_TRUE(CheckWorkerVersion("", "0.1.0", "0.3.1").ok());
  absl::Status s = CheckWorkerVersion("0.1.5", "0.2.0", "0.3.1");
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_THAT(s.message(), HasSubstr("worker version 0.1.5"));
  EXPECT_THAT(s.message(), HasSubstr("scheduler version 0.3.1"));
  EXPECT_THAT(s.message(), HasSubstr("older than 0.2.0"));
}

TEST(VersionTest, TextNamesVersionAndBuild) {
  std::string text = VersionText("dlbatch-x");
  EXPECT_THAT(text, HasSubstr("dlbatch-x " + std::string(Version())));
  EXPECT_THAT(text, HasSubstr("build type:"));
  EXPECT_THAT(text, HasSubstr("GPU backend:"));
  EXPECT_GE(CompareVersions(Version(), kMinWorkerVersion), 0);
}

}  // namespace
}  // namespace dlbatch
