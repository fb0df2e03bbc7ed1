// ExpandSweep: every check a sweep needs happens here, so the client (which
// parses job.yaml) and the scheduler (which sees specs from any client)
// refuse the same sweeps with the same messages.
#include "proto/jobspec_sweep.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
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

enum class AxisKind { kTrainOption, kEnv, kArgs };

AxisKind KindOf(const v1::SweepAxis& axis) {
  if (absl::StartsWith(axis.option(), kSweepEnvPrefix)) return AxisKind::kEnv;
  if (axis.option() == kSweepArgs) return AxisKind::kArgs;
  return AxisKind::kTrainOption;
}

// What an axis of this kind needs of the job, and of the axis itself.
absl::Status CheckAxisKind(const v1::JobSpec& spec, const v1::SweepAxis& axis,
                           const std::string& path) {
  switch (KindOf(axis)) {
    case AxisKind::kEnv:
      if (axis.option().size() == kSweepEnvPrefix.size()) {
        return Invalid(absl::StrCat(
            path, ": names no variable; write env.NAME, like env.LR"));
      }
      return absl::OkStatus();
    case AxisKind::kArgs:
      if (!spec.has_command()) {
        return Invalid(
            absl::StrCat(path,
                         ": only a command: job has arguments to sweep; sweep "
                         "train.options keys or env.NAME instead"));
      }
      if (axis.arg_lists_size() != axis.values_size()) {
        return Invalid(absl::StrCat(
            path, ": has ", axis.values_size(), " values but ",
            axis.arg_lists_size(),
            " argument lists; give each value as a list, like [--lr, 0.1]"));
      }
      return absl::OkStatus();
    case AxisKind::kTrainOption:
      if (!spec.has_train()) {
        return Invalid(absl::StrCat(
            path,
            ": a command: job has no train.options; sweep env.NAME (a "
            "variable of its environment) or args (arguments appended to "
            "its command) instead"));
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Checks the axes themselves and returns the number of combinations.
absl::StatusOr<int64_t> CheckAxes(const v1::JobSpec& spec) {
  const v1::SweepSpec& sweep = spec.sweep();
  absl::flat_hash_set<std::string> options;
  int64_t combinations = 1;
  std::vector<std::string> sizes;
  for (const v1::SweepAxis& axis : sweep.axes()) {
    const std::string path = absl::StrCat("sweep.", axis.option());
    if (axis.option().empty()) {
      return Invalid(
          "sweep: an option has no name; name a train.options key, env.NAME "
          "or args");
    }
    if (!options.insert(axis.option()).second) {
      return Invalid(absl::StrCat(path, ": given twice; keep one list"));
    }
    RETURN_IF_ERROR(CheckAxisKind(spec, axis, path));
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

// A shell's `sh -c LINE`, as `command: "one line"` is written.
bool IsShellLine(const v1::CommandSpec& command) {
  return command.argv_size() == 3 && command.argv(0) == "sh" &&
         command.argv(1) == "-c";
}

// Sets the axis's value `i` in `job`. Errors only for a train option's
// value that its option refuses.
absl::Status ApplyValue(const v1::SweepAxis& axis, int i,
                        const std::string& path, v1::JobSpec* job) {
  switch (KindOf(axis)) {
    case AxisKind::kEnv:
      (*job->mutable_env())[axis.option().substr(kSweepEnvPrefix.size())] =
          axis.values(i);
      return absl::OkStatus();
    case AxisKind::kArgs: {
      const v1::SweepArgs& args = axis.arg_lists(i);
      v1::CommandSpec* command = job->mutable_command();
      if (IsShellLine(*command)) {
        if (args.args_size() > 0) {
          absl::StrAppend(
              command->mutable_argv(2), " ",
              SweepArgsText({args.args().begin(), args.args().end()}));
        }
      } else {
        for (const std::string& arg : args.args()) command->add_argv(arg);
      }
      return absl::OkStatus();
    }
    case AxisKind::kTrainOption:
      return ApplyTrainingOption(axis.option(), axis.values(i), path,
                                 job->mutable_train()->mutable_options());
  }
  return absl::OkStatus();
}

bool ShellSafe(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("_-+=./:,@%").find(c) != absl::string_view::npos;
}

}  // namespace

std::string SweepArgsText(const std::vector<std::string>& args) {
  if (args.empty()) return "(none)";
  std::string out;
  for (const std::string& arg : args) {
    if (!out.empty()) out += ' ';
    if (!arg.empty() && std::all_of(arg.begin(), arg.end(), ShellSafe)) {
      out += arg;
      continue;
    }
    out += '\'';
    for (char c : arg) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

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
      RETURN_IF_ERROR(ApplyValue(axis, i, path, &one));
      absl::Status s = ValidateJobSpec(one);
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
      // Checked alone above; cannot fail here.
      RETURN_IF_ERROR(ApplyValue(axis, point[a],
                                 absl::StrCat("sweep.", axis.option()), &job));
      (*job.mutable_sweep_point())[axis.option()] = axis.values(point[a]);
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
