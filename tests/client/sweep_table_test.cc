// `dlbatch show --sweep`'s ranking and table, on jobs made up here.
#include "client/sweep_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace dlbatch::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Job Job(int64_t id, v1::JobState state, const std::string& rate) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_sweep_id(1);
  job.mutable_spec()->set_name("net[initial_learn_rate=" + rate +
                               ",mini_batch_size=64]");
  (*job.mutable_spec()->mutable_sweep_point())["initial_learn_rate"] = rate;
  (*job.mutable_spec()->mutable_sweep_point())["mini_batch_size"] = "64";
  return job;
}

v1::Job Validated(v1::Job job, double accuracy, double loss) {
  v1::TrainProgress* p = job.mutable_progress();
  p->set_iteration(40);
  p->set_iterations(40);
  p->set_has_validation(true);
  p->set_validation_accuracy(accuracy);
  p->set_validation_loss(loss);
  return job;
}

v1::Job MiniBatch(v1::Job job, double accuracy, double loss) {
  v1::TrainProgress* p = job.mutable_progress();
  p->set_iteration(20);
  p->set_iterations(40);
  p->set_accuracy(accuracy);
  p->set_loss(loss);
  return job;
}

std::vector<int64_t> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<int64_t> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.id());
  return ids;
}

TEST(RankSweepJobs, BestFinishedFirstThenTheRest) {
  const auto kFinished = v1::JOB_STATE_FINISHED;
  std::vector<v1::Job> jobs = {
      Validated(Job(1, kFinished, "0.1"), 70, 0.9),
      MiniBatch(Job(2, v1::JOB_STATE_RUNNING, "0.2"), 99, 0.1),
      Validated(Job(3, kFinished, "0.3"), 80, 0.8),
      Validated(Job(4, kFinished, "0.4"), 80,
                0.5),  // same accuracy, lower loss
      Job(5, v1::JOB_STATE_QUEUED, "0.5"),
      Validated(Job(6, v1::JOB_STATE_FAILED, "0.6"), 90, 0.3),
      MiniBatch(Job(7, kFinished, "0.7"), 95, 0.2),  // no validation: after
      Validated(Job(8, kFinished, "0.8"), std::nan(""), std::nan("")),
  };
  EXPECT_THAT(Ids(RankSweepJobs(jobs)), ElementsAre(4, 3, 1, 8, 7, 6, 2, 5));
}

TEST(SweptOptions, InTheOrderOfTheSweep) {
  std::vector<v1::Job> jobs = {Job(1, v1::JOB_STATE_QUEUED, "0.1")};
  EXPECT_THAT(SweptOptions(jobs),
              ElementsAre("initial_learn_rate", "mini_batch_size"));
  // Names that do not give the order: sorted.
  jobs[0].mutable_spec()->set_name("renamed");
  (*jobs[0].mutable_spec()->mutable_sweep_point())["a_first"] = "1";
  EXPECT_THAT(SweptOptions(jobs),
              ElementsAre("a_first", "initial_learn_rate", "mini_batch_size"));
}

TEST(RenderSweepTable, OneRowPerJobWithItsOptionsAndMetrics) {
  v1::Job best =
      Validated(Job(3, v1::JOB_STATE_FINISHED, "0.01"), 64.375, 0.93721);
  best.set_start_time_ms(1000);
  best.set_end_time_ms(61000);
  v1::Job queued = Job(4, v1::JOB_STATE_QUEUED, "0.001");
  const std::string table = RenderSweepTable({best, queued}, 0);
  EXPECT_THAT(table, HasSubstr("ID  STATE     initial_learn_rate  "
                               "mini_batch_size  ACCURACY  LOSS    METRICS"));
  EXPECT_THAT(table, HasSubstr("3   finished  0.01                64  "
                               "             64.38%    0.9372  validation  "
                               "40/40       1m00s"));
  EXPECT_THAT(table, HasSubstr("4   queued    0.001               64  "
                               "             -         -       -           -"));
}

// A swept value is text the job file's author wrote: shown escaped, as
// every cell of the CLI's tables is.
TEST(RenderSweepTable, EscapesWhatTheSweepsAuthorWrote) {
  v1::Job job = Job(1, v1::JOB_STATE_FINISHED, "0.1\x1b[2J");
  const std::string table = RenderSweepTable({job}, 0);
  EXPECT_EQ(table.find('\x1b'), std::string::npos);
  EXPECT_THAT(table, HasSubstr(R"(0.1\x1b[2J)"));
}

v1::Job ArrayJob(int64_t id, int64_t index, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_sweep_id(3);
  job.set_array_id(3);
  job.set_array_index(index);
  job.set_array_limit(2);
  job.mutable_spec()->set_name("sim[" + std::to_string(index) + "]");
  return job;
}

TEST(ArrayTable, ByIndexWithoutMetricsBestFirstWithThem) {
  std::vector<v1::Job> jobs = {ArrayJob(11, 5, v1::JOB_STATE_QUEUED),
                               ArrayJob(10, 0, v1::JOB_STATE_FINISHED),
                               ArrayJob(12, 9, v1::JOB_STATE_RUNNING)};
  jobs[0].set_held(true);
  std::vector<v1::Job> table = ArrayTableJobs(jobs);
  EXPECT_THAT(Ids(table), ElementsAre(10, 11, 12));
  EXPECT_THAT(SweptOptions(table), ElementsAre("index"));
  const std::string rendered = RenderSweepTable(table, 0);
  EXPECT_THAT(rendered, HasSubstr("index"));
  EXPECT_EQ(ArraySummary(jobs),
            "3 jobs, at most 2 at once: 1 held, 1 running, 1 finished");

  // A job that reported metrics: ranked as a sweep is.
  jobs[2] = MiniBatch(jobs[2], 50, 1);
  jobs[1] = Validated(jobs[1], 90, 0.2);
  EXPECT_THAT(Ids(ArrayTableJobs(jobs)), ElementsAre(10, 12, 11));
  EXPECT_EQ(ArraySummary({ArrayJob(1, 0, v1::JOB_STATE_QUEUED)}),
            "1 job, at most 2 at once: 1 queued");
}

}  // namespace
}  // namespace dlbatch::client
