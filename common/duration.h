// Durations as people write them in job.yaml and on the command line.
#ifndef DLBATCH_COMMON_DURATION_H_
#define DLBATCH_COMMON_DURATION_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlbatch {

// "90" (seconds), "90s", "30m", "1h30m", "2d", "1.5h" -> seconds (> 0).
absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text);
// "1h02m", "3m05s", "42s", "850ms".
std::string FormatDurationMs(int64_t ms);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_DURATION_H_
