// Job arrays: a spec with `array:` (Slurm's --array syntax) stands for one
// job per index, each told its index in $DLBATCH_ARRAY_INDEX, with at most
// %N of them running at once.
//
// Syntax (as sbatch --array): entries separated by commas, each an index
// ("7"), a range ("0-99") or a range with a step ("0-15:4" is 0,4,8,12);
// then optionally "%N", the most jobs of the array that run at once.
// Indexes are whole numbers from 0 to kMaxArrayIndex; an index named twice
// (overlapping entries) makes one job, and jobs are made in index order.
#ifndef DLBATCH_PROTO_ARRAY_SPEC_H_
#define DLBATCH_PROTO_ARRAY_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

// The most jobs one array may make, and the largest index.
inline constexpr int64_t kMaxArrayJobs = 10000;
inline constexpr int64_t kMaxArrayIndex = 999'999'999;
// The longest `array:` text read (a bound on the work a spec can ask for).
inline constexpr size_t kMaxArrayTextLength = 4096;

struct ArraySpec {
  std::vector<int64_t> indexes;  // ascending, each once; never empty
  int32_t limit = 0;             // %N; 0: no limit
};

// Errors (InvalidArgument) begin "array: " and say what to write instead:
// an empty text, an entry that is not an index, a range that ends before it
// starts, a step below 1, %0 or a % without a number, an index above
// kMaxArrayIndex, and more than kMaxArrayJobs indexes (the message gives
// the number and the limit). Pure.
absl::StatusOr<ArraySpec> ParseArraySpec(absl::string_view text);

// One spec per index of spec.array, in index order: spec.array cleared,
// array_task set (index, limit, count; id is left 0 for the scheduler to
// set), and the name suffixed "[index]". A spec without `array:` comes back
// alone and unchanged. Errors: ParseArraySpec's, and a spec that sets
// array_task itself (only the scheduler does). REQUIRES: ValidateJobSpec
// (spec) is OK. Pure.
absl::StatusOr<std::vector<v1::JobSpec>> ExpandArray(const v1::JobSpec& spec);

// "train[7]"
std::string ArrayJobName(const std::string& base, int64_t index);

// Job.array_id, array_index and array_limit from the job's spec (its
// array_task; all 0 for a job outside any array).
void SetJobArrayFields(const v1::JobSpec& spec, v1::Job* job);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_ARRAY_SPEC_H_
