// ValidateJobSpec: what the schema alone can check about a job. Shared by
// the job.yaml parser and the scheduler (which sees specs from any client).
//
// Contract on messages: each begins with the dotted path of the field it
// concerns ("train.options.solver: ...", "train.network.layers[2] (conv):
// ..."), or with "job" where it concerns the whole spec, and ends with what
// to change. The parser relies on the leading path to point at the line.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/stop_signals.h"
#include "proto/array_spec.h"
#include "proto/jobspec_yaml.h"
#include "proto/network_shapes.h"
#include "proto/network_wiring.h"

namespace dlbatch {
namespace {

using Allowed = std::initializer_list<absl::string_view>;

absl::Status Invalid(absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

bool IsOneOf(absl::string_view value, Allowed allowed) {
  for (absl::string_view a : allowed) {
    if (value == a) return true;
  }
  return false;
}

// "a, b or c"
std::string ListChoices(Allowed allowed) {
  std::string out;
  size_t i = 0;
  for (absl::string_view a : allowed) {
    if (i > 0) absl::StrAppend(&out, i + 1 == allowed.size() ? " or " : ", ");
    absl::StrAppend(&out, a);
    ++i;
  }
  return out;
}

// An optional enumerated string: empty means the default.
absl::Status CheckChoice(absl::string_view path, absl::string_view what,
                         absl::string_view value, Allowed allowed) {
  if (value.empty() || IsOneOf(value, allowed)) return absl::OkStatus();
  return Invalid(path, absl::StrCat("'", value, "' is not ", what, "; use ",
                                    ListChoices(allowed)));
}

// What a launched job's processes get from the worker (torchrun's
// variables and the node counts a launcher inside takes).
bool IsLaunchVariable(absl::string_view name) {
  return IsOneOf(name, {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
                        "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                        "ROLE_NAME", "NODE_RANK", "NNODES", "NPROC_PER_NODE"});
}

bool HasNul(absl::string_view s) {
  return s.find('\0') != absl::string_view::npos;
}

// An Attachment's path: relative, '/'-separated, no '..' component.
absl::Status CheckRelativePath(absl::string_view path_field,
                               absl::string_view path) {
  if (path.empty()) return Invalid(path_field, "path is empty");
  if (HasNul(path)) return Invalid(path_field, "path contains a NUL byte");
  if (path.front() == '/') {
    return Invalid(path_field,
                   absl::StrCat("'", path,
                                "' must be relative to the job's working "
                                "folder; drop the leading '/'"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") {
      return Invalid(path_field,
                     absl::StrCat("'", path,
                                  "' must stay inside the job's working "
                                  "folder; remove the '..'"));
    }
  }
  return absl::OkStatus();
}

// Which fields each layer type takes; any other that is set is a mistake
// (e.g. `units` on a conv layer, `sync` on anything but batchnorm).
enum LayerField : unsigned {
  kFilters = 1 << 0,
  kSize = 1 << 1,
  kStride = 1 << 2,
  kPadding = 1 << 3,
  kUnits = 1 << 4,
  kAlpha = 1 << 5,
  kProbability = 1 << 6,
  kEpsilon = 1 << 7,
  kSync = 1 << 8,
};

struct LayerRule {
  absl::string_view type;
  unsigned fields;
};

constexpr LayerRule kLayerRules[] = {
    {"conv", kFilters | kSize | kStride | kPadding},
    {"batchnorm", kEpsilon | kSync},
    {"relu", 0},
    {"leakyrelu", kAlpha},
    {"gelu", 0},
    {"maxpool", kSize | kStride | kPadding},
    {"avgpool", kSize | kStride | kPadding},
    {"globalavgpool", 0},
    {"fc", kUnits},
    {"dropout", kProbability},
    {"add", 0},
    {"concat", 0},
    {"softmax", 0},
};

absl::Status ValidateLayer(const v1::LayerSpec& layer, int index) {
  const std::string path =
      absl::StrCat("train.network.layers[", index, "] (",
                   layer.type().empty() ? "no type" : layer.type(), ")");
  const LayerRule* rule = nullptr;
  for (const LayerRule& r : kLayerRules) {
    if (r.type == layer.type()) rule = &r;
  }
  if (rule == nullptr) {
    std::string types;
    for (const LayerRule& r : kLayerRules) {
      absl::StrAppend(&types, types.empty() ? "" : " ", r.type);
    }
    if (layer.type().empty()) {
      return Invalid(path, absl::StrCat("add a type: one of ", types));
    }
    return Invalid(path, absl::StrCat("unknown layer type '", layer.type(),
                                      "'; use one of ", types));
  }
  struct SetField {
    unsigned bit;
    absl::string_view name;
    bool set;
  };
  const SetField fields[] = {
      {kFilters, "filters", layer.filters() != 0},
      {kSize, "size", layer.size() != 0},
      {kStride, "stride", layer.stride() != 0},
      {kPadding, "padding", layer.padding() != 0 || layer.padding_same()},
      {kUnits, "units", layer.units() != 0},
      {kAlpha, "alpha", layer.alpha() != 0},
      {kProbability, "probability", layer.probability() != 0},
      {kEpsilon, "epsilon", layer.epsilon() != 0},
      {kSync, "sync", layer.sync()},
  };
  for (const SetField& f : fields) {
    if (f.set && (rule->fields & f.bit) == 0) {
      return Invalid(
          path, absl::StrCat(f.name, " does not apply to a ", layer.type(),
                             " layer; remove it",
                             f.bit == kSync ? " (only batchnorm layers "
                                              "synchronise their statistics "
                                              "across ranks)"
                                            : ""));
    }
  }
  const absl::string_view type = layer.type();
  if (type == "conv" && layer.filters() <= 0) {
    return Invalid(path, "filters must be > 0");
  }
  if ((type == "conv" || type == "maxpool" || type == "avgpool") &&
      layer.size() <= 0) {
    return Invalid(path, "size must be > 0");
  }
  if (layer.stride() < 0) return Invalid(path, "stride must be >= 1");
  if (layer.padding() < 0) return Invalid(path, "padding must be >= 0");
  if (layer.padding() != 0 && layer.padding_same()) {
    return Invalid(path, "give either a padding or padding `same`, not both");
  }
  if (type == "fc" && layer.units() <= 0) {
    return Invalid(path, "units must be > 0");
  }
  if (type == "dropout" &&
      !(layer.probability() >= 0 && layer.probability() < 1)) {
    return Invalid(path, "probability must be in [0, 1), e.g. 0.5");
  }
  if (!std::isfinite(layer.alpha()))
    return Invalid(path, "alpha must be finite");
  const bool joins = type == "add" || type == "concat";
  if (joins && layer.inputs_size() < 2) {
    return Invalid(path, absl::StrCat(type == "add" ? "an" : "a", " ", type,
                                      " layer joins two or more outputs; "
                                      "name them in inputs: [a, b]"));
  }
  if (!joins && layer.inputs_size() > 1) {
    return Invalid(path,
                   absl::StrCat("a ", type, " layer takes one input, not ",
                                layer.inputs_size(),
                                "; join them first with an add or "
                                "concat layer"));
  }
  for (const std::string& input : layer.inputs()) {
    if (input.empty()) return Invalid(path, "inputs has an empty name");
  }
  if (!(layer.epsilon() >= 0) || !std::isfinite(layer.epsilon())) {
    return Invalid(path, "epsilon must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateNetwork(const v1::TrainSpec& train) {
  if (!train.has_network()) {
    return Invalid("train.network",
                   "missing; add network: {input: [H, W, C], layers: [...]}");
  }
  const v1::NetworkSpec& net = train.network();
  if (net.input_size() != 3) {
    return Invalid("train.network.input",
                   absl::StrCat("needs 3 numbers [height, width, channels], "
                                "got ",
                                net.input_size()));
  }
  for (int32_t x : net.input()) {
    if (x <= 0) {
      return Invalid("train.network.input",
                     absl::StrCat("[", absl::StrJoin(net.input(), ", "),
                                  "]: height, width and channels must be > 0"));
    }
  }
  if (net.layers_size() == 0) {
    return Invalid("train.network.layers",
                   "the network has no layers; add at least one");
  }
  for (int i = 0; i < net.layers_size(); ++i) {
    absl::Status s = ValidateLayer(net.layers(i), i);
    if (!s.ok()) return s;
  }
  // Names, inputs, cycles, unused outputs; shapes come last (ValidateTrain).
  if (absl::StatusOr<NetworkWiring> w = WireNetwork(net); !w.ok()) {
    // Its messages begin "layers[i] (...)": the field's path, continued.
    return absl::InvalidArgumentError(
        absl::StrCat("train.network.", w.status().message()));
  }
  return absl::OkStatus();
}

absl::Status ValidateSource(const v1::DataSource& source,
                            absl::string_view path) {
  if (source.format().empty()) {
    return Invalid(path, "add a format: idx, cifar10 or folders");
  }
  const bool has_files = source.files_size() > 0;
  const bool has_idx = !source.images().empty() || !source.labels().empty();
  if (source.format() == "idx") {
    if (source.images().empty() || source.labels().empty()) {
      return Invalid(path, "an idx source needs both images: and labels:");
    }
    if (has_files) {
      return Invalid(path,
                     "files: is for cifar10; an idx source takes "
                     "images: and labels:");
    }
  } else if (source.format() == "cifar10") {
    if (!has_files) {
      return Invalid(path, "a cifar10 source needs files: (its batch files)");
    }
    if (has_idx) {
      return Invalid(path,
                     "images: and labels: are for idx; a cifar10 "
                     "source takes files:");
    }
  } else if (source.format() == "folders") {
    if (source.path().empty()) {
      return Invalid(path,
                     "a folders source needs path: (a folder with one "
                     "subfolder of images per class)");
    }
    if (has_files || has_idx) {
      return Invalid(path,
                     "images:, labels: and files: are for idx and cifar10; "
                     "a folders source takes path:");
    }
  } else {
    return Invalid(
        absl::StrCat(path, ".format"),
        absl::StrCat("'", source.format(),
                     "' is not a data format; use idx, cifar10 or folders"));
  }
  if (source.format() != "folders") {
    if (!source.path().empty()) {
      return Invalid(absl::StrCat(path, ".path"),
                     absl::StrCat("path: is for format: folders; an ",
                                  source.format(), " source names its files"));
    }
    if (source.skip_bad_images()) {
      return Invalid(absl::StrCat(path, ".skip_bad_images"),
                     "is for format: folders (images that may not decode); "
                     "remove it");
    }
  }
  for (const std::string& f : source.files()) {
    if (f.empty()) return Invalid(path, "files: has an empty entry");
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::TrainSpec& train) {
  if (!train.data().has_train()) {
    return Invalid("train.data.train",
                   "missing; add data: {train: {format: idx, images: ..., "
                   "labels: ...}}");
  }
  const v1::DataSpec& data = train.data();
  absl::Status s = ValidateSource(data.train(), "train.data.train");
  if (s.ok() && data.has_validation()) {
    s = ValidateSource(data.validation(), "train.data.validation");
  }
  if (s.ok() && data.has_test()) {
    s = ValidateSource(data.test(), "train.data.test");
  }
  if (!s.ok()) return s;
  for (const v1::DataSource* source :
       {&data.train(), &data.validation(), &data.test()}) {
    const auto& input = train.network().input();
    if (source->format() == "folders" && input.size() == 3 && input[2] != 1 &&
        input[2] != 3) {
      return Invalid("train.network.input",
                     absl::StrCat("images from folders have 1 channel (grey) "
                                  "or 3 (colour), not ",
                                  input[2],
                                  "; set the input's last number "
                                  "to 1 or 3"));
    }
  }
  const double split = data.validation_split();
  if (!(split >= 0 && split < 1)) {
    return Invalid("train.data.validation_split",
                   absl::StrCat(split,
                                " is not a fraction of the training set; "
                                "give one in [0, 1), e.g. 0.1"));
  }
  if (split > 0 && data.has_validation()) {
    return Invalid("train.data.validation_split",
                   "the job gives a validation source too; keep either "
                   "validation: or validation_split:");
  }
  const v1::Augmentation& aug = data.augmentation();
  if (aug.random_x_translation() < 0 || aug.random_y_translation() < 0 ||
      aug.random_crop_padding() < 0) {
    return Invalid("train.data.augmentation",
                   "translations and crop padding are pixels and must be "
                   ">= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const v1::LearnRateSchedule& sched) {
  const absl::string_view path = "train.options.learn_rate_schedule";
  const bool has_parameters = sched.drop_factor() != 0 ||
                              sched.drop_period() != 0 || sched.gamma() != 0 ||
                              sched.power() != 0 || sched.step_size() != 0 ||
                              sched.warmup_iterations() != 0;
  const Allowed kTypes = {"none", "piecewise", "inv", "step", "cosine"};
  if (sched.type().empty() && has_parameters) {
    return Invalid(path, absl::StrCat("add a type: ", ListChoices(kTypes)));
  }
  absl::Status s =
      CheckChoice(path, "a learn rate schedule", sched.type(), kTypes);
  if (!s.ok()) return s;
  for (double x : {sched.drop_factor(), sched.drop_period(), sched.gamma(),
                   sched.power()}) {
    if (!(x >= 0) || !std::isfinite(x)) {
      return Invalid(path,
                     "drop_factor, drop_period, gamma and power must be >= 0");
    }
  }
  if (sched.step_size() < 0 || sched.warmup_iterations() < 0) {
    return Invalid(path, "step_size and warmup_iterations must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const v1::TrainingOptions& o) {
  absl::Status s = CheckChoice("train.options.solver", "a solver", o.solver(),
                               {"sgdm", "adam", "rmsprop"});
  if (s.ok()) {
    s = CheckChoice("train.options.shuffle", "a shuffle mode", o.shuffle(),
                    {"never", "once", "every-epoch"});
  }
  if (s.ok()) {
    s = CheckChoice("train.options.execution_environment",
                    "an execution environment", o.execution_environment(),
                    {"auto", "cpu", "gpu", "multi-gpu"});
  }
  if (s.ok()) {
    s = CheckChoice("train.options.checkpoint_frequency_unit", "a unit",
                    o.checkpoint_frequency_unit(), {"epoch", "iteration"});
  }
  if (s.ok()) {
    s = CheckChoice("train.options.precision", "a precision", o.precision(),
                    {"fp32", "tf32", "bf16", "fp16"});
  }
  if (s.ok()) s = ValidateSchedule(o.learn_rate_schedule());
  if (!s.ok()) return s;
  if (o.nesterov() && !o.solver().empty() && o.solver() != "sgdm") {
    return Invalid("train.options.nesterov",
                   absl::StrCat("Nesterov's momentum is sgdm's; remove "
                                "nesterov or use solver: sgdm, not ",
                                o.solver()));
  }

  // Counts that must be positive where given.
  struct Count {
    absl::string_view name;
    bool has;
    int64_t value;
  };
  const Count counts[] = {
      {"mini_batch_size", o.has_mini_batch_size(), o.mini_batch_size()},
      {"max_epochs", o.has_max_epochs(), o.max_epochs()},
      {"max_iterations", o.has_max_iterations(), o.max_iterations()},
      {"validation_frequency", o.has_validation_frequency(),
       o.validation_frequency()},
      {"validation_patience", o.has_validation_patience(),
       o.validation_patience()},
      {"verbose_frequency", o.has_verbose_frequency(), o.verbose_frequency()},
  };
  for (const Count& c : counts) {
    if (c.has && c.value <= 0) {
      return Invalid(absl::StrCat("train.options.", c.name),
                     absl::StrCat("must be > 0, got ", c.value));
    }
  }
  if (o.has_checkpoint_frequency() && o.checkpoint_frequency() < 0) {
    return Invalid("train.options.checkpoint_frequency",
                   "must be >= 0 (0: no checkpoints)");
  }

  // Reals, with the half-open or closed range each must lie in.
  struct Real {
    absl::string_view name;
    bool has;
    double value;
    double low;
    bool low_inclusive;
    double high;  // exclusive; infinity for none
  };
  constexpr double kInf = INFINITY;
  const Real reals[] = {
      {"initial_learn_rate", o.has_initial_learn_rate(), o.initial_learn_rate(),
       0, false, kInf},
      {"momentum", o.has_momentum(), o.momentum(), 0, true, 1},
      {"l2_regularization", o.has_l2_regularization(), o.l2_regularization(), 0,
       true, kInf},
      {"gradient_threshold", o.has_gradient_threshold(), o.gradient_threshold(),
       0, false, kInf},
      {"gradient_decay_factor", o.has_gradient_decay_factor(),
       o.gradient_decay_factor(), 0, true, 1},
      {"squared_gradient_decay_factor", o.has_squared_gradient_decay_factor(),
       o.squared_gradient_decay_factor(), 0, true, 1},
      {"epsilon", o.has_epsilon(), o.epsilon(), 0, false, kInf},
      {"label_smoothing", o.has_label_smoothing(), o.label_smoothing(), 0, true,
       1},
  };
  for (const Real& r : reals) {
    if (!r.has) continue;
    bool above = r.low_inclusive ? r.value >= r.low : r.value > r.low;
    if (!above || !(r.value < r.high)) {
      std::string range =
          r.high == kInf ? absl::StrCat(r.low_inclusive ? ">= " : "> ", r.low)
                         : absl::StrCat("in ", r.low_inclusive ? "[" : "(",
                                        r.low, ", ", r.high, ")");
      return Invalid(absl::StrCat("train.options.", r.name),
                     absl::StrCat("must be ", range, ", got ", r.value));
    }
  }
  return absl::OkStatus();
}

// Whether each layer fits what it takes (InferNetworkShapes, which the
// trainer builds by): checked after everything else, since a network being
// written is often unfinished (no softmax yet) while its options are not.
// REQUIRES: ValidateNetwork(train) is OK.
absl::Status ValidateShapes(const v1::NetworkSpec& net) {
  absl::StatusOr<NetworkWiring> wiring = WireNetwork(net);
  if (!wiring.ok()) return wiring.status();
  absl::StatusOr<std::vector<LayerShape>> shapes =
      InferNetworkShapes(net, *wiring);
  if (!shapes.ok()) {
    // "layers[i] (...): ..." or "input: ...": the field's path, continued.
    return absl::InvalidArgumentError(
        absl::StrCat("train.network.", shapes.status().message()));
  }
  return absl::OkStatus();
}

absl::Status ValidateTrain(const v1::TrainSpec& train) {
  absl::Status s = ValidateNetwork(train);
  if (s.ok()) s = ValidateData(train);
  if (s.ok()) s = ValidateOptions(train.options());
  if (s.ok()) s = ValidateShapes(train.network());
  return s;
}

absl::Status ValidateCommand(const v1::CommandSpec& command) {
  if (command.argv_size() == 0) {
    return Invalid("command",
                   "is empty; give the program to run, e.g. "
                   "command: [python3, train.py]");
  }
  if (command.argv(0).empty()) {
    return Invalid("command[0]", "the program to run is an empty string");
  }
  for (int i = 0; i < command.argv_size(); ++i) {
    if (HasNul(command.argv(i))) {
      return Invalid(absl::StrCat("command[", i, "]"),
                     "contains a NUL byte; remove it");
    }
  }
  return absl::OkStatus();
}

// `array:` as written, and what the scheduler set on one job of an array.
absl::Status ValidateArray(const v1::JobSpec& spec) {
  if (!spec.array().empty()) {
    absl::StatusOr<ArraySpec> array = ParseArraySpec(spec.array());
    if (!array.ok()) return array.status();
    if (spec.sweep().axes_size() > 0) {
      return Invalid("array",
                     "a job has `array:` or `sweep:`, not both; keep one (a "
                     "sweep over env.NAME can give each job a value of its "
                     "own)");
    }
  }
  if (!spec.has_array_task()) return absl::OkStatus();
  const v1::ArrayTask& task = spec.array_task();
  if (!spec.array().empty()) {
    return Invalid("array_task",
                   "is one job of an array; a job made from `array:` has it "
                   "cleared (remove one of them)");
  }
  if (task.index() < 0 || task.index() > kMaxArrayIndex || task.limit() < 0 ||
      task.count() < 1 || task.count() > kMaxArrayJobs) {
    return Invalid("array_task",
                   absl::StrCat("index ", task.index(), ", limit ",
                                task.limit(), " and count ", task.count(),
                                " are not one job of an array; give the "
                                "indexes in `array:` instead"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (spec.pool() < 0) {
    return Invalid("pool", absl::StrCat(spec.pool(),
                                        " is negative; use 1 or more GPUs "
                                        "(or CPU slots), or leave it out "
                                        "for 1"));
  }
  if (spec.time_limit_s() < 0) {
    return Invalid("time_limit",
                   absl::StrCat(spec.time_limit_s(),
                                "s is negative; give a duration such as 30m, "
                                "or leave it out for no limit"));
  }
  if (!spec.preempt_signal().empty()) {
    if (spec.has_train()) {
      return Invalid("preempt_signal",
                     "a train job is stopped by the trainer's own "
                     "checkpoint-and-stop when preempted; remove it (it is "
                     "for command jobs)");
    }
    if (!StopSignalNumber(spec.preempt_signal())) {
      return Invalid("preempt_signal",
                     absl::StrCat("'", spec.preempt_signal(),
                                  "' is not a signal a job may be sent; use "
                                  "one of ",
                                  StopSignalNames(), " (default TERM)"));
    }
  }
  if (!spec.launch().empty()) {
    if (spec.has_train()) {
      return Invalid("launch",
                     "the embedded trainer starts its own ranks; remove it "
                     "(it is for command jobs)");
    }
    if (!IsOneOf(spec.launch(), {"per-node", "per-slot"})) {
      return Invalid("launch",
                     absl::StrCat("'", spec.launch(),
                                  "' is not a launch mode; use per-node (one "
                                  "process per worker), per-slot (one per GPU "
                                  "or CPU slot), or leave it out for one "
                                  "process per part"));
    }
  }
  if (!spec.checkpoint().empty()) {
    if (spec.has_train()) {
      return Invalid("checkpoint",
                     "the embedded trainer stores rank 0's checkpoint (its "
                     "ranks hold the same weights); remove it (it is for "
                     "command jobs)");
    }
    if (spec.checkpoint() != "per-part") {
      return Invalid("checkpoint",
                     absl::StrCat("'", spec.checkpoint(),
                                  "' is not a checkpoint mode; use per-part "
                                  "(every part stores its own "
                                  "$DLBATCH_CHECKPOINT_DIR), or leave it out "
                                  "for part 0's to be the job's"));
    }
  }
  if (spec.max_nodes() < 0) {
    return Invalid("max_nodes",
                   absl::StrCat(spec.max_nodes(),
                                " is negative; use 1 for one worker or more "
                                "to let the pool span workers"));
  }
  for (int i = 0; i < spec.attach_size(); ++i) {
    absl::Status s = CheckRelativePath(absl::StrCat("attach[", i, "]"),
                                       spec.attach(i).path());
    if (!s.ok()) return s;
  }
  if (absl::Status s = ValidateArray(spec); !s.ok()) return s;
  for (const auto& [name, value] : spec.env()) {
    const std::string path = absl::StrCat("env.", name);
    if (name.empty()) return Invalid("env", "a variable has an empty name");
    if (name.find('=') != std::string::npos || HasNul(name)) {
      return Invalid(path, "a variable name cannot contain '=' or NUL");
    }
    if (HasNul(value)) return Invalid(path, "the value contains a NUL byte");
    // What the worker sets for each job: a job's own value would win, and
    // CUDA_VISIBLE_DEVICES would reach GPUs other jobs were given.
    if (name == "CUDA_VISIBLE_DEVICES" || name == "NVIDIA_VISIBLE_DEVICES") {
      return Invalid(path,
                     "the worker sets it to the GPUs the job is given; remove "
                     "it (the pool says how many GPUs a job gets)");
    }
    if (IsOneOf(name, {"DLBATCH_JOB_ID", "DLBATCH_ATTEMPT", "DLBATCH_POOL",
                       "DLBATCH_PART", "DLBATCH_PARTS", "DLBATCH_DEVICES",
                       "DLBATCH_OUTPUT_DIR", "DLBATCH_RENDEZVOUS",
                       "DLBATCH_RENDEZVOUS_SECRET", "DLBATCH_JOB_MARK",
                       "DLBATCH_HOSTS", "DLBATCH_ARRAY_INDEX",
                       "DLBATCH_ARRAY_ID", "DLBATCH_PROGRESS",
                       "DLBATCH_STOP_FILE", "DLBATCH_PREEMPT_SIGNAL",
                       "DLBATCH_CHECKPOINT_DIR", "DLBATCH_RESUMED_FROM"})) {
      return Invalid(path, "the worker sets it for each job; use another name");
    }
    if (!spec.launch().empty() && IsLaunchVariable(name)) {
      return Invalid(path, absl::StrCat("launch: ", spec.launch(),
                                        " sets it for each process (as "
                                        "torchrun does); remove it"));
    }
  }
  switch (spec.program_case()) {
    case v1::JobSpec::kCommand:
      return ValidateCommand(spec.command());
    case v1::JobSpec::kTrain:
      return ValidateTrain(spec.train());
    case v1::JobSpec::PROGRAM_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "job has neither `command:` nor `train:`; add one (command: [prog, "
      "args...] runs a program; train: runs the embedded trainer)");
}

}  // namespace dlbatch
