// How the CLI shows a diary line. A line holds the bytes the job printed,
// which may be anything: invalid UTF-8, NULs, terminal escape sequences.
#ifndef DLBATCH_CLIENT_DIARY_TEXT_H_
#define DLBATCH_CLIENT_DIARY_TEXT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/utf8.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch::client {

// The line made safe for a terminal: TerminalText (terminal_text.h) that
// keeps tabs. Valid UTF-8 and tabs are kept; every other control character
// (C0, DEL, and C1 as its two UTF-8 bytes) and every byte that is not part
// of valid UTF-8 is written as \xHH (ESC as \x1b, a NUL as \x00, a stray
// 0xff as \xff). A backslash is kept as it is: the result is for reading,
// and `diary --raw` / `--json` carry the exact bytes (json_out.h:
// DiaryLineJson).
std::string EscapeDiaryText(std::string_view bytes);

// `diary --rank` as given, each a rank (a number from 0), a range (0-3) or a
// list of them (0,2); repeated flags add up. The ranks sorted, each once; a
// usage error (connection.h) that says what to give otherwise.
absl::StatusOr<std::vector<int32_t>> ParseDiaryRanks(
    const std::vector<std::string>& args);

// A line's label in the text view of a job of several processes, as srun
// --label gives it: "[3] " for rank 3; "" for dlbatch's own lines, which no
// process wrote (their text says "[dlbatch]").
std::string RankLabel(const v1::DiaryLine& line);

// Whether `job`, as placed now, runs several processes: several parts. The
// one place that says so for the text view's labels (a launch of several
// processes per part answers here too).
bool RunsSeveralProcesses(const v1::Job& job);

// Whether the text view labels lines (RankLabel): once the job is known to
// run several processes, and from then on. That is known at its first line
// of a process: from `several_parts` (asked once, then:
// RunsSeveralProcesses of the job as it is placed), or from a line of a
// rank above 0 (whose rank 0 runs too). Not thread-safe.
class DiaryLabels {
 public:
  explicit DiaryLabels(std::function<bool()> several_parts)
      : several_parts_(std::move(several_parts)) {}
  // Whether `line`, shown next, is labelled.
  bool Label(const v1::DiaryLine& line);

 private:
  std::function<bool()> several_parts_;
  bool asked_ = false;
  bool several_ = false;
};

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_DIARY_TEXT_H_
