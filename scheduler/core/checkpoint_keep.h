// Which stored checkpoints of a job the scheduler keeps and which one a
// later attempt resumes from. Pure: fed the (part, step) of each kept
// checkpoint, it returns decisions; the scheduler stores and sends them
// (worker_streams.cc, job_life.cc).
//
// A job whose part 0 speaks for it keeps part 0's checkpoints only and
// resumes from the newest. A job with `checkpoint: per-part` keeps every
// part's, and a resume needs each part's own of one step: the newest step
// that every part stored. Parts store at their own pace, so each keeps its
// newest few, and the step a resume would use is never dropped while it is
// the only one all parts have.
#ifndef DLBATCH_SCHEDULER_CORE_CHECKPOINT_KEEP_H_
#define DLBATCH_SCHEDULER_CORE_CHECKPOINT_KEEP_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace dlbatch::scheduler {

// How many stored checkpoints of each part are kept.
inline constexpr int kKeptCheckpoints = 3;

struct CheckpointKey {
  int part = 0;
  int64_t step = 0;
  bool operator==(const CheckpointKey&) const = default;
};

// The newest step of which every part 0 .. parts - 1 has a checkpoint in
// `kept`; nullopt where there is none (or parts < 1). Keys of parts outside
// that range are ignored.
std::optional<int64_t> ResumeStep(const std::vector<CheckpointKey>& kept,
                                  int parts);

// The keys of `kept` to drop so that each part keeps at most `keep` (>= 1)
// of its newest: its checkpoint of `resume` (where it has one) always, in
// place of the oldest of the others. In (part, step) order.
std::vector<CheckpointKey> CheckpointsToDrop(
    const std::vector<CheckpointKey>& kept, std::optional<int64_t> resume,
    int keep);

// The keys of `kept` that a new attempt resuming from `resume` leaves
// behind: every one of a later step (all of them where it starts afresh).
// They belong to a run that no attempt continues, so a part that stores
// such a step again must not find it mixed with the other parts' old
// ones. In (part, step) order.
std::vector<CheckpointKey> CheckpointsAfter(
    const std::vector<CheckpointKey>& kept, std::optional<int64_t> resume);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_CORE_CHECKPOINT_KEEP_H_
