#include "scheduler/slurm/gang.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dlbatch::scheduler {

SlurmGang::SlurmGang(int64_t job_id, int attempt, int nodes, int slots_per_node,
                     bool gpus)
    : job_id_(job_id),
      attempt_(attempt),
      slots_per_node_(slots_per_node),
      gpus_(gpus),
      node_worker_(static_cast<size_t>(std::max(nodes, 1)), 0) {}

absl::Status SlurmGang::Join(int node_index, int nodes, WorkerId worker,
                             int slots) {
  const int expected = static_cast<int>(node_worker_.size());
  const std::string where = absl::StrCat("node ", node_index, " of attempt ",
                                         attempt_, " of dlbatch job ", job_id_);
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
  };
  if (nodes != expected) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": Slurm says the job has ", nodes,
                     " nodes; dlbatch asked for ", expected));
  }
  if (node_index < 0 || node_index >= expected) {
    return refuse(
        absl::StrCat("not a node of the job (0 to ", expected - 1, ")"));
  }
  if (slots < slots_per_node_) {
    const char* unit = gpus_ ? "GPU" : "CPU";
    return absl::FailedPreconditionError(absl::StrCat(
        "Slurm gave node ", node_index, " ", slots, " ", unit,
        slots == 1 ? "" : "s", "; the job needs ", slots_per_node_,
        " on each node (attempt ", attempt_, " of dlbatch job ", job_id_, ", ",
        expected, expected == 1 ? " node" : " nodes", "): ",
        gpus_ ? "check the profile's gpus_per_node and gres against "
                "gres.conf"
              : "see that Slurm gives a job's task the CPUs it asks for "
                "(sbatch --cpus-per-task; the nodes' CPUs= and the CPU "
                "affinity or cgroup of its task plugin), or lower the "
                "pool"));
  }
  WorkerId& held = node_worker_[static_cast<size_t>(node_index)];
  if (held != 0 && held != worker) {
    return refuse(absl::StrCat("worker ", held, " already serves it"));
  }
  for (size_t i = 0; i < node_worker_.size(); ++i) {
    if (node_worker_[i] == worker && static_cast<int>(i) != node_index) {
      return refuse(absl::StrCat("the worker already serves node ", i));
    }
  }
  held = worker;
  return absl::OkStatus();
}

void SlurmGang::Leave(WorkerId worker) {
  for (WorkerId& w : node_worker_) {
    if (w == worker) w = 0;
  }
}

bool SlurmGang::complete() const {
  return std::find(node_worker_.begin(), node_worker_.end(), 0) ==
         node_worker_.end();
}

std::vector<int> SlurmGang::Missing() const {
  std::vector<int> missing;
  for (size_t i = 0; i < node_worker_.size(); ++i) {
    if (node_worker_[i] == 0) missing.push_back(static_cast<int>(i));
  }
  return missing;
}

std::vector<Part> SlurmGang::Parts() const {
  std::vector<Part> parts;
  for (WorkerId w : node_worker_) {
    Part part;
    part.worker = w;
    for (int d = 0; d < slots_per_node_; ++d) part.devices.push_back(d);
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace dlbatch::scheduler
