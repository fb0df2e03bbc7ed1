#include "common/config_cli.h"

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace dlbatch {
namespace {

std::string KeyFor(const std::string& long_name) {
  std::string key = long_name;
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

ConfigType TypeOf(const CLI::Option& option) {
  if (option.get_expected_max() == 0) return ConfigType::kBool;  // a flag
  // "INT", or "INT:POSITIVE" with a validator's name after it.
  const std::string type = option.get_type_name();
  for (const char* integer : {"INT", "UINT"}) {
    if (type == integer || absl::StartsWith(type, absl::StrCat(integer, ":"))) {
      return ConfigType::kInteger;
    }
  }
  if (absl::StartsWith(type, "FLOAT")) return ConfigType::kNumber;
  return ConfigType::kString;
}

std::string ShownValue(const ConfigSetting& s) {
  if (s.source == ConfigSource::kEnv && s.values.empty()) return "(set)";
  if (s.values.empty()) return "-";
  return absl::StrJoin(s.values, ",");
}

}  // namespace

ConfigBinding::ConfigBinding(CLI::App* app, std::string default_path)
    : app_(app), default_path_(std::move(default_path)) {
  app_->add_option("--config", config_flag_,
                   absl::StrCat("Configuration file (YAML; keys are the long "
                                "flags with _ for -). Default: ",
                                default_path_, ", if it exists; '' reads none"))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void ConfigBinding::SetEnv(const std::string& flag, std::string env,
                           bool env_is_value) {
  ConfigKey key;
  key.env = std::move(env);
  key.env_is_value = env_is_value;
  env_.emplace_back(flag, std::move(key));
}

void ConfigBinding::Exclude(const std::string& flag) { excluded_.insert(flag); }

void ConfigBinding::AddSection(ConfigSection section) {
  sections_.push_back(std::move(section));
}

std::vector<ConfigKey> ConfigBinding::Keys() {
  bound_.clear();
  std::vector<ConfigKey> keys;
  for (CLI::Option* option : app_->get_options()) {
    if (option->get_lnames().empty()) continue;  // positional
    const std::string flag = "--" + option->get_lnames().front();
    if (flag == "--config" || flag == "--help" || flag == "--version" ||
        excluded_.count(flag) > 0) {
      continue;
    }
    ConfigKey key;
    key.name = KeyFor(option->get_lnames().front());
    key.type = TypeOf(*option);
    key.list = option->get_expected_max() > 1;
    for (const auto& [f, env] : env_) {
      if (f == flag) {
        key.env = env.env;
        key.env_is_value = env.env_is_value;
      }
    }
    // The default as help would show it, without changing what help shows.
    const std::string help_default = option->get_default_str();
    option->capture_default_str();
    std::string default_text = option->get_default_str();
    option->default_str(help_default);
    if (key.type == ConfigType::kBool && default_text.empty()) {
      default_text = "false";
    }
    if (key.list && default_text == "[]") default_text.clear();
    bound_.push_back(Bound{option, key, std::nullopt, default_text});
    keys.push_back(std::move(key));
  }
  return keys;
}

absl::Status ConfigBinding::Load(int argc, const char* const* argv) {
  return Load(argc, argv, [](const char* name) {
    return static_cast<const char*>(std::getenv(name));
  });
}

absl::Status ConfigBinding::Load(
    int argc, const char* const* argv,
    const std::function<const char*(const char*)>& getenv) {
  bool named = false;
  std::string path = default_path_;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    // The last --config counts, as for CLI11 (TakeLast).
    if (arg == "--config" && i + 1 < argc) {
      path = argv[++i];
      named = true;
    } else if (absl::ConsumePrefix(&arg, "--config=")) {
      path = std::string(arg);
      named = true;
    }
  }
  std::vector<ConfigKey> keys = Keys();
  ConfigFile file;
  if (!path.empty()) {
    absl::StatusOr<ConfigFile> loaded =
        LoadConfigFile(path, named, keys, sections_);
    if (!loaded.ok()) {
      // --help and --version still answer with a broken file.
      for (int i = 1; i < argc; ++i) {
        absl::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h" || arg == "--version") {
          return absl::OkStatus();
        }
      }
      return loaded.status();
    }
    file = *std::move(loaded);
  }
  path_ = file.path;
  file_ = file;
  for (Bound& b : bound_) {
    b.preset = PresetFor(b.key, file, getenv);
    // The program reads its environment variables itself (its messages
    // name them); one that is set only keeps the file's value out.
    if (!b.preset || b.preset->source != ConfigSource::kFile) continue;
    try {
      b.option->add_result(b.preset->values);
      b.option->run_callback();
    } catch (const CLI::Error& e) {
      b.option->clear();
      absl::string_view where = b.preset->origin;
      absl::ConsumePrefix(&where, "file ");
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": key '", b.key.name, "': ", e.what(),
                       absl::StrCat("; fix it in ", file.path, " or pass --",
                                    b.option->get_lnames().front())));
    }
    b.option->clear();  // the command line may still set it
    if (b.option->get_required()) b.option->required(false);
  }
  return absl::OkStatus();
}

std::vector<ConfigSetting> ConfigBinding::Settings() const {
  std::vector<ConfigSetting> out;
  for (const Bound& b : bound_) {
    if (b.option->count() > 0) {
      ConfigSetting s{b.key.name, ConfigSource::kFlag, {}, ""};
      s.origin = "flag --" + b.option->get_lnames().front();
      s.values = b.option->results();
      if (b.key.type == ConfigType::kBool) s.values = {"true"};
      out.push_back(std::move(s));
    } else if (b.preset) {
      out.push_back(*b.preset);
    } else {
      ConfigSetting s{b.key.name, ConfigSource::kDefault, {}, "default"};
      if (!b.default_text.empty()) s.values.push_back(b.default_text);
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::string FormatSettings(const std::vector<ConfigSetting>& settings,
                           const std::string& config_file, bool json) {
  if (json) {
    nlohmann::json j;
    j["config_file"] = config_file;
    j["settings"] = nlohmann::json::array();
    for (const ConfigSetting& s : settings) {
      nlohmann::json one;
      one["key"] = s.key;
      if (s.source == ConfigSource::kEnv && s.values.empty()) {
        one["value"] = "(set)";
      } else if (s.values.size() == 1) {
        one["value"] = s.values[0];
      } else {
        one["value"] = s.values;
      }
      one["source"] = SourceName(s.source);
      one["origin"] = s.origin;
      j["settings"].push_back(std::move(one));
    }
    return j.dump(2) + "\n";
  }
  size_t key_width = 3, value_width = 5;
  for (const ConfigSetting& s : settings) {
    key_width = std::max(key_width, s.key.size());
    value_width = std::max(value_width, ShownValue(s).size());
  }
  auto row = [&](const std::string& key, const std::string& value,
                 const std::string& source) {
    return absl::StrCat(key, std::string(key_width + 2 - key.size(), ' '),
                        value, std::string(value_width + 2 - value.size(), ' '),
                        source, "\n");
  };
  std::string out = absl::StrCat(
      "configuration file: ", config_file.empty() ? "(none)" : config_file,
      "\n");
  out += row("KEY", "VALUE", "SOURCE");
  for (const ConfigSetting& s : settings) {
    out += row(s.key, ShownValue(s), s.origin);
  }
  return out;
}

std::string NonDefaultSettings(const std::vector<ConfigSetting>& settings) {
  std::vector<std::string> parts;
  for (const ConfigSetting& s : settings) {
    if (s.source == ConfigSource::kDefault) continue;
    parts.push_back(
        absl::StrCat(s.key, "=", ShownValue(s), " (", s.origin, ")"));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace dlbatch
