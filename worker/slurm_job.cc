#include "worker/slurm_job.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/devices.h"

namespace dlbatch::worker {
namespace {

absl::StatusOr<int64_t> NumberVar(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  if (value == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        name,
        " is not set: --slurm-job is for the workers a dlbatch batch "
        "script starts with srun, not for starting by hand"));
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' is not a number"));
  }
  return n;
}

// "0,1", "2", "" -> the count of GPUs named.
int CountList(const char* list) {
  if (list == nullptr) return 0;
  int n = 0;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    n += item != "NoDevFiles";
  }
  return n;
}

// The entry of node `node` in SLURM_JOB_CPUS_PER_NODE's form: counts in
// node order, "N(xM)" for M nodes of N ("4(x2),2": 4, 4, 2); 0 when the
// list does not reach it or does not parse.
int CpusOfNode(const char* list, int64_t node) {
  if (list == nullptr) return 0;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int64_t repeat = 1;
    if (const size_t open = item.find("(x"); open != absl::string_view::npos) {
      absl::string_view times = item.substr(open + 2);
      if (!absl::ConsumeSuffix(&times, ")") ||
          !absl::SimpleAtoi(times, &repeat) || repeat < 1) {
        return 0;
      }
      item = item.substr(0, open);
    }
    int n = 0;
    if (!absl::SimpleAtoi(item, &n) || n < 0) return 0;
    if (node < repeat) return n;
    node -= repeat;
  }
  return 0;
}

}  // namespace

absl::StatusOr<SlurmJobContext> ReadSlurmJob(int64_t job_id, int attempt,
                                             const EnvLookup& env) {
  if (job_id <= 0 || attempt <= 0) {
    return absl::InvalidArgumentError(
        "--slurm-job and --attempt must both be positive");
  }
  SlurmJobContext c;
  absl::StatusOr<int64_t> slurm_id = NumberVar(env, "SLURM_JOB_ID");
  if (!slurm_id.ok()) return slurm_id.status();
  absl::StatusOr<int64_t> node_index = NumberVar(env, "SLURM_NODEID");
  if (!node_index.ok()) return node_index.status();
  absl::StatusOr<int64_t> nodes = NumberVar(env, "SLURM_JOB_NUM_NODES");
  if (!nodes.ok()) return nodes.status();
  if (*node_index >= *nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_NODEID=", *node_index, " is not below ",
                     "SLURM_JOB_NUM_NODES=", *nodes));
  }
  c.job.set_job_id(job_id);
  c.job.set_attempt(attempt);
  c.job.set_slurm_job_id(*slurm_id);
  c.job.set_node_index(static_cast<int32_t>(*node_index));
  c.job.set_nodes(static_cast<int32_t>(*nodes));
  if (const char* node = env("SLURMD_NODENAME")) c.node = node;
  for (const char* name :
       {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"}) {
    if (env(name) != nullptr) {
      c.gpus = CountList(env(name));
      break;
    }
  }
  int cpus = 0;
  if (const char* on_node = env("SLURM_CPUS_ON_NODE");
      on_node != nullptr && absl::SimpleAtoi(on_node, &cpus) && cpus > 0) {
    c.cpus = cpus;
  } else {
    c.cpus = CpusOfNode(env("SLURM_JOB_CPUS_PER_NODE"), *node_index);
  }
  if (const char* pem = env("DLBATCH_CA_PEM")) c.ca_pem = pem;
  return c;
}

int SlurmCpuSlots(const SlurmJobContext& context, int usable) {
  if (context.cpus <= 0) return std::max(usable, 1);
  if (usable <= 0) return context.cpus;
  return std::min(context.cpus, usable);
}

void ApplySlurmJob(const SlurmJobContext& context,
                   const std::vector<v1::Device>& discovered, int cpu_slots,
                   WorkerOptions* options) {
  const v1::SlurmJob& job = context.job;
  options->name =
      absl::StrCat("slurm-", job.slurm_job_id(), "-", job.node_index());
  // options->host stays the machine's own name (or --host): Slurm's node
  // name (NodeName) need not resolve, and the job's other ranks reach its
  // rank 0 at this address.
  options->devices.clear();
  const bool all_gpus =
      std::all_of(discovered.begin(), discovered.end(),
                  [](const v1::Device& d) { return d.kind() == "gpu"; });
  if (context.gpus > 0 && all_gpus &&
      static_cast<int>(discovered.size()) == context.gpus) {
    options->devices = discovered;
  } else if (context.gpus > 0) {
    // Slurm made the node's GPUs visible to this task; the job's
    // processes see them as 0..n-1 through CUDA_VISIBLE_DEVICES, which
    // the worker passes on.
    for (int i = 0; i < context.gpus; ++i) {
      v1::Device d;
      d.set_kind("gpu");
      d.set_index(i);
      d.set_name("GPU given by Slurm");
      options->devices.push_back(d);
    }
  } else {
    options->devices = CpuSlots(cpu_slots > 0 ? cpu_slots : 1);
  }
  options->slurm_job = job;
  if (!context.ca_pem.empty()) options->channel.ca_pem = context.ca_pem;
}

std::string SlurmWorkDir(const SlurmJobContext& context,
                         const std::string& base) {
  const v1::SlurmJob& job = context.job;
  return absl::StrCat(base, "/dlbatch-", job.job_id(), "-", job.slurm_job_id(),
                      "-", job.node_index());
}

}  // namespace dlbatch::worker
