#include "scheduler/profile_config.h"

#include <cctype>
#include <map>
#include <tuple>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/duration.h"
#include "common/edit_distance.h"

namespace dlbatch::scheduler {
namespace {

ConfigKey Key(std::string name, ConfigType type = ConfigType::kString,
              bool list = false) {
  ConfigKey key;
  key.name = std::move(name);
  key.type = type;
  key.list = list;
  return key;
}

// The keys only a Slurm profile has.
const std::vector<std::string>& SlurmKeys() {
  static const auto* const keys = new std::vector<std::string>{
      "partition",   "account", "qos",      "gpus_per_node",    "gres",
      "sbatch_args", "bin_dir", "node_dir", "scheduler_address"};
  return *keys;
}

// sbatch options dlbatch sets itself from the job and the profile (long
// and short forms): an extra argument may not set them again.
const std::map<std::string, std::string>& OwnSbatchOptions() {
  static const auto* const own = new std::map<std::string, std::string>{
      {"--job-name", "the job's id"},
      {"-J", "the job's id"},
      {"--partition", "the profile's partition: key"},
      {"-p", "the profile's partition: key"},
      {"--account", "the profile's account: key"},
      {"-A", "the profile's account: key"},
      {"--qos", "the profile's qos: key"},
      {"-q", "the profile's qos: key"},
      {"--nodes", "the job's pool"},
      {"-N", "the job's pool"},
      {"--ntasks", "the job's pool"},
      {"-n", "the job's pool"},
      {"--ntasks-per-node", "the job's pool"},
      {"--gres", "the job's pool and the gres: key"},
      {"--gpus", "the job's pool and the gres: key"},
      {"-G", "the job's pool and the gres: key"},
      {"--gpus-per-node", "the job's pool and the gres: key"},
      {"--cpus-per-task", "the job's pool (a CPU for each rank on a node)"},
      {"-c", "the job's pool (a CPU for each rank on a node)"},
      {"--cpus-per-gpu", "the job's pool (a CPU for each rank on a node)"},
      {"--time", "the job's time_limit"},
      {"-t", "the job's time_limit"},
      {"--requeue", "dlbatch's own retries"},
      {"--no-requeue", "dlbatch's own retries"},
      {"--export", "a clean environment"},
      {"--output", "the node_dir: key"},
      {"-o", "the node_dir: key"},
      {"--error", "the node_dir: key"},
      {"-e", "the node_dir: key"},
      {"--uid", "the job's owner"},
      {"--gid", "the job's owner"},
      {"--parsable", "how dlbatch reads sbatch"},
      {"--wrap", "the batch script"},
  };
  return *own;
}

// A preemption duration in ms: `what`'s message when it is none. A
// negative one, or 0 where `zero` is false, says so.
absl::StatusOr<TimeMs> PreemptionDurationMs(const ConfigEntry& e,
                                            const char* what, bool zero) {
  const std::string& text = e.values.front();
  const bool all_zero =
      absl::c_any_of(text, ::isdigit) &&
      absl::c_all_of(text, [](char c) { return !::isdigit(c) || c == '0'; });
  if (zero && all_zero) return 0;
  absl::StatusOr<int64_t> seconds = ParseDurationSeconds(text);
  if (seconds.ok()) return *seconds * 1000;
  if (absl::StartsWith(text, "-") || all_zero) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", e.key, "': '", text, "' is ",
                     all_zero ? "zero" : "negative", "; write ", what));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("key '", e.key, "': ", seconds.status().message()));
}

// The option an argument sets: "--time" of "--time=5", "-t" of "-t5".
std::string OptionOf(const std::string& arg) {
  if (absl::StartsWith(arg, "--")) {
    return std::string(arg.substr(0, arg.find('=')));
  }
  return arg.substr(0, 2);
}

}  // namespace

std::string ProfileTypeName(ProfileType type) {
  return type == ProfileType::kSlurm ? "slurm" : "workers";
}

ConfigSection ProfilesSection() {
  ConfigSection section;
  section.name = "profiles";
  section.item = "profile";
  section.keys = {Key("type"),
                  Key("max_pool", ConfigType::kInteger),
                  Key("partition"),
                  Key("account"),
                  Key("qos"),
                  Key("gpus_per_node", ConfigType::kInteger),
                  Key("gres"),
                  Key("sbatch_args", ConfigType::kString, /*list=*/true),
                  Key("bin_dir"),
                  Key("node_dir"),
                  Key("scheduler_address")};
  ConfigKey preemption = Key("preemption");
  preemption.fields = {Key("mode"), Key("grace"), Key("min_run"),
                       Key("preemptible")};
  section.keys.push_back(std::move(preemption));
  return section;
}

absl::StatusOr<std::vector<ProfileDeclaration>> ProfilesFromConfig(
    const std::vector<ConfigItem>& items, const std::string& path) {
  std::vector<ProfileDeclaration> out;
  for (const ConfigItem& item : items) {
    // An error at the line of `entry` (or of the profile's name).
    auto fail = [&](const ConfigEntry* entry, absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", entry ? entry->line : item.line,
                       ": profile '", item.name, "': ", message));
    };
    auto value = [&](const char* key) -> std::string {
      const ConfigEntry* e = item.Find(key);
      return e ? e->values.front() : "";
    };
    ProfileDeclaration d;
    d.name = item.name;
    d.origin = absl::StrCat("file ", path, ":", item.line);
    if (const ConfigEntry* type = item.Find("type")) {
      const std::string& t = type->values.front();
      if (t == "slurm") {
        d.type = ProfileType::kSlurm;
      } else if (t != "workers") {
        return fail(type, absl::StrCat("unknown type '", t, "'",
                                       DidYouMean(t, {"slurm", "workers"}),
                                       "; write type: workers (dlbatch's own "
                                       "workers, the default) or type: slurm"));
      }
    }
    if (const ConfigEntry* max = item.Find("max_pool")) {
      int n = 0;
      if (!absl::SimpleAtoi(max->values.front(), &n) || n < 0) {
        return fail(max,
                    "key 'max_pool': write a number of GPUs (or CPU "
                    "slots) of 0 or more; 0: what its machines have");
      }
      d.max_pool = n;
    }
    if (const ConfigEntry* p = item.Find("preemption")) {
      auto where = [&](const ConfigEntry* e, absl::string_view message) {
        return fail(e, absl::StrCat("key 'preemption': ", message));
      };
      PreemptionPolicy& policy = d.preemption;
      if (const ConfigEntry* m = p->Field("mode")) {
        const std::string& mode = m->values.front();
        if (mode == "priority") {
          policy.mode = PreemptionMode::kPriority;
        } else if (mode == "fair_share") {
          policy.mode = PreemptionMode::kFairShare;
        } else if (mode != "off") {
          return where(
              m,
              absl::StrCat("unknown mode '", mode, "'",
                           DidYouMean(mode, {"off", "priority", "fair_share"}),
                           "; write mode: off (nothing is preempted, the "
                           "default), priority or fair_share"));
        }
      }
      if (const ConfigEntry* e = p->Field("preemptible")) {
        const std::string& v = e->values.front();
        if (v != "true" && v != "false") {
          return where(
              e, absl::StrCat("key 'preemptible': write true (the default: "
                              "jobs that do not say may be "
                              "preempted) or false (only jobs with "
                              "preemptible: true may be), not '",
                              v, "'"));
        }
        policy.jobs_preemptible = v == "true";
      }
      for (auto [key, field, what, zero] :
           {std::tuple{"grace", &policy.grace_ms,
                       "how long a preempted job has to checkpoint before "
                       "it is killed, more than 0 (e.g. 2m)",
                       false},
            std::tuple{"min_run", &policy.min_run_ms,
                       "how long a job runs before it may be preempted, "
                       "e.g. 10m (0: no minimum)",
                       true}}) {
        if (const ConfigEntry* e = p->Field(key)) {
          absl::StatusOr<TimeMs> ms = PreemptionDurationMs(*e, what, zero);
          if (!ms.ok()) return where(e, ms.status().message());
          *field = *ms;
        }
      }
    }
    if (d.type == ProfileType::kWorkers) {
      for (const std::string& key : SlurmKeys()) {
        if (const ConfigEntry* e = item.Find(key)) {
          return fail(e, absl::StrCat("key '", key,
                                      "' is for profiles of Slurm; add "
                                      "type: slurm or remove it"));
        }
      }
      out.push_back(std::move(d));
      continue;
    }
    if (d.name == "local") {
      return fail(item.Find("type"),
                  "'local' is always this machine's own workers; give the "
                  "Slurm profile another name");
    }
    slurm::SlurmProfile& s = d.slurm;
    s.name = d.name;
    s.partition = value("partition");
    if (s.partition.empty()) {
      return fail(nullptr,
                  "a profile of type slurm needs the partition its jobs go "
                  "to; add partition: NAME (sinfo lists them)");
    }
    s.account = value("account");
    s.qos = value("qos");
    if (const ConfigEntry* g = item.Find("gpus_per_node")) {
      if (!absl::SimpleAtoi(g->values.front(), &s.gpus_per_node) ||
          s.gpus_per_node < 0) {
        return fail(g,
                    "key 'gpus_per_node': write the GPUs each node gives "
                    "a job, 0 for CPU-only nodes");
      }
    }
    if (const ConfigEntry* g = item.Find("gres")) {
      s.gres_name = g->values.front();
      if (s.gres_name.empty() ||
          s.gres_name.find_first_of(":,= ") != std::string::npos) {
        return fail(g,
                    "key 'gres': write the GRES name alone, as "
                    "gres.conf's Name= gives it (e.g. gpu)");
      }
    }
    if (const ConfigEntry* args = item.Find("sbatch_args")) {
      for (const std::string& arg : args->values) {
        if (!absl::StartsWith(arg, "-") || arg == "-" || arg == "--") {
          return fail(args, absl::StrCat("key 'sbatch_args': '", arg,
                                         "' is not an option; write each as "
                                         "--name=value"));
        }
        auto own = OwnSbatchOptions().find(OptionOf(arg));
        if (own != OwnSbatchOptions().end()) {
          return fail(args, absl::StrCat("key 'sbatch_args': dlbatch sets ",
                                         own->first, " itself from ",
                                         own->second, "; remove '", arg, "'"));
        }
      }
      s.sbatch_args = args->values;
    }
    for (auto [key, field] : {std::pair{"bin_dir", &s.bin_dir},
                              std::pair{"node_dir", &s.node_dir}}) {
      if (const ConfigEntry* e = item.Find(key)) {
        if (!absl::StartsWith(e->values.front(), "/")) {
          return fail(e, absl::StrCat("key '", key,
                                      "': write an absolute folder of the "
                                      "cluster's nodes, e.g. /opt/dlbatch"));
        }
        *field = e->values.front();
        while (field->size() > 1 && field->back() == '/') field->pop_back();
      }
    }
    d.scheduler_address = value("scheduler_address");
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<ProfileDeclaration> ProfileFromFlag(const std::string& text) {
  std::pair<std::string, std::string> kv =
      absl::StrSplit(text, absl::MaxSplits('=', 1));
  ProfileDeclaration d;
  d.name = kv.first;
  d.origin = "flag --profile";
  if (d.name.empty() ||
      (!kv.second.empty() &&
       (!absl::SimpleAtoi(kv.second, &d.max_pool) || d.max_pool < 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile ", text, ": write NAME or NAME=MAX_POOL"));
  }
  return d;
}

absl::Status CheckDeclarations(const std::vector<ProfileDeclaration>& all) {
  std::map<std::string, const ProfileDeclaration*> seen;
  for (const ProfileDeclaration& d : all) {
    auto [it, added] = seen.emplace(d.name, &d);
    // The flags may name a profile again (the last max_pool counts, as
    // before the file had profiles); the file and the flags may not both.
    if (!added &&
        (it->second->origin != d.origin || d.origin != "flag --profile")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile '", d.name, "' is declared twice (", it->second->origin,
          " and ", d.origin, "); declare it once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler
