// Feeds a configuration file (config_file.h) and environment variables into
// a CLI11 program's options, keeping where each value came from.
//
// Every long option of the app itself (not of its subcommands) is a key:
// --state-dir is `state_dir`. Before the command line is parsed, Load()
// sets each option from the file, as if that were its default; the command
// line then overrides it. An option's environment variable (SetEnv) is read
// by the program itself where the option is empty, as before there were
// files; when it is set, Load() leaves the file's value out. So the
// precedence is flag > environment > file > default.
#ifndef DLBATCH_COMMON_CONFIG_CLI_H_
#define DLBATCH_COMMON_CONFIG_CLI_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config_file.h"

namespace dlbatch {

class ConfigBinding {
 public:
  // Adds --config FILE to `app`. `default_path` is read when --config is not
  // given, and may be missing; a file named by --config must exist, and
  // --config '' reads none. `app` must outlive this.
  ConfigBinding(CLI::App* app, std::string default_path);

  // The option `flag` ("--ca-file") is overridden by environment variable
  // `env` (see ConfigKey::env_is_value).
  void SetEnv(const std::string& flag, std::string env,
              bool env_is_value = true);
  // The option `flag` may not be set in the file (--ready-file).
  void Exclude(const std::string& flag);
  // The file may hold `section` too (config_file.h's ConfigSection): read
  // by Load, its items then returned by Section().
  void AddSection(ConfigSection section);

  // Before app->parse(argc, argv): finds --config in argv, reads the file
  // and sets the options from it (but those whose variable is set). An error
  // names the file, line and key (or the variable) and says what was expected.
  // REQUIRES: every option is declared.
  absl::Status Load(int argc, const char* const* argv);
  // As above, with the environment read through `getenv` (null: unset).
  absl::Status Load(int argc, const char* const* argv,
                    const std::function<const char*(const char*)>& getenv);

  // After app->parse: each key's value in effect and where it came from.
  std::vector<ConfigSetting> Settings() const;
  // The file read ("" when none was).
  const std::string& path() const { return path_; }
  // After Load: the items of section `name` the file holds.
  const std::vector<ConfigItem>& Section(const std::string& name) const {
    return file_.Section(name);
  }

 private:
  struct Bound {
    CLI::Option* option;
    ConfigKey key;
    std::optional<ConfigSetting> preset;  // from the environment or file
    std::string default_text;
  };
  std::vector<ConfigKey> Keys();

  CLI::App* app_;
  std::string default_path_;
  std::string config_flag_;  // --config's value once parsed
  std::string path_;
  std::vector<std::pair<std::string, ConfigKey>> env_;  // flag, env part
  std::set<std::string> excluded_;
  std::vector<ConfigSection> sections_;
  ConfigFile file_;
  std::vector<Bound> bound_;
};

// `settings` as a table (KEY VALUE SOURCE) or, with `json`, as one JSON
// object {"config_file": PATH, "settings": [{"key", "value", "source",
// "origin"}]}; a list's value is a JSON list. A setting from an environment
// variable that is not its value shows "(set)".
std::string FormatSettings(const std::vector<ConfigSetting>& settings,
                           const std::string& config_file, bool json);

// One line for a daemon's log at start: each setting not at its default,
// "listen=unix:/run/s.sock (file /etc/dlbatch/scheduler.yaml:2), ..."; "" if
// none is.
std::string NonDefaultSettings(const std::vector<ConfigSetting>& settings);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_CONFIG_CLI_H_
