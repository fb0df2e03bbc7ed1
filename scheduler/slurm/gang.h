// The workers of one Slurm batch job, gathered as they register (one per
// node, in any order), and the job's parts once every node's has: part i
// on node i (SLURM_NODEID i). With one task per node srun numbers its
// tasks by node (SLURM_PROCID = SLURM_NODEID), so the job's ranks follow
// node order and rank 0, whose host the job's other ranks reach through the
// scheduler's rendezvous (Gloo, NCCL), is on node 0.
//
// Pure: fed registrations and departures, it answers with the parts.
// Not thread-safe; the scheduler holds it under its lock.
#ifndef DLBATCH_SCHEDULER_SLURM_GANG_H_
#define DLBATCH_SCHEDULER_SLURM_GANG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/core/placement.h"

namespace dlbatch::scheduler {

class SlurmGang {
 public:
  // The batch job of attempt `attempt` of job `job_id`: `nodes` nodes,
  // each giving the job `slots_per_node` devices: GPUs where `gpus`, else
  // CPU slots (the CPUs Slurm gave the node's task).
  SlurmGang(int64_t job_id, int attempt, int nodes, int slots_per_node,
            bool gpus = true);

  // Worker `worker` registered as node `node_index` of `nodes`, with
  // `slots` devices of the gang's kind. A worker registering again
  // (reconnected) keeps its node. FailedPrecondition, saying why, where
  // the Slurm job cannot hold the dlbatch job: its node count disagrees,
  // or the worker has fewer devices than the job was given on each node
  // (Slurm gave the node less than dlbatch asked, or its CPU affinity is
  // narrower). InvalidArgument where the node is not one of the job's, or
  // another worker holds it.
  absl::Status Join(int node_index, int nodes, WorkerId worker, int slots);
  // The worker is gone (its node is free again). No-op for a stranger.
  void Leave(WorkerId worker);

  bool complete() const;
  // Nodes whose worker has not registered, ascending (for `show`).
  std::vector<int> Missing() const;
  // REQUIRES: complete(). One part per node in node order, each the
  // first slots_per_node devices of its worker.
  std::vector<Part> Parts() const;

  int64_t job_id() const { return job_id_; }
  int attempt() const { return attempt_; }

 private:
  const int64_t job_id_;
  const int attempt_;
  const int slots_per_node_;
  const bool gpus_;
  std::vector<WorkerId> node_worker_;  // 0: not registered
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SLURM_GANG_H_
