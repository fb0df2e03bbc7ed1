// A CPU run's mini-batch split over its threads: each thread a rank of its
// own, with a replica of the network, a one-thread backend and its slice
// of every batch, the ranks summing their gradients over shared memory
// (comm/thread_group.h) as a run's processes do over Gloo.
//
// Why: oneDNN's primitives parallelise each layer over the threads, and a
// step of a small network is many short primitives, each a parallel region
// that wakes the other threads and waits for them. Where they sleep between
// regions (OMP_WAIT_POLICY=passive, or a busy machine) each wake-up costs
// tens of microseconds: a quarter of a LeNet step at batch 64 on two cores,
// as much of the small ResNet's. Split ranks meet once a step for the
// gradients and loss, and twice a step for each batch norm, where they
// spin briefly (bench/RESULTS.md).
//
// A split trains the same model as one rank: every layer but batch norm
// computes each sample on its own, and the gradients of the slices add up
// to the mini-batch's (summed in another order, so the last bits differ).
// Batch norm's statistics span the ranks (Communicator::splits_batch,
// BatchNormKernel::SpanSums): the mini-batch's, as one rank's. Dropout
// draws its masks per rank.
#ifndef DLBATCH_TRAINER_THREAD_RANKS_H_
#define DLBATCH_TRAINER_THREAD_RANKS_H_

#include <optional>

#include "absl/status/statusor.h"
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

// Trains `request` (one rank: its communicator is ignored) as `ranks`
// ranks of request.threads / ranks threads each, rank 0 on the calling
// thread with the request's diary and progress channel, the others on
// threads of their own. A rank that fails ends the others' collectives;
// returns rank 0's result, or the first rank's error that was not only
// the end of the group.
absl::StatusOr<TrainResult> TrainOnThreadRanks(const TrainRequest& request,
                                               int ranks);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_THREAD_RANKS_H_
