#include "client/diary_text.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/connection.h"
#include "client/terminal_text.h"

namespace dlbatch::client {

std::string EscapeDiaryText(std::string_view bytes) {
  return TerminalText(bytes, {.tab = true});
}

namespace {

// The most ranks one `--rank` selects (as the scheduler allows).
constexpr int64_t kMaxSelectedRanks = 1024;

absl::Status BadRank(absl::string_view arg, absl::string_view why) {
  return UsageError(absl::StrCat(
      "--rank ", TerminalText(std::string_view(arg.data(), arg.size())), ": ",
      why,
      "; give a rank (a number from 0, the \"rank\" `dlbatch diary --json` "
      "shows), a range such as 0-3, or a list such as 0,2"));
}

bool ParseOneRank(absl::string_view text, int32_t* rank) {
  if (text.empty() || text.front() == '+' || text.front() == '-') return false;
  return absl::SimpleAtoi(text, rank) && *rank >= 0;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ParseDiaryRanks(
    const std::vector<std::string>& args) {
  std::vector<int32_t> ranks;
  for (const std::string& arg : args) {
    for (absl::string_view item : absl::StrSplit(arg, ',')) {
      if (item.empty()) return BadRank(arg, "an empty rank");
      if (item.front() == '-') {
        return BadRank(arg, "ranks are numbered from 0, never negative");
      }
      const size_t dash = item.find('-');
      int32_t first = 0, last = 0;
      if (dash == absl::string_view::npos) {
        if (!ParseOneRank(item, &first)) return BadRank(arg, "not a rank");
        last = first;
      } else if (!ParseOneRank(item.substr(0, dash), &first) ||
                 !ParseOneRank(item.substr(dash + 1), &last)) {
        return BadRank(arg, "not a range of ranks");
      } else if (last < first) {
        return BadRank(arg, "a range goes from the lower rank to the higher");
      }
      if (static_cast<int64_t>(last) - first + 1 +
              static_cast<int64_t>(ranks.size()) >
          kMaxSelectedRanks) {
        return BadRank(arg, absl::StrCat("more than ", kMaxSelectedRanks,
                                         " ranks at once"));
      }
      for (int64_t r = first; r <= last; ++r)
        ranks.push_back(static_cast<int32_t>(r));
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

std::string RankLabel(const v1::DiaryLine& line) {
  if (!line.has_rank()) return "";
  return absl::StrCat("[", line.rank(), "] ");
}

bool RunsSeveralProcesses(const v1::Job& job) {
  return job.placement_size() > 1;
}

bool DiaryLabels::Label(const v1::DiaryLine& line) {
  if (!line.has_rank()) return several_;
  if (!asked_) {
    asked_ = true;
    if (several_parts_ && several_parts_()) several_ = true;
  }
  if (line.rank() > 0) several_ = true;
  return several_;
}

}  // namespace dlbatch::client
