// `dlbatch show --sweep`: a sweep's jobs compared in one table, best first.
// Pure functions of the jobs listed, so the ranking is testable without a
// scheduler.
#ifndef DLBATCH_CLIENT_SWEEP_TABLE_H_
#define DLBATCH_CLIENT_SWEEP_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dlbatch/v1/job.pb.h"
#include "proto/sweep_rank.h"

namespace dlbatch::client {

// The ranking (MetricsOf, RankSweepJobs, ArrayTableJobs) is
// proto/sweep_rank.h's, which the web face's API uses too.
using ::dlbatch::ArrayTableJobs;
using ::dlbatch::MetricsOf;
using ::dlbatch::RankSweepJobs;
using ::dlbatch::SweepMetrics;

// The swept options, in the order of the sweep as the job names give it
// ("net[a=1,b=2]"), else sorted; each appears once.
std::vector<std::string> SweptOptions(const std::vector<v1::Job>& jobs);

// The table: ID, STATE, one column per swept option, ACCURACY, LOSS,
// METRICS (validation | mini-batch), ITERATIONS, ELAPSED. `now_ms` is used
// for the elapsed time of running jobs. REQUIRES: `ranked` is in rank order.
std::string RenderSweepTable(const std::vector<v1::Job>& ranked,
                             int64_t now_ms);

// "20 jobs, at most 3 at once: 3 running, 12 queued, 5 finished" (states
// in the order of a job's life; held jobs counted as "held").
std::string ArraySummary(const std::vector<v1::Job>& jobs);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_SWEEP_TABLE_H_
