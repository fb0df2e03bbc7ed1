#include "scheduler/core/worker_wait_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace dlbatch::scheduler {

std::string OfflineSince(int64_t last_seen_ms, int64_t now_ms) {
  if (last_seen_ms <= 0) return "offline";
  const absl::TimeZone zone = absl::LocalTimeZone();
  const absl::Time seen = absl::FromUnixMillis(last_seen_ms);
  const bool today =
      absl::FormatTime("%Y-%m-%d", seen, zone) ==
      absl::FormatTime("%Y-%m-%d", absl::FromUnixMillis(now_ms), zone);
  return absl::StrCat(
      "offline since ",
      absl::FormatTime(today ? "%H:%M:%S" : "%Y-%m-%d %H:%M:%S", seen, zone));
}

std::string WaitingForWorkers(const std::vector<WaitedWorker>& workers,
                              int64_t now_ms) {
  std::vector<std::string> said;
  for (const WaitedWorker& w : workers) {
    if (said.size() == kNamedWaitedWorkers) {
      const size_t more = workers.size() - kNamedWaitedWorkers;
      said.push_back(absl::StrCat(more, " more worker", more == 1 ? "" : "s"));
      break;
    }
    std::string state =
        w.draining ? "draining" : OfflineSince(w.last_seen_ms, now_ms);
    if (w.draining && !w.drain_reason.empty()) {
      absl::StrAppend(&state, " (\"", w.drain_reason, "\")");
    }
    said.push_back(absl::StrCat("worker '", w.name, "' is ", state));
  }
  return absl::StrCat("waiting: ", absl::StrJoin(said, "; "));
}

}  // namespace dlbatch::scheduler
