// Sweeps: a job spec with `sweep:` stands for one job per combination of
// its values (MATLAB's "train multiple networks in parallel").
//
// An axis varies one of:
//  - a train.options key (train jobs): `initial_learn_rate: [0.1, 0.01]`,
//    each value set as `train.options:` would set it;
//  - env.NAME (any job): `env.LR: [0.1, 0.01]`, each value the variable's,
//    over the job's own `env:`;
//  - args (command jobs): `args: [[--lr, 0.1], [--lr, 0.01]]`, each list
//    appended to the command's arguments (to the line, shell-quoted, for a
//    command written as one shell line: `sh -c LINE`); [] appends none.
#ifndef DLBATCH_PROTO_JOBSPEC_SWEEP_H_
#define DLBATCH_PROTO_JOBSPEC_SWEEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

// The most jobs one sweep may make.
inline constexpr int64_t kMaxSweepJobs = 1000;

// SweepAxis.option of the axes that are not train.options keys.
inline constexpr absl::string_view kSweepEnvPrefix = "env.";
inline constexpr absl::string_view kSweepArgs = "args";

// One spec per combination of spec.sweep's values: the cartesian product,
// the first axis varying slowest and each list in the order written. Each
// spec has its values set (train options through ApplyTrainingOption),
// sweep_point filled (option -> value as written; args as SweepArgsText),
// sweep cleared, and its name suffixed "[option=value,...]". A spec without
// a sweep comes back alone and unchanged.
//
// Errors (InvalidArgument; messages begin with the field path, as
// ValidateJobSpec's do): a train.options axis on a job without `train:`,
// args on a job without `command:`, "env." without a name, an unknown or
// repeated option, an empty or repeated value, a value its option rejects
// or that makes an invalid job, and more than kMaxSweepJobs combinations.
// Pure: no I/O.
absl::StatusOr<std::vector<v1::JobSpec>> ExpandSweep(const v1::JobSpec& spec);

// An args value as shown: the arguments shell-quoted where they need it,
// joined by spaces ("--lr 0.1", "--name 'a b'"); "(none)" for none.
std::string SweepArgsText(const std::vector<std::string>& args);

// "lenet[initial_learn_rate=0.1,mini_batch_size=64]", in axis order.
std::string SweepJobName(const std::string& base, const v1::SweepSpec& sweep,
                         const std::vector<int>& point);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_JOBSPEC_SWEEP_H_
