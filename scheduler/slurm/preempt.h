// Preemption of dlbatch's own jobs on profiles of Slurm, as one squeue read
// shows it: which queued jobs wait in Slurm for resources that their
// victims' release would give them, where the running jobs' Slurm jobs
// are, and how the bridge ends the Slurm jobs of jobs stopping for a
// preemption. Pure: the bridge feeds it the reconcile's input (its
// records, phases and squeue rows) and carries out the answers.
//
// The choice itself is the core's (ChooseVictimsOnNodes); the scheduler
// makes it, with the facts of its jobs, on the view the bridge builds from
// this and sinfo (SlurmPreemptionView, host.h).
#ifndef DLBATCH_SCHEDULER_SLURM_PREEMPT_H_
#define DLBATCH_SCHEDULER_SLURM_PREEMPT_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "scheduler/core/preemption.h"
#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/reconciler.h"

namespace dlbatch::scheduler::slurm {

struct PreemptionScan {
  // By profile (of those with preemption on): its queued jobs whose Slurm
  // job is pending with Slurm's reason Resources, i.e. next in Slurm's
  // line for the nodes, so that what a victim frees goes to it. A job
  // pending behind others (Priority) would hand their release to the jobs
  // ahead of it: it preempts once it is next.
  std::map<std::string, std::vector<int64_t>> waiting;
  // The running jobs' Slurm jobs' nodes (squeue's %N, expanded).
  std::map<int64_t, std::vector<std::string>> nodes;
  // Nodes being released now: those of a Slurm job that is COMPLETING, or
  // of a Slurm job of this instance that still runs for an attempt that is
  // over (a victim's, requeued; an ended job's). Nothing is preempted on a
  // partition with such a node until it is free: sinfo counts it busy, and
  // a victim's room would otherwise be taken twice. `releasing_unknown`:
  // such a Slurm job's nodes could not be read (every partition waits).
  std::set<std::string> releasing;
  bool releasing_unknown = false;
};
PreemptionScan ScanForPreemption(const ReconcileInput& in,
                                 const std::set<std::string>& profiles);

// A node as preemption weighs it for a job of the profile, in ranks (one
// GPU and one CPU each on GPU nodes, where dlbatch asks a core per GPU;
// one CPU on CPU-only nodes); a node that is not up has none.
NodeRoom RoomOf(const NodeRow& row, bool gpus);

// A job stopping for dlbatch's preemption (its current attempt), whose
// Slurm job the bridge ends.
struct StoppingJob {
  int64_t deadline_ms = 0;   // its grace ends (Preemption.deadline_ms)
  bool unreachable = false;  // a running part's worker has no stream
};
struct StopDecisions {
  // Slurm jobs whose batch step gets SIGTERM (ScancelSignalArgv): a worker
  // is unreachable, so the CancelJob never reached it; the worker of a
  // Slurm job takes Slurm's SIGTERM as a preempting stop of its jobs.
  std::vector<int64_t> signal;
  // Slurm jobs scancelled: `margin_ms` past the grace, the job still has
  // not stopped (its worker kills it at the grace and reports; this ends
  // what did not).
  std::vector<int64_t> cancel;
};
// For each stopping job whose record's Slurm job squeue shows alive.
// `signalled`: Slurm jobs signalled already (each is, once).
StopDecisions StopPreempted(const ReconcileInput& in,
                            const std::map<int64_t, StoppingJob>& stopping,
                            const std::set<int64_t>& signalled,
                            int64_t margin_ms);

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_PREEMPT_H_
