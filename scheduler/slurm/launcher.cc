#include "scheduler/slurm/launcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch::scheduler::slurm {

absl::StatusOr<BatchRequest> PlanBatch(const SlurmProfile& profile,
                                       int64_t job_id, int attempt,
                                       const JobShape& shape, int node_cpus) {
  if (shape.pool < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", shape.pool, ": a job needs a pool of 1 or more"));
  }
  BatchRequest request;
  request.job_id = job_id;
  request.attempt = attempt;
  request.time_limit_s = shape.time_limit_s;
  const bool gpus = profile.gpus_per_node > 0;
  // What one node holds: its GPUs, or its CPUs as slots.
  const int per_node =
      gpus ? profile.gpus_per_node : (node_cpus > 0 ? node_cpus : shape.pool);
  const std::string unit = gpus ? "GPUs" : "CPUs";
  const int nodes = (shape.pool + per_node - 1) / per_node;
  const int allowed = std::max(1, shape.max_nodes);
  if (nodes > allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", shape.pool, " needs ", nodes, " nodes of profile '",
        profile.name, "' (", per_node, " ", unit, " each) but the job allows ",
        allowed, "; set max_nodes: ", nodes, " in the job, or use pool ",
        allowed * per_node, " or less"));
  }
  if (shape.pool % nodes != 0) {
    const int below = nodes * (shape.pool / nodes);
    const int above = std::min(nodes * per_node, below + nodes);
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", shape.pool, " does not split evenly over the ", nodes,
        " nodes of profile '", profile.name,
        "' it needs (Slurm gives each node the same ", gpus ? "GPU" : "CPU",
        " count); use pool ", below, " or ", above));
  }
  request.nodes = nodes;
  if (gpus) request.gpus_per_node = shape.pool / nodes;
  // A core for each rank on the node (ranks are GPUs or CPU slots).
  request.cpus_per_node = shape.pool / nodes;
  return request;
}

absl::StatusOr<GangShape> ShapeOfGang(const SlurmProfile& profile,
                                      const JobShape& shape, int slurm_nodes) {
  GangShape gang;
  if (profile.gpus_per_node > 0) {
    ASSIGN_OR_RETURN(BatchRequest planned, PlanBatch(profile, 0, 1, shape));
    gang.nodes = planned.nodes;
    gang.per_node = planned.gpus_per_node;
    gang.gpus = true;
    return gang;
  }
  const int pool = std::max(1, shape.pool);
  if (slurm_nodes < 1 || slurm_nodes > std::max(1, shape.max_nodes) ||
      pool % slurm_nodes != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Slurm gave the job ", slurm_nodes, " nodes, over which its pool of ",
        pool, " (max_nodes ", std::max(1, shape.max_nodes),
        ") cannot be shared evenly"));
  }
  gang.nodes = slurm_nodes;
  gang.per_node = pool / slurm_nodes;
  return gang;
}

SlurmLauncher::SlurmLauncher(SlurmTool* tool, SlurmJobLedger* ledger,
                             const Clock* clock)
    : tool_(tool), ledger_(ledger), clock_(clock) {}

absl::StatusOr<SlurmJobRecord> SlurmLauncher::Launch(
    const SlurmProfile& profile, const BatchRequest& request,
    const WorkerLaunch& launch) {
  SlurmJobRecord record;
  record.job_id = request.job_id;
  record.attempt = request.attempt;
  record.profile = profile.name;
  record.submitted_ms = clock_->NowMs();
  record.token_sha256 = Sha256Hex(launch.token);
  if (absl::Status s = ledger_->Put(record); !s.ok()) {
    return Annotate(s, absl::StrCat("job ", request.job_id,
                                    ": not submitted to Slurm, as its "
                                    "submission could not be recorded"));
  }
  absl::StatusOr<int64_t> slurm_id =
      SubmitBatch(*tool_, profile, request, launch);
  if (!slurm_id.ok()) {
    // Refused by Slurm: there is no Slurm job to know about (a failure to
    // forget leaves an intent that squeue shows has none). Otherwise sbatch
    // may have made the job without saying so (it timed out, or its answer
    // did not parse): the intent stays, for the reconciler to adopt or
    // cancel the `dlbatch-<instance>-<id>` job it finds.
    if (slurm_id.status().code() == absl::StatusCode::kFailedPrecondition) {
      (void)ledger_->Forget(request.job_id);
    }
    return slurm_id.status();
  }
  record.slurm_id = *slurm_id;
  if (absl::Status s = ledger_->Put(record); !s.ok()) {
    // A Slurm job dlbatch cannot remember must not run.
    absl::Status cancelled = CancelBatch(*tool_, record.slurm_id);
    return Annotate(
        s, absl::StrCat("job ", request.job_id, ": Slurm job ", record.slurm_id,
                        " could not be recorded, so it was cancelled",
                        cancelled.ok() ? "" : " (scancel failed too: ",
                        cancelled.ok() ? "" : cancelled.message(),
                        cancelled.ok() ? "" : ")"));
  }
  return record;
}

}  // namespace dlbatch::scheduler::slurm
