#include "scheduler/core/array_limits.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace dlbatch::scheduler {

ArrayLimits::Group& ArrayLimits::Touch(const ArrayMember& job) {
  Group& g = groups_[job.array];
  g.limit = job.limit;  // every job of an array carries the same
  dirty_.insert(job.array);
  return g;
}

void ArrayLimits::Queued(const ArrayMember& job) {
  Touch(job).parked.insert(KeyOf(job));
}

void ArrayLimits::Unqueued(const ArrayMember& job) {
  auto it = groups_.find(job.array);
  if (it == groups_.end()) return;
  const Key key = KeyOf(job);
  if (it->second.released.erase(key) + it->second.parked.erase(key) > 0) {
    dirty_.insert(job.array);
  }
}

void ArrayLimits::Started(const ArrayMember& job) { ++Touch(job).running; }

void ArrayLimits::Ended(const ArrayMember& job) {
  auto it = groups_.find(job.array);
  if (it == groups_.end() || it->second.running == 0) return;
  --it->second.running;
  dirty_.insert(job.array);
}

void ArrayLimits::Settle(const std::function<void(int64_t)>& release,
                         const std::function<void(int64_t)>& park) {
  for (int64_t array : dirty_) {
    auto it = groups_.find(array);
    if (it == groups_.end()) continue;
    Group& g = it->second;
    const size_t room = static_cast<size_t>(std::max(0, g.limit - g.running));
    for (;;) {
      if (g.released.size() > room) {
        auto last = std::prev(g.released.end());
        park(last->id);
        g.parked.insert(g.released.extract(last));
      } else if (g.released.size() < room && !g.parked.empty()) {
        release(g.parked.begin()->id);
        g.released.insert(g.parked.extract(g.parked.begin()));
      } else if (!g.parked.empty() && !g.released.empty() &&
                 *g.parked.begin() < *std::prev(g.released.end())) {
        // A job queued ahead of a released one (a requeue): it goes first.
        auto last = std::prev(g.released.end());
        park(last->id);
        g.parked.insert(g.released.extract(last));
      } else {
        break;
      }
    }
    if (g.running == 0 && g.released.empty() && g.parked.empty()) {
      groups_.erase(it);
    }
  }
  dirty_.clear();
}

bool ArrayLimits::IsParked(const ArrayMember& job) const {
  auto it = groups_.find(job.array);
  return it != groups_.end() && it->second.parked.count(KeyOf(job)) != 0;
}

std::optional<ArrayStanding> ArrayLimits::Standing(int64_t array) const {
  auto it = groups_.find(array);
  if (it == groups_.end()) return std::nullopt;
  const Group& g = it->second;
  return ArrayStanding{array, g.limit, g.running,
                       static_cast<int>(g.released.size()),
                       static_cast<int>(g.parked.size())};
}

std::string ArrayWaitText(const ArrayStanding& s) {
  std::string text = absl::StrCat("array ", s.array, " has ", s.running, " of ",
                                  s.limit, " running");
  if (s.running < s.limit && s.released > 0) {
    absl::StrAppend(&text, " and ", s.released, " next to start");
  }
  absl::StrAppend(&text, " (%", s.limit, ")");
  return text;
}

}  // namespace dlbatch::scheduler
