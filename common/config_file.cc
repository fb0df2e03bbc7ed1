#include "common/config_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlbatch {
namespace {

std::string KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::string Expected(const ConfigKey& key) {
  std::string one;
  switch (key.type) {
    case ConfigType::kString:
      one = "a string";
      break;
    case ConfigType::kInteger:
      one = "an integer";
      break;
    case ConfigType::kNumber:
      one = "a number";
      break;
    case ConfigType::kBool:
      one = "true or false";
      break;
  }
  return key.list ? absl::StrCat(one, " or a list of them") : one;
}

// Whether `node` (a scalar) is a value of `type`; booleans are written
// back as "true" or "false".
bool ScalarFits(const YAML::Node& node, ConfigType type, std::string* text) {
  *text = node.Scalar();
  switch (type) {
    case ConfigType::kString:
      return true;
    case ConfigType::kInteger: {
      int64_t n;
      return absl::SimpleAtoi(*text, &n);
    }
    case ConfigType::kNumber: {
      double d;
      return absl::SimpleAtod(*text, &d) && std::isfinite(d);
    }
    case ConfigType::kBool: {
      bool b = false;
      if (!YAML::convert<bool>::decode(node, b)) return false;
      *text = b ? "true" : "false";
      return true;
    }
  }
  return false;
}

std::string DidYouMean(std::string_view name,
                       const std::vector<ConfigKey>& keys) {
  std::string closest;
  size_t best = 3;  // suggest only within two edits
  for (const ConfigKey& k : keys) {
    // Also the flag's own spelling: listen-address, --state-dir.
    std::string plain(name);
    plain.erase(0, plain.find_first_not_of('-'));
    std::replace(plain.begin(), plain.end(), '-', '_');
    size_t d =
        std::min(EditDistance(name, k.name), EditDistance(plain, k.name));
    if (d < best) best = d, closest = k.name;
  }
  return closest.empty() ? ""
                         : absl::StrCat(" (did you mean '", closest, "'?)");
}

}  // namespace

const ConfigEntry* ConfigFile::Find(std::string_view key) const {
  for (const ConfigEntry& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

absl::StatusOr<ConfigFile> ParseConfigFile(std::string_view text,
                                           const std::string& path,
                                           const std::vector<ConfigKey>& keys) {
  auto at = [&](const YAML::Mark& mark, absl::string_view message) {
    if (mark.is_null() || mark.line < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", mark.line + 1, ": ", message));
  };
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(text));
  } catch (const YAML::Exception& e) {
    return at(e.mark, absl::StrCat("malformed YAML: ", e.msg));
  }
  ConfigFile file;
  file.path = path;
  if (documents.empty() || documents[0].IsNull()) return file;
  if (documents.size() > 1) {
    return at(documents[1].Mark(),
              "a second YAML document starts here; a configuration file "
              "holds one mapping (remove the `---` line and what follows)");
  }
  const YAML::Node& root = documents[0];
  if (!root.IsMap()) {
    return at(root.Mark(),
              absl::StrCat("expected a mapping of settings (key: value), got ",
                           KindName(root)));
  }
  std::vector<std::string> names;
  for (const ConfigKey& k : keys) names.push_back(k.name);
  for (const auto& item : root) {
    const YAML::Node& key_node = item.first;
    const YAML::Node& value = item.second;
    const int line = key_node.Mark().line + 1;
    if (!key_node.IsScalar()) {
      return at(key_node.Mark(), absl::StrCat("a key is ", KindName(key_node),
                                              "; keys are plain words"));
    }
    const std::string& name = key_node.Scalar();
    auto key = std::find_if(keys.begin(), keys.end(),
                            [&](const ConfigKey& k) { return k.name == name; });
    if (key == keys.end()) {
      return at(key_node.Mark(),
                absl::StrCat("unknown key '", name, "'", DidYouMean(name, keys),
                             "; known keys: ", absl::StrJoin(names, ", ")));
    }
    if (const ConfigEntry* first = file.Find(name)) {
      return at(key_node.Mark(),
                absl::StrCat("key '", name, "' given twice (first on line ",
                             first->line, "); keep one"));
    }
    if (value.IsNull()) continue;  // `key:` with nothing: unset
    ConfigEntry entry{name, {}, line};
    auto wrong = [&](const YAML::Node& node) {
      YAML::Mark mark = node.Mark();
      if (mark.is_null()) mark = key_node.Mark();
      return at(mark, absl::StrCat("key '", name, "': expected ",
                                   Expected(*key), ", got ", KindName(node)));
    };
    if (value.IsSequence() && key->list) {
      for (const YAML::Node& one : value) {
        std::string text;
        if (!one.IsScalar() || !ScalarFits(one, key->type, &text)) {
          return wrong(one);
        }
        entry.values.push_back(std::move(text));
      }
    } else {
      std::string text;
      if (!value.IsScalar() || !ScalarFits(value, key->type, &text)) {
        return wrong(value);
      }
      entry.values.push_back(std::move(text));
    }
    file.entries.push_back(std::move(entry));
  }
  return file;
}

absl::StatusOr<ConfigFile> LoadConfigFile(const std::string& path,
                                          bool must_exist,
                                          const std::vector<ConfigKey>& keys) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT && !must_exist) return ConfigFile{};
    return absl::NotFoundError(absl::StrCat(
        "cannot read configuration file ", path, ": ", std::strerror(err),
        must_exist ? "; name an existing file with --config" : ""));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return ParseConfigFile(text.str(), path, keys);
}

std::optional<ConfigSetting> PresetFor(
    const ConfigKey& key, const ConfigFile& file,
    const std::function<const char*(const char*)>& getenv) {
  if (!key.env.empty()) {
    const char* env = getenv(key.env.c_str());
    if (env != nullptr && *env != '\0') {
      ConfigSetting s{key.name, ConfigSource::kEnv, {}, "env " + key.env};
      if (key.env_is_value) s.values.push_back(env);
      return s;
    }
  }
  if (const ConfigEntry* entry = file.Find(key.name)) {
    return ConfigSetting{key.name, ConfigSource::kFile, entry->values,
                         absl::StrCat("file ", file.path, ":", entry->line)};
  }
  return std::nullopt;
}

std::string SourceName(ConfigSource source) {
  switch (source) {
    case ConfigSource::kDefault:
      return "default";
    case ConfigSource::kFile:
      return "file";
    case ConfigSource::kEnv:
      return "env";
    case ConfigSource::kFlag:
      return "flag";
  }
  return "default";
}

}  // namespace dlbatch
