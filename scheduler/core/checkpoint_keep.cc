#include "scheduler/core/checkpoint_keep.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

namespace dlbatch::scheduler {
namespace {

bool CheckpointKeyLess(const CheckpointKey& a, const CheckpointKey& b) {
  return a.part != b.part ? a.part < b.part : a.step < b.step;
}

}  // namespace

std::optional<int64_t> ResumeStep(const std::vector<CheckpointKey>& kept,
                                  int parts) {
  if (parts < 1) return std::nullopt;
  std::map<int64_t, std::set<int>> parts_of_step;
  for (const CheckpointKey& k : kept) {
    if (k.part >= 0 && k.part < parts) parts_of_step[k.step].insert(k.part);
  }
  for (auto it = parts_of_step.rbegin(); it != parts_of_step.rend(); ++it) {
    if (static_cast<int>(it->second.size()) == parts) return it->first;
  }
  return std::nullopt;
}

std::vector<CheckpointKey> CheckpointsToDrop(
    const std::vector<CheckpointKey>& kept, std::optional<int64_t> resume,
    int keep) {
  keep = std::max(1, keep);
  std::map<int, std::set<int64_t, std::greater<>>> steps_of_part;
  for (const CheckpointKey& k : kept) steps_of_part[k.part].insert(k.step);
  std::vector<CheckpointKey> drop;
  for (const auto& [part, steps] : steps_of_part) {
    const bool pinned = resume && steps.contains(*resume);
    // Room for the newest others beside the pinned one.
    int room = pinned ? keep - 1 : keep;
    for (int64_t step : steps) {
      if (pinned && step == *resume) continue;
      if (room > 0) {
        --room;
        continue;
      }
      drop.push_back({part, step});
    }
  }
  std::sort(drop.begin(), drop.end(), CheckpointKeyLess);
  return drop;
}

std::vector<CheckpointKey> CheckpointsAfter(
    const std::vector<CheckpointKey>& kept, std::optional<int64_t> resume) {
  std::vector<CheckpointKey> after;
  for (const CheckpointKey& k : kept) {
    if (!resume || k.step > *resume) after.push_back(k);
  }
  std::sort(after.begin(), after.end(), CheckpointKeyLess);
  return after;
}

}  // namespace dlbatch::scheduler
