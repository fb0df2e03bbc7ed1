// Configuration files of the daemons and the CLI (/etc/dlbatch/scheduler.yaml,
// /etc/dlbatch/worker.yaml, ~/.config/dlbatch/config.yaml): a YAML mapping
// whose keys are a program's long flag names with '-' turned into '_'.
//
// The pure core: reading a file's text against the keys a program accepts,
// and choosing each setting's value by precedence (flag > environment >
// file > default). config_cli.h feeds the result into CLI11's options.
#ifndef DLBATCH_COMMON_CONFIG_FILE_H_
#define DLBATCH_COMMON_CONFIG_FILE_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/edit_distance.h"  // EditDistance, for "did you mean"

namespace dlbatch {

enum class ConfigType { kString, kInteger, kNumber, kBool };

// A key a program accepts in its file.
struct ConfigKey {
  std::string name;  // "state_dir"
  ConfigType type = ConfigType::kString;
  // A list key (a repeatable flag) takes a list or a single value.
  bool list = false;
  // The environment variable that overrides the file, or "".
  std::string env;
  // True when `env` holds this setting's value (DLBATCH_CA for ca_file),
  // shown as such; false when it stands in for the setting in another form
  // (DLBATCH_TOKEN, the token itself, for token_file), never shown. Either
  // way the file's value is then not used.
  bool env_is_value = true;
  // A key of a section's item may be a mapping of its own keys, given here
  // (`preemption: {mode: priority, grace: 2m}`); type and list are then
  // unused, and its entry holds `fields` instead of values.
  std::vector<ConfigKey> fields;
};

// One key as written in a file.
struct ConfigEntry {
  std::string key;
  std::vector<std::string> values;  // one for a scalar; a list's items
  int line = 0;                     // 1-based
  std::vector<ConfigEntry> fields;  // a mapping key's (ConfigKey::fields)

  const ConfigEntry* Field(std::string_view key) const;
};

// A key that is no flag: a mapping of named items, each a mapping of its own
// keys (scheduler.yaml's `profiles:`):
//   profiles:
//     gpu: {type: slurm, partition: gpu}
// What the items mean is the program's to check; the file only checks their
// keys and types, as for the settings.
struct ConfigSection {
  std::string name;             // "profiles"
  std::string item;             // "profile", for messages
  std::vector<ConfigKey> keys;  // the keys an item may hold (env unused)
};

// One item of a section as written.
struct ConfigItem {
  std::string name;  // "gpu"
  int line = 0;      // of its name
  std::vector<ConfigEntry> entries;

  const ConfigEntry* Find(std::string_view key) const;
};

struct ConfigFile {
  std::string path;  // "" when no file was read
  std::vector<ConfigEntry> entries;
  // Each section's items in the file's order; a section the file does not
  // have is absent.
  std::vector<std::pair<std::string, std::vector<ConfigItem>>> sections;

  // The entry for `key`, or nullptr.
  const ConfigEntry* Find(std::string_view key) const;
  // The items of section `name` (none when the file has none).
  const std::vector<ConfigItem>& Section(std::string_view name) const;
};

// Parses `text` (named `path` in messages) against `keys` and `sections`.
// Errors name PATH:LINE and the key: an unknown key (with the nearest known
// one and the list of keys), a key given twice, a value of the wrong type
// (what was expected), a file that is not a mapping; in a section's item
// also the item ("profile 'gpu': unknown key 'partiton'"). A key with no
// value (`listen:`) is left unset. An empty file is an empty configuration.
// A mapping key's own keys are checked the same way, messages naming both
// ("profile 'gpu': key 'preemption': unknown key 'mdoe'").
absl::StatusOr<ConfigFile> ParseConfigFile(
    std::string_view text, const std::string& path,
    const std::vector<ConfigKey>& keys,
    const std::vector<ConfigSection>& sections = {});

// Reads and parses `path`. A missing file is an empty configuration when
// `must_exist` is false (the default path), an error when true (--config).
absl::StatusOr<ConfigFile> LoadConfigFile(
    const std::string& path, bool must_exist,
    const std::vector<ConfigKey>& keys,
    const std::vector<ConfigSection>& sections = {});

// Where a setting's value came from.
enum class ConfigSource { kDefault, kFile, kEnv, kFlag };

struct ConfigSetting {
  std::string key;
  ConfigSource source = ConfigSource::kDefault;
  std::vector<std::string> values;  // what the program uses (see below)
  // "flag --listen", "env DLBATCH_CA", "file /etc/x.yaml:3", "default"
  std::string origin;
};

// What a setting is before the command line is read: from the environment
// (where `key.env` is set and not empty), else from `file`, else nullopt
// (the program's default). An env that is not the value (env_is_value
// false) gives a setting with no values. `getenv` is std::getenv in
// programs, a fake in tests.
std::optional<ConfigSetting> PresetFor(
    const ConfigKey& key, const ConfigFile& file,
    const std::function<const char*(const char*)>& getenv);

// "flag", "env", "file" or "default".
std::string SourceName(ConfigSource source);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_CONFIG_FILE_H_
