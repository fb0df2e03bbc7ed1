#include "client/sweep_table.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "common/duration.h"
#include "proto/job_state.h"

namespace dlbatch::client {

std::vector<std::string> SweptOptions(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> options;
  std::set<std::string> seen;
  // ExpandSweep names each job "base[a=1,b=2]" in the sweep's order.
  for (const v1::Job& job : jobs) {
    const std::string& name = job.spec().name();
    const size_t open = name.rfind('[');
    if (open == std::string::npos || name.empty() || name.back() != ']')
      continue;
    absl::string_view inside(name.data() + open + 1, name.size() - open - 2);
    for (absl::string_view pair : absl::StrSplit(inside, ',')) {
      std::string option(pair.substr(0, pair.find('=')));
      if (job.spec().sweep_point().contains(option) &&
          seen.insert(option).second) {
        options.push_back(option);
      }
    }
  }
  std::set<std::string> rest;  // any the names did not give
  for (const v1::Job& job : jobs) {
    for (const auto& [option, value] : job.spec().sweep_point()) {
      if (!seen.contains(option)) rest.insert(option);
    }
  }
  options.insert(options.end(), rest.begin(), rest.end());
  return options;
}

std::string RenderSweepTable(const std::vector<v1::Job>& ranked,
                             int64_t now_ms) {
  const std::vector<std::string> options = SweptOptions(ranked);
  std::vector<std::string> header = {"ID", "STATE"};
  header.insert(header.end(), options.begin(), options.end());
  for (const char* h :
       {"ACCURACY", "LOSS", "METRICS", "ITERATIONS", "ELAPSED"}) {
    header.push_back(h);
  }
  Table table(std::move(header));
  for (const v1::Job& job : ranked) {
    std::vector<std::string> row = {absl::StrCat(job.id()),
                                    JobStateName(job.state())};
    for (const std::string& option : options) {
      auto it = job.spec().sweep_point().find(option);
      row.push_back(it == job.spec().sweep_point().end() ? "-" : it->second);
    }
    const SweepMetrics m = MetricsOf(job);
    if (m.source == SweepMetrics::Source::kNone) {
      row.insert(row.end(), {"-", "-", "-"});
    } else {
      row.push_back(absl::StrFormat("%.2f%%", m.accuracy));
      row.push_back(absl::StrFormat("%.4g", m.loss));
      row.push_back(m.source == SweepMetrics::Source::kValidation
                        ? "validation"
                        : "mini-batch");
    }
    const v1::TrainProgress& p = job.progress();
    row.push_back(p.iterations() > 0
                      ? absl::StrCat(p.iteration(), "/", p.iterations())
                      : "-");
    const int64_t end = job.end_time_ms() > 0 ? job.end_time_ms() : now_ms;
    row.push_back(job.start_time_ms() > 0
                      ? FormatDurationMs(end - job.start_time_ms())
                      : "-");
    table.Add(std::move(row));
  }
  return table.Render();
}

std::string ArraySummary(const std::vector<v1::Job>& jobs) {
  int limit = 0;
  std::map<int, int> by_state;  // JobState, "held" as 0
  for (const v1::Job& job : jobs) {
    limit = std::max(limit, job.array_limit());
    const bool held = job.held() && job.state() == v1::JOB_STATE_QUEUED;
    ++by_state[held ? 0 : static_cast<int>(job.state())];
  }
  std::string out =
      absl::StrCat(jobs.size(), jobs.size() == 1 ? " job" : " jobs");
  if (limit > 0) absl::StrAppend(&out, ", at most ", limit, " at once");
  const char* sep = ": ";
  for (const auto& [state, n] : by_state) {
    absl::StrAppend(
        &out, sep, n, " ",
        state == 0 ? "held" : JobStateName(static_cast<v1::JobState>(state)));
    sep = ", ";
  }
  return out;
}

}  // namespace dlbatch::client
