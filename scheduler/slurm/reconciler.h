// What one batched squeue read means for dlbatch's jobs on profiles of
// Slurm: the pure core of the reconciler. The scheduler reads the profiles'
// partitions with one squeue call every few seconds while any such job
// exists (slurm_tool.h ReadQueue), feeds the rows here with the store's
// Slurm records and its own view of each job, and carries out the
// decisions (commit, requeue or fail, scancel). No I/O, no clock read.
//
// The ephemeral workers' reports are authoritative; Slurm's word counts
// only where they cannot speak. A Slurm job that ended or vanished while
// its dlbatch job was neither ended nor reported ended by its workers is
// never taken as a success: its job is lost, with Slurm's reason. A
// `dlbatch-<instance>-<id>` Slurm job of this scheduler's instance that it
// does not know (a scheduler that died between sbatch and its commit, or a
// job since forgotten) is cancelled, unless an intent of the same job
// adopts it. Other instances' Slurm jobs (schedulers sharing the cluster)
// are never touched. One named `dlbatch-<id>` (before instance ids) is
// this scheduler's only where the store holds its Slurm job id for that
// job; otherwise it is left alone, and said so (left_alone).
#ifndef DLBATCH_SCHEDULER_SLURM_RECONCILER_H_
#define DLBATCH_SCHEDULER_SLURM_RECONCILER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/launcher.h"

namespace dlbatch::scheduler::slurm {

// Where dlbatch has a job with a Slurm record.
enum class JobPhase {
  kWaiting,  // queued: its Slurm job pending, or its workers not all in
  kRunning,  // its parts started on the Slurm job's workers
  // Every part ended as its workers reported, one of them killed by a
  // signal (EndedBySignal): whether Slurm did that decides the job's end.
  kSettling,
  kEnded,  // finished, failed or cancelled (its end is committed)
};

// Whether a part's end as its worker reported it may be Slurm's doing: it
// failed with 128 + N, N a signal (the worker's code for a process killed
// by one, or a shell's exit after one). scancel, Slurm's time limit,
// preemption and a failing node signal the job's processes as well as its
// worker, whose report can then reach the scheduler before squeue says
// why: such a job is settled by Slurm's word (kSettling), not by the
// report alone.
bool EndedBySignal(bool finished, int exit_code);

struct ReconcileInput {
  std::string instance;                 // this scheduler's (IsInstanceId)
  std::vector<SlurmJobRecord> records;  // the store's
  std::map<int64_t, JobPhase> jobs;     // absent: the job is gone (purged)
  std::vector<SqueueRow> rows;          // one squeue read
  std::map<std::string, std::string> partitions;  // profile -> partition
  int64_t now_ms = 0;
  // A Slurm job submitted less than this long ago that squeue does not
  // show yet is left alone; an intent older than this with no Slurm job of
  // its name was never made by sbatch.
  int64_t settle_ms = 10000;
  // kSettling jobs: when (NowMs) their last part's end was reported. Slurm
  // may say RUNNING or COMPLETING that long while it signals and reaps the
  // job's processes (KillWait, 30 s by default); past it, the workers'
  // report stands.
  std::map<int64_t, int64_t> settling_since;
  int64_t settling_wait_ms = 45000;
};

struct ReconcileDecisions {
  // Intents whose Slurm job squeue shows by name: commit its id.
  struct Adopt {
    int64_t job_id;
    int64_t slurm_id;
  };
  std::vector<Adopt> adopt;
  // Jobs whose Slurm job is pending: `show`'s wait reason.
  std::map<int64_t, std::string> waiting;
  // Jobs whose Slurm job ended or vanished before they ended: lost. The
  // scheduler requeues one within its retry limit (resuming from its
  // checkpoint) or fails it, with `reason`. `machine_fault`: Slurm's
  // machines failed it (NODE_FAIL, PREEMPTED, BOOT_FAIL, or it vanished),
  // not its own code or a person.
  struct Lost {
    int64_t job_id;
    std::string reason;
    bool machine_fault;
    // Slurm preempted it (SlurmVerdict::preempted): queued again as
    // preempted, not counted against its attempts.
    bool preempted = false;
  };
  std::vector<Lost> lost;
  // kSettling jobs whose workers' report stands: Slurm's job ended by
  // itself (COMPLETED, FAILED: the signal was not Slurm's), squeue no
  // longer shows it, or it still runs past settling_wait_ms. Those Slurm
  // ended (CANCELLED, TIMEOUT, NODE_FAIL, ...) are `lost`, with its reason.
  std::vector<int64_t> reported;
  // Records to forget (the job's Slurm job is over, or was never made):
  // the record and its one-job credential go.
  std::vector<int64_t> forget;
  // Intents that sbatch never turned into a Slurm job: forget them and
  // launch the job again.
  std::vector<int64_t> relaunch;
  // Slurm jobs to scancel: dlbatch's that it no longer knows, or whose
  // dlbatch job ended while they still run or wait.
  struct Cancel {
    int64_t slurm_id;
    std::string why;
  };
  std::vector<Cancel> cancel;
  // Live Slurm jobs named as before instance ids (`dlbatch-<id>`) whose id
  // the store does not hold: maybe another scheduler's, so never
  // cancelled; `why` is for the log.
  struct LeftAlone {
    int64_t slurm_id;
    std::string why;
  };
  std::vector<LeftAlone> left_alone;
};

ReconcileDecisions Reconcile(const ReconcileInput& in);

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_RECONCILER_H_
