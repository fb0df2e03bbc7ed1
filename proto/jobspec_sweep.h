// Sweeps: a job spec with `sweep:` stands for one job per combination of
// its option values (MATLAB's "train multiple networks in parallel").
#ifndef DLBATCH_PROTO_JOBSPEC_SWEEP_H_
#define DLBATCH_PROTO_JOBSPEC_SWEEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

// The most jobs one sweep may make.
inline constexpr int64_t kMaxSweepJobs = 1000;

// One spec per combination of spec.sweep's values: the cartesian product,
// the first axis varying slowest and each list in the order written. Each
// spec has its options set through ApplyTrainingOption, sweep_point filled,
// sweep cleared, and its name suffixed "[option=value,...]". A spec without
// a sweep comes back alone and unchanged.
//
// Errors (InvalidArgument; messages begin with the field path, as
// ValidateJobSpec's do): a sweep on a job without `train:`, an unknown or
// repeated option, an empty or repeated value, a value its option rejects
// or that makes an invalid job, and more than kMaxSweepJobs combinations.
// Pure: no I/O.
absl::StatusOr<std::vector<v1::JobSpec>> ExpandSweep(const v1::JobSpec& spec);

// "lenet[initial_learn_rate=0.1,mini_batch_size=64]", in axis order.
std::string SweepJobName(const std::string& base, const v1::SweepSpec& sweep,
                         const std::vector<int>& point);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_JOBSPEC_SWEEP_H_
