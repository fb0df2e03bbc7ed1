// A CPU run's ranks as threads of one process: each thread a rank of its
// own, with a replica of the network, a one-thread backend and its slice
// of every batch, the ranks summing their gradients over shared memory
// (comm/thread_group.h) as a run's processes do over Gloo. Two uses:
// - a one-rank run's mini-batch split over its threads (SplitBatchRanks),
//   which trains the one rank's model;
// - the ranks of a CPU job on one machine (dlbatch-train --thread-ranks, as
//   a worker starts a job on CPU slots), which train as processes of one
//   rank each would. Across machines, one process per machine, its
//   threads meeting the other machines' processes over Gloo.
//
// Why: oneDNN's primitives parallelise each layer over the threads, and a
// step of a small network is many short primitives, each a parallel region
// that wakes the other threads and waits for them. Where they sleep between
// regions (OMP_WAIT_POLICY=passive, or a busy machine) each wake-up costs
// tens of microseconds: a quarter of a LeNet step at batch 64 on two cores,
// as much of the small ResNet's. Split ranks meet once a step for the
// gradients and loss, and twice a step for each batch norm, where they
// spin briefly (bench/RESULTS.md). Against processes over Gloo, threads
// read the data once, share it, and sum without sockets.
//
// A split trains the same model as one rank: every layer but batch norm
// computes each sample on its own, and the gradients of the slices add up
// to the mini-batch's (summed in another order, so the last bits differ).
// Batch norm's statistics span the ranks (Communicator::splits_batch,
// BatchNormKernel::SpanSums): the mini-batch's, as one rank's. Dropout
// draws its masks per rank. The ranks of a pool are ranks as processes
// are: batch norm's statistics are each rank's own unless the layer says
// `sync: true`.
#ifndef DLBATCH_TRAINER_THREAD_RANKS_H_
#define DLBATCH_TRAINER_THREAD_RANKS_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/comm/thread_group.h"
#include "trainer/training.h"

namespace dlbatch::trainer {

// Each split rank trains at least this many samples of a batch, unless
// the split is forced: fewer keep too little work between meetings.
inline constexpr int kMinSamplesPerSplitRank = 16;

// How many thread ranks a one-rank CPU run with `threads` threads and a
// mini-batch of `mini_batch` trains as: the most that divide the threads
// and keep kMinSamplesPerSplitRank samples each (1: no split). `forced`
// (DLBATCH_SPLIT_BATCH): false never splits; true splits over every thread
// down to one sample each.
int SplitBatchRanks(int mini_batch, int threads, std::optional<bool> forced);

// DLBATCH_SPLIT_BATCH: unset (split where it pays), 1 or 0; anything else
// is an error saying what to set.
absl::StatusOr<std::optional<bool>> SplitBatchSwitch();

// How a run's replicas (its ranks) sit in processes and threads: what the
// diary's first line and metrics.json say of it.
struct RunLayout {
  int replicas = 1;
  std::vector<int> replicas_per_process;  // in process order; sums to replicas
  // Each replica's CPU threads; 0: not counted (a GPU's, or unknown).
  int threads_per_replica = 0;
  bool split_batch = false;  // one rank's mini-batch split over them

  int processes() const {
    return static_cast<int>(replicas_per_process.size());
  }
  // Process p's threads (0: not counted).
  int threads_of(int p) const {
    return replicas_per_process[p] * threads_per_replica;
  }
};

// A rank's layout: its request's ranks_per_process (empty: a process per
// rank) and threads, `replicas` in all, on a GPU (threads not counted) or
// the CPU.
RunLayout LayoutOf(const TrainRequest& request, int replicas, bool on_gpu,
                   bool split_batch);

// The layout in words, with the global mini-batch: "1 process, 2
// threads, each mini-batch of 64 split over 2 replicas"; "2 processes, 2
// threads each, ..."; "1 process, 1 thread, mini-batch 64"; on a GPU "4
// processes, each mini-batch of 256 split over 4 replicas".
std::string DescribeLayout(const RunLayout& layout, int mini_batch);

// How one process trains ranks on its threads.
struct ThreadRanks {
  int count = 2;    // ranks on this process's threads (at least 1)
  int threads = 1;  // each rank's backend threads
  // True: the ranks split one rank's mini-batch (its batch norms span
  // them). False: the ranks of a pool, each its own rank.
  bool split_batch = true;
  // A run over several processes: this process's place in it (the
  // processes' communicator, their first ranks, their store). Empty
  // (between null): the process's ranks are the whole run.
  ThreadGroup::Span span;
};

// Trains `request` (its communicator and rendezvous are ignored: the
// group's stand in) as ranks.count ranks of ranks.threads threads each,
// rank 0 on the calling thread with the request's diary and progress
// channel, the others on threads of their own. The data are read once,
// with every thread. A rank that fails ends the others' collectives;
// returns rank 0's result, or the first rank's error that was not only the
// end of the group.
absl::StatusOr<TrainResult> TrainOnThreadRanks(const TrainRequest& request,
                                               const ThreadRanks& ranks);

// The processes of a run over several, each training `count` ranks on its
// threads from rank `first` on, of `world` in all: each says its first
// rank and count in `rendezvous` and reads the others', in rank order.
// Returns every process's first rank (this one's among them), ascending
// from 0. DeadlineExceeded naming the missing process's first rank after
// `timeout`; InvalidArgument where the processes' ranks do not tile
// [0, world).
absl::StatusOr<std::vector<int>> MeetProcesses(Rendezvous* rendezvous,
                                               int first, int count, int world,
                                               absl::Duration timeout);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_THREAD_RANKS_H_
