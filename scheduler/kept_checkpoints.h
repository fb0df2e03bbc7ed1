// The stored checkpoints a job keeps, as the scheduler holds them in memory
// (ActiveJob::kept_checkpoints): the proto side of the pure choice in
// core/checkpoint_keep.h, shared by the checkpoint reports
// (worker_streams.cc), the start of an attempt (job_life.cc) and `show`.
#ifndef DLBATCH_SCHEDULER_KEPT_CHECKPOINTS_H_
#define DLBATCH_SCHEDULER_KEPT_CHECKPOINTS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/checkpoint_keep.h"

namespace dlbatch::scheduler {

// Whether every part of the job stores its own checkpoint.
bool PerPartCheckpoints(const v1::JobSpec& spec);

// The parts a resume needs a checkpoint of: all `parts` of the attempt
// with `checkpoint: per-part`, else part 0 alone.
int ResumeParts(const v1::JobSpec& spec, int parts);

std::vector<CheckpointKey> KeysOf(
    const std::vector<v1::CheckpointStored>& kept);

// The one of `part` and `step` in `kept`; null where there is none.
const v1::CheckpointStored* FindKept(
    const std::vector<v1::CheckpointStored>& kept, int part,
    std::optional<int64_t> step);

// `checkpoint` put into `kept` (replacing one of its part and step), kept
// in (part, iteration) order.
void PutKept(std::vector<v1::CheckpointStored>* kept,
             const v1::CheckpointStored& checkpoint);
void EraseKept(std::vector<v1::CheckpointStored>* kept, CheckpointKey key);

// The newest iteration `part` has in `kept`; nullopt where it has none.
std::optional<int64_t> NewestOfPart(
    const std::vector<v1::CheckpointStored>& kept, int part);

// Bytes the kept checkpoints hold in the store: each blob once, however
// many of them (and of their paths) name it.
int64_t KeptBytes(const std::vector<v1::CheckpointStored>& kept);

// Whether a and b are the same resume point: both without files, or equal.
bool SameCheckpoint(const v1::CheckpointStored& a,
                    const v1::CheckpointStored& b);

// job->checkpoints (`show`): `kept`, those of the step of `resume` (the
// job's ActiveJob::checkpoint) marked as what a later attempt resumes from.
void SetKeptCheckpoints(const std::vector<v1::CheckpointStored>& kept,
                        const v1::CheckpointStored& resume, v1::Job* job);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_KEPT_CHECKPOINTS_H_
