#include "scheduler/slurm/preempt.h"

#include <algorithm>

namespace dlbatch::scheduler::slurm {
namespace {

JobPhase JobPhaseIn(const ReconcileInput& in, int64_t job_id) {
  auto it = in.jobs.find(job_id);
  return it == in.jobs.end() ? JobPhase::kEnded : it->second;
}

bool StillHeld(const SqueueRow& row) {
  return MapSlurmState(row, "").phase != SlurmPhase::kEnded;
}

// The record's Slurm job as squeue shows it, if it is the job's (named
// for it by this instance).
const SqueueRow* RowOfRecord(const ReconcileInput& in,
                             const SlurmJobRecord& r) {
  if (r.slurm_id == 0) return nullptr;
  for (const SqueueRow& row : in.rows) {
    if (row.slurm_id != r.slurm_id) continue;
    std::optional<ParsedSlurmName> name = ParseSlurmJobName(row.name);
    if (!name || name->job_id != r.job_id || name->instance != in.instance) {
      return nullptr;
    }
    return &row;
  }
  return nullptr;
}

}  // namespace

PreemptionScan ScanForPreemption(const ReconcileInput& in,
                                 const std::set<std::string>& profiles) {
  PreemptionScan scan;
  // Slurm jobs some record holds for an attempt that runs or waits.
  std::set<int64_t> current;
  for (const SlurmJobRecord& r : in.records) {
    const JobPhase phase = JobPhaseIn(in, r.job_id);
    const SqueueRow* row = RowOfRecord(in, r);
    if (row == nullptr) continue;
    if (phase != JobPhase::kEnded) current.insert(r.slurm_id);
    if (profiles.count(r.profile) == 0) continue;
    if (phase == JobPhase::kWaiting && row->state == "PENDING" &&
        row->reason == "Resources") {
      scan.waiting[r.profile].push_back(r.job_id);
    } else if (phase == JobPhase::kRunning && row->state == "RUNNING") {
      absl::StatusOr<std::vector<std::string>> nodes =
          ExpandHostlist(row->nodes);
      if (nodes.ok()) scan.nodes[r.job_id] = *std::move(nodes);
    }
  }
  for (const SqueueRow& row : in.rows) {
    std::optional<ParsedSlurmName> name = ParseSlurmJobName(row.name);
    const bool over = name && name->instance == in.instance && StillHeld(row) &&
                      row.state != "PENDING" &&
                      current.count(row.slurm_id) == 0;
    if (row.state != "COMPLETING" && !over) continue;
    absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(row.nodes);
    if (!nodes.ok()) {
      scan.releasing_unknown = true;
      continue;
    }
    scan.releasing.insert(nodes->begin(), nodes->end());
  }
  return scan;
}

NodeRoom RoomOf(const NodeRow& row, bool gpus) {
  NodeRoom room;
  room.name = row.name;
  if (!row.usable) return room;
  if (gpus) {
    room.units = std::min(row.gpus, row.cpus);
    room.free = std::min(row.gpus - row.gpus_used, row.cpus_idle);
  } else {
    room.units = row.cpus;
    room.free = row.cpus_idle;
  }
  room.free = std::clamp(room.free, 0, std::max(0, room.units));
  return room;
}

StopDecisions StopPreempted(const ReconcileInput& in,
                            const std::map<int64_t, StoppingJob>& stopping,
                            const std::set<int64_t>& signalled,
                            int64_t margin_ms) {
  StopDecisions out;
  for (const SlurmJobRecord& r : in.records) {
    auto it = stopping.find(r.job_id);
    if (it == stopping.end() ||
        JobPhaseIn(in, r.job_id) != JobPhase::kRunning) {
      continue;
    }
    const SqueueRow* row = RowOfRecord(in, r);
    if (row == nullptr || !StillHeld(*row) || row->state == "PENDING") continue;
    if (in.now_ms >= it->second.deadline_ms + margin_ms) {
      out.cancel.push_back(r.slurm_id);
    } else if (it->second.unreachable && signalled.count(r.slurm_id) == 0) {
      out.signal.push_back(r.slurm_id);
    }
  }
  return out;
}

}  // namespace dlbatch::scheduler::slurm
