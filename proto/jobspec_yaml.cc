// job.yaml -> v1::JobSpec. The parser walks the YAML tree once, checking
// every key against the table of keys allowed where it stands, and records
// where each field was written so that ValidateJobSpec's messages (which
// begin with the dotted path of the field they concern) can point back at
// the line. yaml-cpp throws; nothing thrown leaves this file.
#include "proto/jobspec_yaml.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/duration.h"
#include "common/edit_distance.h"
#include "common/files.h"
#include "proto/array_spec.h"
#include "proto/jobspec_sweep.h"

namespace dlbatch {
namespace {

// One value in the tree, with what messages need to name it.
struct Value {
  const YAML::Node& node;
  YAML::Mark mark;   // the value's position, or its key's where it has none
  std::string path;  // dotted field path: "train.options.solver"
};

using Handler = std::function<absl::Status(const Value&)>;

// A key allowed in a mapping and what to do with its value.
struct KeyHandler {
  absl::string_view key;
  Handler handle;
};

absl::string_view KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a single value";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::string Child(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// `status` with the place of the field its message begins with in front:
// walks up "a.b[2].c" -> "a.b[2]" -> "a.b" -> "a" until `where` knows one
// ("job.yaml:12:5"); else `source` alone.
absl::Status LocateField(
    const std::function<std::optional<std::string>(const std::string&)>& where,
    const std::string& source, const absl::Status& status) {
  absl::string_view message = status.message();
  std::string path(message.substr(0, message.find_first_of(" :(")));
  while (!path.empty()) {
    if (std::optional<std::string> at = where(path)) {
      return absl::Status(status.code(), absl::StrCat(*at, ": ", message));
    }
    size_t cut = path.find_last_of(".[");
    if (cut == std::string::npos) break;
    path.resize(cut);
  }
  return absl::Status(status.code(), absl::StrCat(source, ": ", message));
}

// Walks one document. Single use: construct, call Parse once.
class JobYamlParser {
 public:
  explicit JobYamlParser(const std::string& source_name)
      : source_(source_name) {}

  absl::StatusOr<ParsedJobFile> Parse(std::string_view text);
  // Sets one train.options key from a YAML scalar's text, through the same
  // handler `train.options:` uses; `path` names the value in messages.
  absl::Status ApplyOption(absl::string_view option, const std::string& text,
                           const std::string& path, v1::TrainingOptions* o);

 private:
  // "job.yaml:12:5" (1-based), or just "job.yaml" for an unknown position.
  std::string Where(const YAML::Mark& mark) const;
  absl::Status ErrorAt(const YAML::Mark& mark, absl::string_view message) const;

  // Dispatches each key of a mapping to its handler; an unknown or repeated
  // key is an error at the key. A null value reads as an empty mapping.
  absl::Status ParseMap(const Value& v, const std::vector<KeyHandler>& keys);
  // Calls `each` for every item of a list, with paths "path[i]".
  absl::Status ParseList(const Value& v,
                         const std::function<absl::Status(const Value&)>& each);
  // A single string, or a list of them.
  absl::Status ParseStrings(const Value& v, std::vector<std::string>* out);

  template <typename T>
  absl::StatusOr<T> Scalar(const Value& v);
  // A handler that reads a T and passes it to `set`.
  template <typename T, typename Setter>
  Handler Into(Setter set) {
    return [this, set](const Value& v) -> absl::Status {
      absl::StatusOr<T> x = Scalar<T>(v);
      if (!x.ok()) return x.status();
      set(*std::move(x));
      return absl::OkStatus();
    };
  }

  absl::Status ParseTop(const Value& root);
  absl::Status ParseCommand(const Value& v);
  absl::Status ParseEnv(const Value& v);
  absl::Status ParseTimeLimit(const Value& v);
  absl::Status ParseTrain(const Value& v, v1::TrainSpec* train);
  absl::Status ParseNetwork(const Value& v, v1::NetworkSpec* network);
  absl::Status ParseLayer(const Value& v, v1::LayerSpec* layer);
  absl::Status ParsePadding(const Value& v, v1::LayerSpec* layer);
  absl::Status ParseData(const Value& v, v1::DataSpec* data);
  absl::Status ParseSource(const Value& v, v1::DataSource* source);
  absl::Status ParseAugmentation(const Value& v, v1::Augmentation* aug);
  absl::Status ParseOptions(const Value& v, v1::TrainingOptions* options);
  // The keys of train.options and how each sets its field in `o`.
  std::vector<KeyHandler> OptionHandlers(v1::TrainingOptions* o);
  absl::Status ParseSweep(const Value& v);
  absl::Status ParseSchedule(const Value& v, v1::LearnRateSchedule* schedule);

  // ValidateJobSpec's error, located at the field its message begins with.
  absl::Status Locate(const absl::Status& status) const;

  const std::string source_;
  ParsedJobFile result_;
  // Where each field path was written, for Locate().
  absl::flat_hash_map<std::string, YAML::Mark> marks_;
  std::optional<YAML::Mark> command_mark_, train_mark_, nodes_mark_;
};

std::string JobYamlParser::Where(const YAML::Mark& mark) const {
  if (mark.is_null() || mark.line < 0) return source_;
  return absl::StrCat(source_, ":", mark.line + 1, ":", mark.column + 1);
}

absl::Status JobYamlParser::ErrorAt(const YAML::Mark& mark,
                                    absl::string_view message) const {
  std::string where = Where(mark);
  if (where.empty()) return absl::InvalidArgumentError(message);
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
}

absl::Status JobYamlParser::ParseMap(const Value& v,
                                     const std::vector<KeyHandler>& keys) {
  if (v.node.IsNull()) return absl::OkStatus();
  if (!v.node.IsMap()) {
    return ErrorAt(v.mark, absl::StrCat(v.path.empty() ? "job file" : v.path,
                                        ": expected a mapping (key: value), "
                                        "got ",
                                        KindName(v.node)));
  }
  const std::string where_text =
      v.path.empty() ? "at top level" : absl::StrCat("in ", v.path);
  absl::flat_hash_map<std::string, YAML::Mark> seen;
  for (const auto& entry : v.node) {
    const YAML::Node& key = entry.first;
    const YAML::Node& value = entry.second;
    if (!key.IsScalar()) {
      return ErrorAt(key.Mark(),
                     absl::StrCat("a key ", where_text, " is ", KindName(key),
                                  "; keys are plain words"));
    }
    const std::string& name = key.Scalar();
    auto handler =
        std::find_if(keys.begin(), keys.end(),
                     [&](const KeyHandler& k) { return k.key == name; });
    if (handler == keys.end()) {
      std::vector<absl::string_view> allowed;
      for (const KeyHandler& k : keys) allowed.push_back(k.key);
      std::string hint = DidYouMean(name, allowed);
      return ErrorAt(
          key.Mark(),
          absl::StrCat("unknown key '", name, "' ", where_text, hint,
                       "; allowed keys: ", absl::StrJoin(allowed, ", ")));
    }
    auto [first, inserted] = seen.try_emplace(name, key.Mark());
    if (!inserted) {
      return ErrorAt(
          key.Mark(),
          absl::StrCat("key '", name, "' given twice ", where_text,
                       " (first at ", Where(first->second), "); keep one"));
    }
    // An empty value's mark is where the next token starts; use the key's.
    YAML::Mark mark = value.Mark();
    if (mark.is_null() || value.IsNull()) mark = key.Mark();
    Value child{value, mark, Child(v.path, name)};
    marks_[child.path] = value.IsScalar() ? mark : key.Mark();
    absl::Status s = handler->handle(child);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobYamlParser::ParseList(
    const Value& v, const std::function<absl::Status(const Value&)>& each) {
  if (v.node.IsNull()) return absl::OkStatus();
  if (!v.node.IsSequence()) {
    return ErrorAt(v.mark, absl::StrCat(v.path, ": expected a list, got ",
                                        KindName(v.node)));
  }
  size_t i = 0;
  for (const YAML::Node& item : v.node) {
    YAML::Mark mark = item.Mark();
    if (mark.is_null()) mark = v.mark;
    Value child{item, mark, absl::StrCat(v.path, "[", i++, "]")};
    marks_[child.path] = mark;
    absl::Status s = each(child);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobYamlParser::ParseStrings(const Value& v,
                                         std::vector<std::string>* out) {
  if (v.node.IsScalar()) {
    out->push_back(v.node.Scalar());
    return absl::OkStatus();
  }
  if (!v.node.IsSequence()) {
    return ErrorAt(v.mark, absl::StrCat(v.path,
                                        ": expected a string or a list of "
                                        "strings, got ",
                                        KindName(v.node)));
  }
  return ParseList(v, [&](const Value& item) -> absl::Status {
    absl::StatusOr<std::string> s = Scalar<std::string>(item);
    if (!s.ok()) return s.status();
    out->push_back(*std::move(s));
    return absl::OkStatus();
  });
}

template <typename T>
absl::StatusOr<T> JobYamlParser::Scalar(const Value& v) {
  absl::string_view expected;
  if constexpr (std::is_same_v<T, std::string>) {
    expected = "a string";
  } else if constexpr (std::is_same_v<T, bool>) {
    expected = "true or false";
  } else if constexpr (std::is_floating_point_v<T>) {
    expected = "a number";
  } else if constexpr (std::is_unsigned_v<T>) {
    expected = "a non-negative integer";
  } else {
    expected = "an integer";
  }
  if (!v.node.IsScalar()) {
    return ErrorAt(v.mark, absl::StrCat(v.path, ": expected ", expected,
                                        ", got ", KindName(v.node)));
  }
  const std::string& text = v.node.Scalar();
  auto wrong = [&] {
    return ErrorAt(v.mark, absl::StrCat(v.path, ": expected ", expected,
                                        ", got '", text, "'"));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    return text;
  } else if constexpr (std::is_same_v<T, bool>) {
    bool b = false;
    if (!YAML::convert<bool>::decode(v.node, b)) return wrong();
    return b;
  } else if constexpr (std::is_floating_point_v<T>) {
    double d = 0;
    if (!absl::SimpleAtod(text, &d) || !std::isfinite(d)) return wrong();
    if (std::is_same_v<T, float> && std::fabs(d) > FLT_MAX) {
      return ErrorAt(v.mark,
                     absl::StrCat(v.path, ": ", text, " is out of range"));
    }
    return static_cast<T>(d);
  } else {
    T x{};
    if (!absl::SimpleAtoi(text, &x)) {
      // Distinguish "too big" from "not an integer at all".
      absl::string_view digits = text;
      if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
        if (std::is_unsigned_v<T> && digits[0] == '-') return wrong();
        digits.remove_prefix(1);
      }
      if (!digits.empty() &&
          std::all_of(digits.begin(), digits.end(),
                      [](char c) { return c >= '0' && c <= '9'; })) {
        return ErrorAt(v.mark,
                       absl::StrCat(v.path, ": ", text, " is out of range"));
      }
      return wrong();
    }
    return x;
  }
}

absl::StatusOr<ParsedJobFile> JobYamlParser::Parse(std::string_view text) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(text));
  } catch (const YAML::Exception& e) {
    return ErrorAt(e.mark, absl::StrCat("malformed YAML: ", e.msg));
  }
  if (documents.size() > 1) {
    return ErrorAt(documents[1].Mark(),
                   "a second YAML document starts here; a job file holds "
                   "one job (remove the `---` line and what follows, or "
                   "split it into files)");
  }
  YAML::Mark start;  // 1:1
  YAML::Node root = documents.empty() ? YAML::Node() : documents[0];
  if (root.IsNull()) {
    return ErrorAt(start,
                   "the job file is empty; it needs at least `command:` or "
                   "`train:`");
  }
  absl::Status s = ParseTop(Value{root, start, ""});
  if (!s.ok()) return s;
  if (command_mark_ && train_mark_) {
    const YAML::Mark& later =
        command_mark_->pos > train_mark_->pos ? *command_mark_ : *train_mark_;
    return ErrorAt(later,
                   "job has both `command:` and `train:`; keep one (a job "
                   "either runs a program or trains a network)");
  }
  s = ValidateJobSpec(result_.spec);
  if (!s.ok()) return Locate(s);
  if (result_.spec.sweep().axes_size() > 0) {
    // Every value, and every combination, must make a valid job.
    absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandSweep(result_.spec);
    if (!jobs.ok()) return Locate(jobs.status());
  }
  result_.source = source_;
  for (const auto& [path, mark] : marks_) result_.where[path] = Where(mark);
  return std::move(result_);
}

absl::Status JobYamlParser::Locate(const absl::Status& status) const {
  return LocateField(
      [&](const std::string& path) -> std::optional<std::string> {
        auto it = marks_.find(path);
        if (it == marks_.end()) return std::nullopt;
        return Where(it->second);
      },
      source_, status);
}

absl::Status JobYamlParser::ParseTop(const Value& root) {
  v1::JobSpec& spec = result_.spec;
  return ParseMap(
      root,
      {
          {"name", Into<std::string>([&](std::string x) { spec.set_name(x); })},
          {"profile",
           Into<std::string>([&](std::string x) { spec.set_profile(x); })},
          {"pool",
           [&](const Value& v) -> absl::Status {
             absl::StatusOr<int32_t> pool = Scalar<int32_t>(v);
             if (!pool.ok()) return pool.status();
             if (*pool == 0) {
               return ErrorAt(v.mark,
                              "pool: must be at least 1 (GPUs or CPU slots "
                              "the job needs at once); leave it out for 1");
             }
             spec.set_pool(*pool);
             return absl::OkStatus();
           }},
          {"priority", Into<int32_t>([&](int32_t x) { spec.set_priority(x); })},
          {"time_limit", [&](const Value& v) { return ParseTimeLimit(v); }},
          {"preemptible", Into<bool>([&](bool x) { spec.set_preemptible(x); })},
          {"preempt_signal", Into<std::string>([&](std::string x) {
             spec.set_preempt_signal(x);
           })},
          {"launch",
           Into<std::string>([&](std::string x) { spec.set_launch(x); })},
          {"max_nodes",
           [&](const Value& v) -> absl::Status {
             if (nodes_mark_) {
               return ErrorAt(v.mark,
                              "max_nodes: `nodes` already gives it; keep one");
             }
             nodes_mark_ = v.mark;
             return Into<int32_t>([&](int32_t x) { spec.set_max_nodes(x); })(v);
           }},
          {"nodes",
           [&](const Value& v) -> absl::Status {
             if (nodes_mark_) {
               return ErrorAt(v.mark,
                              "nodes: `max_nodes` already gives it; keep one");
             }
             nodes_mark_ = v.mark;
             marks_["max_nodes"] = v.mark;
             return Into<int32_t>([&](int32_t x) { spec.set_max_nodes(x); })(v);
           }},
          {"attach",
           [&](const Value& v) -> absl::Status {
             absl::Status s = ParseStrings(v, &result_.attach);
             if (s.ok() &&
                 std::find(result_.attach.begin(), result_.attach.end(), "") !=
                     result_.attach.end()) {
               return ErrorAt(v.mark,
                              "attach: an entry is empty; name a "
                              "file or folder to upload");
             }
             return s;
           }},
          {"env", [&](const Value& v) { return ParseEnv(v); }},
          {"command", [&](const Value& v) { return ParseCommand(v); }},
          {"train",
           [&](const Value& v) {
             train_mark_ = v.mark;
             // Read into a local: setting the oneof would clear `command`,
             // which the both-given check after the walk still needs to see.
             v1::TrainSpec train;
             absl::Status s = ParseTrain(v, &train);
             if (s.ok() && !command_mark_)
               *spec.mutable_train() = std::move(train);
             return s;
           }},
          {"sweep", [&](const Value& v) { return ParseSweep(v); }},
          {"array",
           [&](const Value& v) -> absl::Status {
             absl::StatusOr<std::string> text = Scalar<std::string>(v);
             if (!text.ok()) return text.status();
             // Checked here, at its line; ValidateJobSpec checks it again.
             absl::StatusOr<ArraySpec> array = ParseArraySpec(*text);
             if (!array.ok()) return ErrorAt(v.mark, array.status().message());
             spec.set_array(*std::move(text));
             return absl::OkStatus();
           }},
          {"checkpoint",
           Into<std::string>([&](std::string x) { spec.set_checkpoint(x); })},
      });
}

absl::Status JobYamlParser::ParseCommand(const Value& v) {
  command_mark_ = v.mark;
  std::vector<std::string> argv;
  if (v.node.IsScalar()) {
    // One string is a shell command line.
    argv = {"sh", "-c", v.node.Scalar()};
  } else if (v.node.IsSequence()) {
    absl::Status s = ParseStrings(v, &argv);
    if (!s.ok()) return s;
  } else {
    return ErrorAt(v.mark,
                   absl::StrCat("command: expected a list like [python3, "
                                "train.py] or one shell command line, got ",
                                KindName(v.node)));
  }
  if (train_mark_) return absl::OkStatus();  // reported by Parse()
  v1::CommandSpec* command = result_.spec.mutable_command();
  for (std::string& arg : argv) command->add_argv(std::move(arg));
  return absl::OkStatus();
}

absl::Status JobYamlParser::ParseEnv(const Value& v) {
  if (v.node.IsNull()) return absl::OkStatus();
  if (!v.node.IsMap()) {
    return ErrorAt(v.mark, absl::StrCat("env: expected a mapping NAME: value, "
                                        "got ",
                                        KindName(v.node)));
  }
  auto* env = result_.spec.mutable_env();
  for (const auto& entry : v.node) {
    const YAML::Node& key = entry.first;
    const YAML::Node& value = entry.second;
    if (!key.IsScalar()) {
      return ErrorAt(key.Mark(),
                     absl::StrCat("env: a variable name is ", KindName(key)));
    }
    const std::string& name = key.Scalar();
    std::string path = absl::StrCat("env.", name);
    if (env->contains(name)) {
      return ErrorAt(key.Mark(), absl::StrCat(path, ": given twice; keep one"));
    }
    if (value.IsNull()) {
      return ErrorAt(key.Mark(), absl::StrCat(path, ": has no value; write ",
                                              name, ": \"\" for an empty one"));
    }
    YAML::Mark mark = value.Mark();
    if (mark.is_null()) mark = key.Mark();
    marks_[path] = key.Mark();
    absl::StatusOr<std::string> text = Scalar<std::string>({value, mark, path});
    if (!text.ok()) return text.status();
    (*env)[name] = *std::move(text);
  }
  return absl::OkStatus();
}

absl::Status JobYamlParser::ParseTimeLimit(const Value& v) {
  if (!v.node.IsScalar()) {
    return ErrorAt(v.mark, absl::StrCat("time_limit: expected a duration such "
                                        "as 30m, 1h30m or 90s, got ",
                                        KindName(v.node)));
  }
  absl::StatusOr<std::string> text = Scalar<std::string>(v);
  if (!text.ok()) return text.status();
  int64_t zero = -1;
  if (absl::SimpleAtoi(*text, &zero) && zero == 0) {
    return ErrorAt(v.mark,
                   "time_limit: must be more than 0; leave it out for no "
                   "limit");
  }
  absl::StatusOr<int64_t> seconds = ParseDurationSeconds(*text);
  if (!seconds.ok()) {
    return ErrorAt(v.mark,
                   absl::StrCat("time_limit: ", seconds.status().message()));
  }
  result_.spec.set_time_limit_s(*seconds);
  return absl::OkStatus();
}

absl::Status JobYamlParser::ParseTrain(const Value& v, v1::TrainSpec* train) {
  return ParseMap(
      v,
      {
          {"network",
           [&](const Value& c) {
             return ParseNetwork(c, train->mutable_network());
           }},
          {"data",
           [&](const Value& c) { return ParseData(c, train->mutable_data()); }},
          {"options",
           [&](const Value& c) {
             return ParseOptions(c, train->mutable_options());
           }},
      });
}

absl::Status JobYamlParser::ParseNetwork(const Value& v,
                                         v1::NetworkSpec* network) {
  return ParseMap(
      v, {
             {"input",
              [&](const Value& c) {
                return ParseList(c, [&](const Value& item) -> absl::Status {
                  absl::StatusOr<int32_t> x = Scalar<int32_t>(item);
                  if (!x.ok()) return x.status();
                  network->add_input(*x);
                  return absl::OkStatus();
                });
              }},
             {"layers",
              [&](const Value& c) {
                return ParseList(c, [&](const Value& item) {
                  return ParseLayer(item, network->add_layers());
                });
              }},
         });
}

absl::Status JobYamlParser::ParseLayer(const Value& v, v1::LayerSpec* layer) {
  if (v.node.IsScalar()) {  // "- relu" is short for "- {type: relu}"
    layer->set_type(v.node.Scalar());
    return absl::OkStatus();
  }
  if (!v.node.IsMap()) {
    return ErrorAt(v.mark, absl::StrCat(v.path,
                                        ": expected a layer like {type: conv, "
                                        "filters: 20, size: 5}, got ",
                                        KindName(v.node)));
  }
  return ParseMap(
      v,
      {
          {"type",
           Into<std::string>([&](std::string x) { layer->set_type(x); })},
          {"name",
           Into<std::string>([&](std::string x) { layer->set_name(x); })},
          {"filters", Into<int32_t>([&](int32_t x) { layer->set_filters(x); })},
          {"size", Into<int32_t>([&](int32_t x) { layer->set_size(x); })},
          {"stride", Into<int32_t>([&](int32_t x) { layer->set_stride(x); })},
          {"padding", [&](const Value& c) { return ParsePadding(c, layer); }},
          {"units", Into<int32_t>([&](int32_t x) { layer->set_units(x); })},
          {"alpha", Into<float>([&](float x) { layer->set_alpha(x); })},
          {"probability",
           Into<float>([&](float x) { layer->set_probability(x); })},
          {"epsilon", Into<float>([&](float x) { layer->set_epsilon(x); })},
          {"sync", Into<bool>([&](bool x) { layer->set_sync(x); })},
          {"inputs",
           [&](const Value& c) -> absl::Status {
             std::vector<std::string> inputs;
             absl::Status s = ParseStrings(c, &inputs);
             for (std::string& i : inputs) layer->add_inputs(std::move(i));
             return s;
           }},
      });
}

absl::Status JobYamlParser::ParsePadding(const Value& v, v1::LayerSpec* layer) {
  if (v.node.IsScalar() && v.node.Scalar() == "same") {
    layer->set_padding_same(true);
    return absl::OkStatus();
  }
  int32_t padding = 0;
  if (!v.node.IsScalar() || !absl::SimpleAtoi(v.node.Scalar(), &padding)) {
    return ErrorAt(
        v.mark,
        absl::StrCat(v.path,
                     ": expected a number of pixels or "
                     "`same`, got ",
                     v.node.IsScalar() ? absl::StrCat("'", v.node.Scalar(), "'")
                                       : std::string(KindName(v.node))));
  }
  layer->set_padding(padding);
  return absl::OkStatus();
}

absl::Status JobYamlParser::ParseData(const Value& v, v1::DataSpec* data) {
  return ParseMap(
      v, {
             {"train",
              [&](const Value& c) {
                return ParseSource(c, data->mutable_train());
              }},
             {"validation",
              [&](const Value& c) {
                return ParseSource(c, data->mutable_validation());
              }},
             {"test",
              [&](const Value& c) {
                return ParseSource(c, data->mutable_test());
              }},
             {"normalize", Into<bool>([&](bool x) { data->set_normalize(x); })},
             {"augmentation",
              [&](const Value& c) {
                return ParseAugmentation(c, data->mutable_augmentation());
              }},
             {"validation_split",
              Into<double>([&](double x) { data->set_validation_split(x); })},
         });
}

absl::Status JobYamlParser::ParseSource(const Value& v,
                                        v1::DataSource* source) {
  return ParseMap(
      v, {
             {"format",
              Into<std::string>([&](std::string x) { source->set_format(x); })},
             {"images",
              Into<std::string>([&](std::string x) { source->set_images(x); })},
             {"labels",
              Into<std::string>([&](std::string x) { source->set_labels(x); })},
             {"files",
              [&](const Value& c) -> absl::Status {
                std::vector<std::string> files;
                absl::Status s = ParseStrings(c, &files);
                for (std::string& f : files) source->add_files(std::move(f));
                return s;
              }},
             {"path",
              Into<std::string>([&](std::string x) { source->set_path(x); })},
             {"skip_bad_images",
              Into<bool>([&](bool x) { source->set_skip_bad_images(x); })},
         });
}

absl::Status JobYamlParser::ParseAugmentation(const Value& v,
                                              v1::Augmentation* aug) {
  return ParseMap(
      v,
      {
          {"random_x_reflection",
           Into<bool>([&](bool x) { aug->set_random_x_reflection(x); })},
          {"random_y_reflection",
           Into<bool>([&](bool x) { aug->set_random_y_reflection(x); })},
          {"random_x_translation",
           Into<int32_t>([&](int32_t x) { aug->set_random_x_translation(x); })},
          {"random_y_translation",
           Into<int32_t>([&](int32_t x) { aug->set_random_y_translation(x); })},
          {"random_crop_padding",
           Into<int32_t>([&](int32_t x) { aug->set_random_crop_padding(x); })},
      });
}

absl::Status JobYamlParser::ParseOptions(const Value& v,
                                         v1::TrainingOptions* o) {
  return ParseMap(v, OptionHandlers(o));
}

std::vector<KeyHandler> JobYamlParser::OptionHandlers(v1::TrainingOptions* o) {
  return {
      {"solver", Into<std::string>([o](std::string x) { o->set_solver(x); })},
      {"initial_learn_rate",
       Into<double>([o](double x) { o->set_initial_learn_rate(x); })},
      {"momentum", Into<double>([o](double x) { o->set_momentum(x); })},
      {"l2_regularization",
       Into<double>([o](double x) { o->set_l2_regularization(x); })},
      {"gradient_threshold",
       Into<double>([o](double x) { o->set_gradient_threshold(x); })},
      {"learn_rate_schedule",
       [this, o](const Value& c) {
         return ParseSchedule(c, o->mutable_learn_rate_schedule());
       }},
      {"mini_batch_size",
       Into<int32_t>([o](int32_t x) { o->set_mini_batch_size(x); })},
      {"max_epochs", Into<int32_t>([o](int32_t x) { o->set_max_epochs(x); })},
      {"max_iterations",
       Into<int64_t>([o](int64_t x) { o->set_max_iterations(x); })},
      {"shuffle", Into<std::string>([o](std::string x) { o->set_shuffle(x); })},
      {"validation_frequency",
       Into<int64_t>([o](int64_t x) { o->set_validation_frequency(x); })},
      {"validation_patience",
       Into<int32_t>([o](int32_t x) { o->set_validation_patience(x); })},
      {"verbose_frequency",
       Into<int64_t>([o](int64_t x) { o->set_verbose_frequency(x); })},
      {"execution_environment", Into<std::string>([o](std::string x) {
         o->set_execution_environment(x);
       })},
      {"checkpoint_frequency",
       Into<int32_t>([o](int32_t x) { o->set_checkpoint_frequency(x); })},
      {"checkpoint_frequency_unit", Into<std::string>([o](std::string x) {
         o->set_checkpoint_frequency_unit(x);
       })},
      {"seed", Into<uint64_t>([o](uint64_t x) { o->set_seed(x); })},
      {"gradient_decay_factor",
       Into<double>([o](double x) { o->set_gradient_decay_factor(x); })},
      {"squared_gradient_decay_factor", Into<double>([o](double x) {
         o->set_squared_gradient_decay_factor(x);
       })},
      {"epsilon", Into<double>([o](double x) { o->set_epsilon(x); })},
      {"precision",
       Into<std::string>([o](std::string x) { o->set_precision(x); })},
      {"nesterov", Into<bool>([o](bool x) { o->set_nesterov(x); })},
      {"label_smoothing",
       Into<double>([o](double x) { o->set_label_smoothing(x); })},
  };
}

absl::Status JobYamlParser::ParseSweep(const Value& v) {
  if (v.node.IsNull()) return absl::OkStatus();
  if (!v.node.IsMap()) {
    return ErrorAt(v.mark, absl::StrCat("sweep: expected a mapping of "
                                        "train.options keys, env.NAME or "
                                        "args to lists of values, like "
                                        "`initial_learn_rate: [0.1, 0.01]`, "
                                        "got ",
                                        KindName(v.node)));
  }
  v1::TrainingOptions scratch;  // the values are only checked here
  const std::vector<KeyHandler> handlers = OptionHandlers(&scratch);
  v1::SweepSpec* sweep = result_.spec.mutable_sweep();
  for (const auto& entry : v.node) {
    const YAML::Node& key = entry.first;
    const YAML::Node& values = entry.second;
    if (!key.IsScalar()) {
      return ErrorAt(key.Mark(), absl::StrCat("sweep: a key is ", KindName(key),
                                              "; keys are train.options "
                                              "names, env.NAME or args"));
    }
    const std::string& option = key.Scalar();
    const std::string path = absl::StrCat("sweep.", option);
    const bool env = absl::StartsWith(option, kSweepEnvPrefix);
    const bool args = option == kSweepArgs;
    auto handler =
        std::find_if(handlers.begin(), handlers.end(),
                     [&](const KeyHandler& k) { return k.key == option; });
    if (!env && !args && handler == handlers.end()) {
      std::vector<absl::string_view> allowed = {"env.NAME", "args"};
      for (const KeyHandler& k : handlers) allowed.push_back(k.key);
      return ErrorAt(key.Mark(),
                     absl::StrCat("sweep: unknown option '", option, "'",
                                  DidYouMean(option, allowed),
                                  "; a sweep varies env.NAME (a variable of "
                                  "the job's environment), args (arguments "
                                  "appended to a command) or a train.options "
                                  "key: ",
                                  absl::StrJoin(allowed.begin() + 2,
                                                allowed.end(), ", ")));
    }
    if (env && option.size() == kSweepEnvPrefix.size()) {
      return ErrorAt(key.Mark(), absl::StrCat(path,
                                              ": names no variable; write "
                                              "env.NAME, like env.LR"));
    }
    for (const v1::SweepAxis& axis : sweep->axes()) {
      if (axis.option() == option) {
        return ErrorAt(key.Mark(), absl::StrCat(path,
                                                ": given twice; keep "
                                                "one list"));
      }
    }
    marks_[path] = key.Mark();
    YAML::Mark mark = values.Mark();
    if (mark.is_null() || values.IsNull()) mark = key.Mark();
    if (!values.IsSequence()) {
      const std::string one =
          args ? "[[--lr, 0.1], [--lr, 0.01]]"
               : absl::StrCat("[", values.IsScalar() ? values.Scalar() : "a",
                              ", b]");
      return ErrorAt(
          mark, absl::StrCat(path, ": expected a list of values like ", one,
                             ", got ", KindName(values), "; for one value set ",
                             args  ? "the command's arguments"
                             : env ? option
                                   : absl::StrCat("train.options.", option),
                             " instead"));
    }
    if (values.size() == 0) {
      return ErrorAt(mark, absl::StrCat(path,
                                        ": the list is empty; give at "
                                        "least one value"));
    }
    v1::SweepAxis* axis = sweep->add_axes();
    axis->set_option(option);
    absl::Status s =
        ParseList({values, mark, path}, [&](const Value& item) -> absl::Status {
          std::string text;
          if (args) {
            // One argument, or a list of them ([] for none).
            std::vector<std::string> list;
            if (absl::Status got = ParseStrings(item, &list); !got.ok()) {
              return got;
            }
            text = SweepArgsText(list);
            axis->add_arg_lists()->mutable_args()->Add(list.begin(),
                                                       list.end());
          } else if (!item.node.IsScalar()) {
            return ErrorAt(
                item.mark,
                absl::StrCat(item.path, ": expected a single value, got ",
                             KindName(item.node)));
          } else {
            text = item.node.Scalar();
          }
          for (const std::string& seen : axis->values()) {
            if (seen == text) {
              return ErrorAt(item.mark,
                             absl::StrCat(item.path, ": '", text,
                                          "' is listed twice; keep one"));
            }
          }
          if (!env && !args) {
            absl::Status applied = handler->handle(item);
            if (!applied.ok()) return applied;
          }
          axis->add_values(text);
          return absl::OkStatus();
        });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobYamlParser::ApplyOption(absl::string_view option,
                                        const std::string& text,
                                        const std::string& path,
                                        v1::TrainingOptions* o) {
  std::vector<KeyHandler> handlers = OptionHandlers(o);
  auto handler =
      std::find_if(handlers.begin(), handlers.end(),
                   [&](const KeyHandler& k) { return k.key == option; });
  if (handler == handlers.end()) {
    std::vector<absl::string_view> allowed;
    for (const KeyHandler& k : handlers) allowed.push_back(k.key);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": unknown option '", option, "'", DidYouMean(option, allowed),
        "; a sweep varies env.NAME, args (command jobs) or train.options "
        "keys: ",
        absl::StrJoin(allowed, ", ")));
  }
  const YAML::Node node(text);
  return handler->handle(Value{node, YAML::Mark::null_mark(), path});
}

absl::Status JobYamlParser::ParseSchedule(const Value& v,
                                          v1::LearnRateSchedule* schedule) {
  if (v.node.IsScalar()) {  // "learn_rate_schedule: cosine"
    schedule->set_type(v.node.Scalar());
    return absl::OkStatus();
  }
  return ParseMap(
      v, {
             {"type",
              Into<std::string>([&](std::string x) { schedule->set_type(x); })},
             {"drop_factor",
              Into<double>([&](double x) { schedule->set_drop_factor(x); })},
             {"drop_period",
              Into<double>([&](double x) { schedule->set_drop_period(x); })},
             {"gamma", Into<double>([&](double x) { schedule->set_gamma(x); })},
             {"power", Into<double>([&](double x) { schedule->set_power(x); })},
             {"step_size",
              Into<int64_t>([&](int64_t x) { schedule->set_step_size(x); })},
             {"warmup_iterations", Into<int64_t>([&](int64_t x) {
                schedule->set_warmup_iterations(x);
              })},
         });
}

}  // namespace

absl::StatusOr<ParsedJobFile> ParseJobYaml(std::string_view text,
                                           const std::string& source_name) {
  // yaml-cpp reports through exceptions; none may leave this function.
  try {
    return JobYamlParser(source_name).Parse(text);
  } catch (const YAML::Exception& e) {
    std::string where = source_name;
    if (!e.mark.is_null() && e.mark.line >= 0) {
      where = absl::StrCat(source_name, ":", e.mark.line + 1, ":",
                           e.mark.column + 1);
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", e.msg));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(source_name, ": cannot parse the job file: ", e.what()));
  }
}

absl::Status ApplyTrainingOption(absl::string_view option,
                                 const std::string& value,
                                 const std::string& path,
                                 v1::TrainingOptions* options) {
  try {
    return JobYamlParser("").ApplyOption(option, value, path, options);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read '", value, "': ", e.what()));
  }
}

absl::Status LocateInJobFile(const ParsedJobFile& parsed,
                             const absl::Status& status) {
  if (status.ok()) return status;
  return LocateField(
      [&](const std::string& path) -> std::optional<std::string> {
        auto it = parsed.where.find(path);
        if (it == parsed.where.end()) return std::nullopt;
        return it->second;
      },
      parsed.source, status);
}

absl::StatusOr<ParsedJobFile> ReadJobFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("cannot read job file: ", text.status().message()));
  }
  return ParseJobYaml(*text, path);
}

}  // namespace dlbatch
