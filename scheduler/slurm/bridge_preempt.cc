// The Slurm thread's part in the preemption of dlbatch's own jobs: after
// each reconcile, the view of each profile with preemption on whose jobs
// wait in Slurm for resources (ScanForPreemption, then sinfo for the
// partition's nodes), handed to the host, which chooses and stops the
// victims as on workers. Their Slurm jobs end as their workers leave, or
// at the grace (EndStopping, bridge_thread.cc).
#include <algorithm>

#include "scheduler/slurm/bridge.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler::slurm {

void SlurmBridge::PreemptFor(const ReconcileInput& in) {
  if (options_.preempting.empty()) return;
  const PreemptionScan scan = ScanForPreemption(in, options_.preempting);
  if (scan.releasing_unknown) return;  // what is freed is not counted yet
  for (const auto& entry : scan.waiting) {
    const std::string& name = entry.first;  // a lambda captures no binding
    const std::vector<int64_t>& waiting = entry.second;
    const SlurmProfile* profile = ProfileOf(name);
    if (profile == nullptr || waiting.empty()) continue;
    absl::StatusOr<std::vector<NodeRow>> rows = ReadNodeRows(*tool_, *profile);
    if (!rows.ok()) {
      spdlog::warn(
          "profile '{}': cannot read the nodes of partition {} to "
          "preempt for its waiting jobs: {}",
          name, profile->partition, rows.status().ToString());
      continue;
    }
    if (std::any_of(rows->begin(), rows->end(), [&](const NodeRow& row) {
          return scan.releasing.count(row.name) > 0;
        })) {
      continue;  // what is being freed there is not counted yet
    }
    SlurmPreemptionView view;
    view.profile = name;
    const bool gpus = profile->gpus_per_node > 0;
    int node_cpus = 0;
    for (const NodeRow& row : *rows) {
      view.room.push_back(RoomOf(row, gpus));
      node_cpus = std::max(node_cpus, row.cpus);
    }
    host_->WithLock(
        [&](WorkerMail& mail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mutex()) {
          for (int64_t id : waiting) {
            std::optional<HostJob> job = host_->FindJob(id);
            if (!job || job->state != v1::JOB_STATE_QUEUED) continue;
            // The batch job it waits as (ranks per node: its cores).
            absl::StatusOr<BatchRequest> request = PlanBatch(
                *profile, id, job->attempt + 1, job->shape, node_cpus);
            if (!request.ok()) continue;
            view.waiting.push_back(
                {id, request->nodes, std::max(1, request->cpus_per_node)});
          }
          for (const auto& [id, nodes] : scan.nodes) {
            std::optional<HostJob> job = host_->FindJob(id);
            if (!job || job->profile != name || nodes.empty()) continue;
            const int per_node =
                std::max(1, job->shape.pool / static_cast<int>(nodes.size()));
            view.running.push_back({id, nodes, per_node});
          }
          if (view.waiting.empty()) return;
          if (absl::Status s = host_->Preempt(view, mail); !s.ok()) {
            spdlog::warn("profile '{}': preemption: {}", name, s.ToString());
          }
        });
  }
}

}  // namespace dlbatch::scheduler::slurm
