// A sweep's or an array's jobs compared, best first: what `dlbatch show
// --sweep` / `show --array` and the web face's /api/v1/sweeps and
// /api/v1/arrays rank and count. Pure functions of the jobs listed, so the
// ranking is testable without a scheduler.
#ifndef DLBATCH_PROTO_SWEEP_RANK_H_
#define DLBATCH_PROTO_SWEEP_RANK_H_

#include <string>
#include <vector>

#include "dlbatch/v1/job.pb.h"
#include "proto/json_shapes.h"

namespace dlbatch {

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

// A job's value of metric `name`: a command job's own (TrainProgress.
// metrics) or one of the progress fields accuracy, loss,
// validation_accuracy, validation_loss, learn_rate, images_per_s (those
// only once reported: validation_* with has_validation, the others with an
// iteration). False where the job has none.
bool MetricValue(const v1::Job& job, const std::string& name, double* value);

// Best first by metric `name` (the highest, or with `lowest_first` the
// lowest): finished jobs first, then those with the metric before those
// without, then the value (NaN worst), then the lowest id. Stable.
std::vector<v1::Job> RankJobsByMetric(std::vector<v1::Job> jobs,
                                      const std::string& name,
                                      bool lowest_first);

// `dlbatch show --array`: an array's jobs as the sweep table shows them,
// with an "index" sweep_point (each job's array_index): ranked as
// RankSweepJobs does where any job reported metrics, else in index order.
std::vector<v1::Job> ArrayTableJobs(std::vector<v1::Job> jobs);

// The most of an array's jobs that run at once (0: no limit).
int ArrayLimit(const std::vector<v1::Job>& jobs);
// How many of the jobs are in each state ({"queued": 3, "held": 1, ...};
// a held queued job counts as "held"), as `show --array --json` has it.
Json ArrayStatesJson(const std::vector<v1::Job>& jobs);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_SWEEP_RANK_H_
