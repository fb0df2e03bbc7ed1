#include "scheduler/slurm_launcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch::scheduler::slurm {

absl::StatusOr<BatchRequest> PlanBatch(const SlurmProfile& profile,
                                       int64_t job_id, int attempt,
                                       const JobShape& shape) {
  if (shape.pool < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", shape.pool, ": a job needs a pool of 1 or more"));
  }
  BatchRequest request;
  request.job_id = job_id;
  request.attempt = attempt;
  request.time_limit_s = shape.time_limit_s;
  const int gpn = profile.gpus_per_node;
  if (gpn <= 0) {  // CPU-only nodes: the pool is one node's slots
    request.nodes = 1;
    return request;
  }
  const int nodes = (shape.pool + gpn - 1) / gpn;
  const int allowed = std::max(1, shape.max_nodes);
  if (nodes > allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", shape.pool, " needs ", nodes, " nodes of profile '",
        profile.name, "' (", gpn, " GPUs each) but the job allows ", allowed,
        "; set max_nodes: ", nodes, " in the job, or use pool ", allowed * gpn,
        " or less"));
  }
  if (shape.pool % nodes != 0) {
    const int below = nodes * (shape.pool / nodes);
    const int above = std::min(nodes * gpn, below + nodes);
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", shape.pool, " does not split evenly over the ", nodes,
        " nodes of profile '", profile.name,
        "' it needs (Slurm gives each node the same GPU count); use pool ",
        below, " or ", above));
  }
  request.nodes = nodes;
  request.gpus_per_node = shape.pool / nodes;
  return request;
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
