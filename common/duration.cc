#include "common/duration.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dlbatch {

absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a duration; write e.g. 90s, 30m, 1h30m or 2d"));
  };
  if (text.empty()) return bad();
  double total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    while (
        i < text.size() &&
        (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
      ++i;
    }
    if (i == start) return bad();
    std::string number(text.substr(start, i - start));
    char* end = nullptr;
    double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return bad();  // "1.2.3h"
    double unit = 1;
    if (i < text.size()) {
      switch (text[i]) {
        case 's':
          unit = 1;
          break;
        case 'm':
          unit = 60;
          break;
        case 'h':
          unit = 3600;
          break;
        case 'd':
          unit = 86400;
          break;
        default:
          return bad();
      }
      ++i;
    } else if (start != 0) {
      return bad();  // "1h30" is ambiguous
    }
    total += value * unit;
  }
  if (!(total < 1e15)) return bad();  // llround would overflow
  int64_t seconds = static_cast<int64_t>(std::llround(total));
  if (seconds <= 0) return bad();
  return seconds;
}

std::string FormatDurationMs(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return absl::StrFormat("%dms", ms);
  int64_t s = ms / 1000;
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

}  // namespace dlbatch
