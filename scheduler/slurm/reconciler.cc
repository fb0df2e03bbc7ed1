#include "scheduler/slurm/reconciler.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace dlbatch::scheduler::slurm {
namespace {

JobPhase PhaseOf(const ReconcileInput& in, int64_t job_id) {
  auto it = in.jobs.find(job_id);
  return it == in.jobs.end() ? JobPhase::kEnded : it->second;
}

std::string PartitionOf(const ReconcileInput& in, const std::string& profile) {
  auto it = in.partitions.find(profile);
  return it == in.partitions.end() ? profile : it->second;
}

// Whether `row` may be job `job_id`'s Slurm job: named for it by this
// instance, or (`recorded`: the store holds the row's Slurm id for the
// job) in the form of before instance ids.
bool NamedFor(const ReconcileInput& in, const SqueueRow& row, int64_t job_id,
              bool recorded) {
  const std::optional<ParsedSlurmName> name = ParseSlurmJobName(row.name);
  if (!name || name->job_id != job_id) return false;
  return name->instance == in.instance || (recorded && name->instance.empty());
}

// Whether the Slurm job still waits or runs (or may: a state unknown).
bool Alive(const SqueueRow& row, const std::string& partition) {
  return MapSlurmState(row, partition).phase != SlurmPhase::kEnded;
}

// A kSettling job: Slurm's reason where Slurm ended its job, the workers'
// report where it ended by itself or is not shown, a wait while it still
// runs (within settling_wait_ms).
void SettleSignalledEnd(const ReconcileInput& in, const SlurmJobRecord& r,
                        const SqueueRow* row, const std::string& partition,
                        ReconcileDecisions* out) {
  if (row == nullptr) {
    out->reported.push_back(r.job_id);
    if (in.now_ms - r.submitted_ms >= in.settle_ms) {
      out->forget.push_back(r.job_id);
    }
    return;
  }
  const SlurmVerdict verdict = MapSlurmState(*row, partition);
  if (verdict.phase == SlurmPhase::kEnded) {
    if (verdict.by_slurm) {
      out->lost.push_back(
          {r.job_id, verdict.reason, verdict.retryable, verdict.preempted});
    } else {
      out->reported.push_back(r.job_id);
    }
    out->forget.push_back(r.job_id);
    return;
  }
  auto since = in.settling_since.find(r.job_id);
  if (since == in.settling_since.end() ||
      in.now_ms - since->second >= in.settling_wait_ms) {
    out->reported.push_back(r.job_id);  // its Slurm job goes as it lingers
  }
}

}  // namespace

bool EndedBySignal(bool finished, int exit_code) {
  constexpr int kMaxSignal = 64;  // SIGRTMAX on Linux
  return !finished && exit_code > 128 && exit_code <= 128 + kMaxSignal;
}

ReconcileDecisions Reconcile(const ReconcileInput& in) {
  ReconcileDecisions out;
  std::map<int64_t, const SqueueRow*> by_id;
  for (const SqueueRow& row : in.rows) by_id[row.slurm_id] = &row;
  std::set<int64_t> known;
  for (const SlurmJobRecord& r : in.records) {
    if (r.slurm_id != 0) known.insert(r.slurm_id);
  }

  for (const SlurmJobRecord& record : in.records) {
    SlurmJobRecord r = record;
    const JobPhase phase = PhaseOf(in, r.job_id);
    const std::string partition = PartitionOf(in, r.profile);
    const bool settled = in.now_ms - r.submitted_ms >= in.settle_ms;
    if (r.slurm_id == 0) {
      // An intent: sbatch ran, or was about to, when the id went unsaid.
      // The newest live Slurm job of the job's name that no record holds
      // is the one it made.
      const SqueueRow* made = nullptr;
      for (const SqueueRow& row : in.rows) {
        if (NamedFor(in, row, r.job_id, /*recorded=*/false) &&
            known.count(row.slurm_id) == 0 && Alive(row, partition) &&
            (made == nullptr || row.slurm_id > made->slurm_id)) {
          made = &row;
        }
      }
      if (made == nullptr) {
        if (!settled) continue;
        if (phase == JobPhase::kEnded) {
          out.forget.push_back(r.job_id);
        } else {
          out.relaunch.push_back(r.job_id);
        }
        continue;
      }
      known.insert(made->slurm_id);
      if (phase == JobPhase::kEnded) {
        out.cancel.push_back(
            {made->slurm_id,
             absl::StrCat("dlbatch job ", r.job_id, " has ended")});
        out.forget.push_back(r.job_id);
        continue;
      }
      out.adopt.push_back({r.job_id, made->slurm_id});
      r.slurm_id = made->slurm_id;
    }
    auto row = by_id.find(r.slurm_id);
    // A Slurm id the job's name does not go with is not its Slurm job
    // (Slurm's ids began again): never another's to touch.
    if (row != by_id.end() &&
        !NamedFor(in, *row->second, r.job_id, /*recorded=*/true)) {
      row = by_id.end();
    }
    if (phase == JobPhase::kSettling) {
      SettleSignalledEnd(in, r, row == by_id.end() ? nullptr : row->second,
                         partition, &out);
      continue;
    }
    if (row == by_id.end()) {
      if (!settled) continue;  // squeue may not show it yet
      if (phase != JobPhase::kEnded) {
        out.lost.push_back(
            {r.job_id,
             absl::StrCat("Slurm job ", r.slurm_id,
                          " vanished from Slurm before its workers reported "
                          "the job's end"),
             /*machine_fault=*/true});
      }
      out.forget.push_back(r.job_id);
      continue;
    }
    const SlurmVerdict verdict = MapSlurmState(*row->second, partition);
    switch (verdict.phase) {
      case SlurmPhase::kPending:
      case SlurmPhase::kRunning:
        if (phase == JobPhase::kEnded) {
          out.cancel.push_back(
              {r.slurm_id,
               absl::StrCat("dlbatch job ", r.job_id, " has ended")});
        } else if (verdict.phase == SlurmPhase::kPending) {
          out.waiting[r.job_id] = verdict.reason;
        }
        break;
      case SlurmPhase::kEnded:
        if (phase != JobPhase::kEnded) {
          out.lost.push_back(
              {r.job_id, verdict.reason, verdict.retryable, verdict.preempted});
        }
        out.forget.push_back(r.job_id);
        break;
      case SlurmPhase::kUnknown:
        break;  // a state this version does not know: leave the job be
    }
  }

  // This instance's names that no record holds: nothing of its own may run
  // in Slurm that it does not know about. Other instances' are theirs.
  for (const SqueueRow& row : in.rows) {
    const std::optional<ParsedSlurmName> name = ParseSlurmJobName(row.name);
    if (!name || known.count(row.slurm_id) > 0 ||
        MapSlurmState(row, "").phase == SlurmPhase::kEnded) {
      continue;
    }
    if (name->instance == in.instance) {
      out.cancel.push_back(
          {row.slurm_id, absl::StrCat("dlbatch does not know Slurm job ",
                                      row.slurm_id, " (", row.name, ")")});
    } else if (name->instance.empty()) {
      out.left_alone.push_back(
          {row.slurm_id,
           absl::StrCat("Slurm job ", row.slurm_id, " (", row.name,
                        ") is named as before scheduler instances and this "
                        "scheduler does not know it: left alone, as it may "
                        "be another scheduler's; scancel it if it is this "
                        "one's")});
    }
  }
  return out;
}

}  // namespace dlbatch::scheduler::slurm
