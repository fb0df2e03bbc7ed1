// ExpandSweep: every check a sweep needs happens here, so the client (which
// parses job.yaml) and the scheduler (which sees specs from any client)
// refuse the same sweeps with the same messages.
#include "proto/jobspec_sweep.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/jobspec_yaml.h"

namespace dlbatch {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// "initial_learn_rate=0.1, mini_batch_size=64"
std::string DescribePoint(const v1::SweepSpec& sweep,
                          const std::vector<int>& point,
                          absl::string_view separator) {
  std::string out;
  for (size_t i = 0; i < point.size(); ++i) {
    if (i > 0) absl::StrAppend(&out, separator);
    absl::StrAppend(&out, sweep.axes(i).option(), "=",
                    sweep.axes(i).values(point[i]));
  }
  return out;
}

// Checks the axes themselves and returns the number of combinations.
absl::StatusOr<int64_t> CheckAxes(const v1::JobSpec& spec) {
  const v1::SweepSpec& sweep = spec.sweep();
  if (!spec.has_train()) {
    return Invalid(
        "sweep: only a train: job can be swept (a sweep varies "
        "train.options); remove `sweep:` or train a network");
  }
  absl::flat_hash_set<std::string> options;
  int64_t combinations = 1;
  std::vector<std::string> sizes;
  for (const v1::SweepAxis& axis : sweep.axes()) {
    const std::string path = absl::StrCat("sweep.", axis.option());
    if (axis.option().empty()) {
      return Invalid("sweep: an option has no name; name a train.options key");
    }
    if (!options.insert(axis.option()).second) {
      return Invalid(absl::StrCat(path, ": given twice; keep one list"));
    }
    if (axis.values().empty()) {
      return Invalid(
          absl::StrCat(path, ": the list is empty; give at least one value"));
    }
    absl::flat_hash_set<std::string> values;
    for (int i = 0; i < axis.values_size(); ++i) {
      if (!values.insert(axis.values(i)).second) {
        return Invalid(absl::StrCat(path, "[", i, "]: '", axis.values(i),
                                    "' is listed twice; keep one"));
      }
    }
    sizes.push_back(absl::StrCat(axis.values_size()));
    combinations *= axis.values_size();
    if (combinations > kMaxSweepJobs) {
      // Later axes can only multiply; say so without overflowing.
      return Invalid(absl::StrCat(
          "sweep: ", absl::StrJoin(sizes, " x "),
          sweep.axes_size() > static_cast<int>(sizes.size()) ? " x ..." : "",
          " values make more than ", kMaxSweepJobs,
          " jobs, the most one sweep may make; use fewer values"));
    }
  }
  return combinations;
}

}  // namespace

std::string SweepJobName(const std::string& base, const v1::SweepSpec& sweep,
                         const std::vector<int>& point) {
  return absl::StrCat(base, "[", DescribePoint(sweep, point, ","), "]");
}

absl::StatusOr<std::vector<v1::JobSpec>> ExpandSweep(const v1::JobSpec& spec) {
  const v1::SweepSpec& sweep = spec.sweep();
  if (sweep.axes().empty()) return std::vector<v1::JobSpec>{spec};
  absl::StatusOr<int64_t> combinations = CheckAxes(spec);
  if (!combinations.ok()) return combinations.status();

  v1::JobSpec base = spec;
  base.clear_sweep();
  base.clear_sweep_point();
  // Each value alone first, so that a bad one is named by its position.
  for (const v1::SweepAxis& axis : sweep.axes()) {
    for (int i = 0; i < axis.values_size(); ++i) {
      const std::string path =
          absl::StrCat("sweep.", axis.option(), "[", i, "]");
      v1::JobSpec one = base;
      absl::Status s =
          ApplyTrainingOption(axis.option(), axis.values(i), path,
                              one.mutable_train()->mutable_options());
      if (!s.ok()) return s;
      s = ValidateJobSpec(one);
      if (!s.ok()) {
        return Invalid(absl::StrCat(path, ": '", axis.values(i),
                                    "' makes an invalid job: ", s.message()));
      }
    }
  }

  std::vector<v1::JobSpec> jobs;
  jobs.reserve(static_cast<size_t>(*combinations));
  std::vector<int> point(static_cast<size_t>(sweep.axes_size()), 0);
  for (int64_t n = 0; n < *combinations; ++n) {
    v1::JobSpec job = base;
    for (size_t a = 0; a < point.size(); ++a) {
      const v1::SweepAxis& axis = sweep.axes(static_cast<int>(a));
      const std::string& value = axis.values(point[a]);
      // Checked alone above; cannot fail here.
      absl::Status s = ApplyTrainingOption(
          axis.option(), value, absl::StrCat("sweep.", axis.option()),
          job.mutable_train()->mutable_options());
      if (!s.ok()) return s;
      (*job.mutable_sweep_point())[axis.option()] = value;
    }
    absl::Status s = ValidateJobSpec(job);
    if (!s.ok()) {
      return Invalid(absl::StrCat("sweep: the combination ",
                                  DescribePoint(sweep, point, ", "),
                                  " makes an invalid job: ", s.message()));
    }
    job.set_name(SweepJobName(spec.name(), sweep, point));
    jobs.push_back(std::move(job));
    // Odometer: the last axis varies fastest.
    for (size_t a = point.size(); a-- > 0;) {
      if (++point[a] < sweep.axes(static_cast<int>(a)).values_size()) break;
      point[a] = 0;
    }
  }
  return jobs;
}

}  // namespace dlbatch
