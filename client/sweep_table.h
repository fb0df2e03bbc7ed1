// `dlbatch show --sweep`: a sweep's jobs compared in one table, best first.
// Pure functions of the jobs listed, so the ranking is testable without a
// scheduler.
#ifndef DLBATCH_CLIENT_SWEEP_TABLE_H_
#define DLBATCH_CLIENT_SWEEP_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dlbatch/v1/job.pb.h"

namespace dlbatch::client {

// A train job's final (or latest) metrics: validation where it reported
// one, else the last mini-batch's. Accuracies are percentages.
struct SweepMetrics {
  enum class Source { kNone, kValidation, kMiniBatch };
  Source source = Source::kNone;
  double accuracy = 0;
  double loss = 0;
};
SweepMetrics MetricsOf(const v1::Job& job);

// Best first: finished jobs before all others (running, queued, failed,
// cancelled); then validation metrics before mini-batch ones before none;
// then the highest accuracy, the lowest loss, and the lowest id. NaN counts
// as the worst value. Stable for equal keys.
std::vector<v1::Job> RankSweepJobs(std::vector<v1::Job> jobs);

// The swept options, in the order of the sweep as the job names give it
// ("net[a=1,b=2]"), else sorted; each appears once.
std::vector<std::string> SweptOptions(const std::vector<v1::Job>& jobs);

// The table: ID, STATE, one column per swept option, ACCURACY, LOSS,
// METRICS (validation | mini-batch), ITERATIONS, ELAPSED. `now_ms` is used
// for the elapsed time of running jobs. REQUIRES: `ranked` is in rank order.
std::string RenderSweepTable(const std::vector<v1::Job>& ranked,
                             int64_t now_ms);

// `dlbatch show --array`: an array's jobs as the sweep table shows them,
// with an "index" column (each job's array_index): ranked as
// RankSweepJobs does where any job reported metrics, else in index order.
std::vector<v1::Job> ArrayTableJobs(std::vector<v1::Job> jobs);

// "20 jobs, at most 3 at once: 3 running, 12 queued, 5 finished" (states
// in the order of a job's life; held jobs counted as "held").
std::string ArraySummary(const std::vector<v1::Job>& jobs);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_SWEEP_TABLE_H_
