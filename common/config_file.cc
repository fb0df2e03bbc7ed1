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
#include "common/status.h"

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
  if (!key.fields.empty()) {
    std::vector<std::string> names;
    for (const ConfigKey& f : key.fields) names.push_back(f.name);
    return absl::StrCat("a mapping of its keys (", absl::StrJoin(names, ", "),
                        ")");
  }
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
                       const std::vector<std::string>& names) {
  std::string closest;
  size_t best = 3;  // suggest only within two edits
  for (const std::string& k : names) {
    // Also the flag's own spelling: listen-address, --state-dir.
    std::string plain(name);
    plain.erase(0, plain.find_first_not_of('-'));
    std::replace(plain.begin(), plain.end(), '-', '_');
    size_t d = std::min(EditDistance(name, k), EditDistance(plain, k));
    if (d < best) best = d, closest = k;
  }
  return closest.empty() ? ""
                         : absl::StrCat(" (did you mean '", closest, "'?)");
}

// An error at a place of the file.
class Where {
 public:
  explicit Where(const std::string& path) : path_(path) {}
  absl::Status operator()(const YAML::Mark& mark,
                          absl::string_view message) const {
    if (mark.is_null() || mark.line < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": ", message));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ":", mark.line + 1, ": ", message));
  }

 private:
  const std::string& path_;
};

// Reads the keys of mapping `map` against `keys` into `entries`. `owner`
// prefixes messages about an item ("profile 'gpu': "); `more` are further
// names allowed at this level, handed to `other` (the sections).
absl::Status ReadMapping(
    const YAML::Node& map, const std::vector<ConfigKey>& keys, const Where& at,
    const std::string& owner, const std::vector<std::string>& more,
    const std::function<absl::Status(const YAML::Node&, const YAML::Node&)>&
        other,
    std::vector<ConfigEntry>* entries) {
  std::vector<std::string> names;
  for (const ConfigKey& k : keys) names.push_back(k.name);
  names.insert(names.end(), more.begin(), more.end());
  std::vector<std::pair<std::string, int>> seen;
  for (const auto& item : map) {
    const YAML::Node& key_node = item.first;
    const YAML::Node& value = item.second;
    const int line = key_node.Mark().line + 1;
    if (!key_node.IsScalar()) {
      return at(key_node.Mark(),
                absl::StrCat(owner, "a key is ", KindName(key_node),
                             "; keys are plain words"));
    }
    const std::string& name = key_node.Scalar();
    for (const auto& [before, before_line] : seen) {
      if (before == name) {
        return at(key_node.Mark(), absl::StrCat(owner, "key '", name,
                                                "' given twice (first on line ",
                                                before_line, "); keep one"));
      }
    }
    seen.emplace_back(name, line);
    if (std::find(more.begin(), more.end(), name) != more.end()) {
      RETURN_IF_ERROR(other(key_node, value));
      continue;
    }
    auto key = std::find_if(keys.begin(), keys.end(),
                            [&](const ConfigKey& k) { return k.name == name; });
    if (key == keys.end()) {
      return at(key_node.Mark(),
                absl::StrCat(owner, "unknown key '", name, "'",
                             DidYouMean(name, names),
                             "; known keys: ", absl::StrJoin(names, ", ")));
    }
    if (value.IsNull()) continue;  // `key:` with nothing: unset
    ConfigEntry entry{name, {}, line, {}};
    auto wrong = [&](const YAML::Node& node) {
      YAML::Mark mark = node.Mark();
      if (mark.is_null()) mark = key_node.Mark();
      return at(mark, absl::StrCat(owner, "key '", name, "': expected ",
                                   Expected(*key), ", got ", KindName(node)));
    };
    if (!key->fields.empty()) {
      if (!value.IsMap()) return wrong(value);
      RETURN_IF_ERROR(ReadMapping(value, key->fields, at,
                                  absl::StrCat(owner, "key '", name, "': "), {},
                                  nullptr, &entry.fields));
      entries->push_back(std::move(entry));
      continue;
    }
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
    entries->push_back(std::move(entry));
  }
  return absl::OkStatus();
}

// A section's value: a mapping of item names to mappings of their keys.
absl::StatusOr<std::vector<ConfigItem>> ReadSection(
    const ConfigSection& section, const YAML::Node& key_node,
    const YAML::Node& value, const Where& at) {
  std::vector<ConfigItem> items;
  if (value.IsNull()) return items;
  if (!value.IsMap()) {
    return at(value.Mark().is_null() ? key_node.Mark() : value.Mark(),
              absl::StrCat("key '", section.name, "': expected a mapping of ",
                           section.item, " names to their keys, got ",
                           KindName(value)));
  }
  for (const auto& one : value) {
    const YAML::Node& name = one.first;
    if (!name.IsScalar() || name.Scalar().empty()) {
      return at(
          name.Mark(),
          absl::StrCat("key '", section.name, "': a ", section.item,
                       " name is ", KindName(name), "; names are plain words"));
    }
    for (const ConfigItem& before : items) {
      if (before.name == name.Scalar()) {
        return at(name.Mark(), absl::StrCat(section.item, " '", name.Scalar(),
                                            "' given twice (first on line ",
                                            before.line, "); keep one"));
      }
    }
    ConfigItem item{name.Scalar(), name.Mark().line + 1, {}};
    const std::string owner =
        absl::StrCat(section.item, " '", item.name, "': ");
    if (!one.second.IsNull()) {
      if (!one.second.IsMap()) {
        return at(one.second.Mark().is_null() ? name.Mark() : one.second.Mark(),
                  absl::StrCat(owner, "expected a mapping of its keys (",
                               section.keys.empty() ? std::string()
                                                    : section.keys[0].name,
                               ": ...), got ", KindName(one.second)));
      }
      RETURN_IF_ERROR(ReadMapping(one.second, section.keys, at, owner, {},
                                  nullptr, &item.entries));
    }
    items.push_back(std::move(item));
  }
  return items;
}

const ConfigEntry* FindEntry(const std::vector<ConfigEntry>& entries,
                             std::string_view key) {
  for (const ConfigEntry& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

}  // namespace

const ConfigEntry* ConfigFile::Find(std::string_view key) const {
  return FindEntry(entries, key);
}

const ConfigEntry* ConfigItem::Find(std::string_view key) const {
  return FindEntry(entries, key);
}

const ConfigEntry* ConfigEntry::Field(std::string_view key) const {
  return FindEntry(fields, key);
}

const std::vector<ConfigItem>& ConfigFile::Section(
    std::string_view name) const {
  static const std::vector<ConfigItem>* const kNone =
      new std::vector<ConfigItem>();
  for (const auto& [section, items] : sections) {
    if (section == name) return items;
  }
  return *kNone;
}

absl::StatusOr<ConfigFile> ParseConfigFile(
    std::string_view text, const std::string& path,
    const std::vector<ConfigKey>& keys,
    const std::vector<ConfigSection>& sections) {
  Where at(path);
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
  std::vector<std::string> section_names;
  for (const ConfigSection& s : sections) section_names.push_back(s.name);
  auto read_section = [&](const YAML::Node& key_node,
                          const YAML::Node& value) -> absl::Status {
    const ConfigSection& section = *std::find_if(
        sections.begin(), sections.end(),
        [&](const ConfigSection& s) { return s.name == key_node.Scalar(); });
    ASSIGN_OR_RETURN(std::vector<ConfigItem> items,
                     ReadSection(section, key_node, value, at));
    file.sections.emplace_back(section.name, std::move(items));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(ReadMapping(root, keys, at, "", section_names, read_section,
                              &file.entries));
  return file;
}

absl::StatusOr<ConfigFile> LoadConfigFile(
    const std::string& path, bool must_exist,
    const std::vector<ConfigKey>& keys,
    const std::vector<ConfigSection>& sections) {
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
  return ParseConfigFile(text.str(), path, keys, sections);
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
