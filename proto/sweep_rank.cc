#include "proto/sweep_rank.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "proto/job_state.h"

namespace dlbatch {
namespace {

double OrWorst(double x, double worst) { return std::isnan(x) ? worst : x; }

}  // namespace

SweepMetrics MetricsOf(const v1::Job& job) {
  const v1::TrainProgress& p = job.progress();
  SweepMetrics m;
  if (p.has_validation()) {
    m.source = SweepMetrics::Source::kValidation;
    m.accuracy = p.validation_accuracy();
    m.loss = p.validation_loss();
  } else if (p.iteration() > 0) {
    m.source = SweepMetrics::Source::kMiniBatch;
    m.accuracy = p.accuracy();
    m.loss = p.loss();
  }
  return m;
}

std::vector<v1::Job> RankSweepJobs(std::vector<v1::Job> jobs) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto key = [&](const v1::Job& job) {
    const SweepMetrics m = MetricsOf(job);
    const int group = job.state() == v1::JOB_STATE_FINISHED ? 0 : 1;
    const int source = m.source == SweepMetrics::Source::kValidation  ? 0
                       : m.source == SweepMetrics::Source::kMiniBatch ? 1
                                                                      : 2;
    // Smaller is better in every place.
    return std::make_tuple(group, source, -OrWorst(m.accuracy, -kInf),
                           OrWorst(m.loss, kInf), job.id());
  };
  std::stable_sort(
      jobs.begin(), jobs.end(),
      [&](const v1::Job& a, const v1::Job& b) { return key(a) < key(b); });
  return jobs;
}

bool MetricValue(const v1::Job& job, const std::string& name, double* value) {
  const v1::TrainProgress& p = job.progress();
  if (auto it = p.metrics().find(name); it != p.metrics().end()) {
    *value = it->second;
    return true;
  }
  const bool iterated = p.iteration() > 0;
  if (name == "accuracy" && iterated)
    *value = p.accuracy();
  else if (name == "loss" && iterated)
    *value = p.loss();
  else if (name == "learn_rate" && iterated)
    *value = p.learn_rate();
  else if (name == "images_per_s" && iterated)
    *value = p.images_per_s();
  else if (name == "validation_accuracy" && p.has_validation())
    *value = p.validation_accuracy();
  else if (name == "validation_loss" && p.has_validation())
    *value = p.validation_loss();
  else
    return false;
  return true;
}

std::vector<v1::Job> RankJobsByMetric(std::vector<v1::Job> jobs,
                                      const std::string& name,
                                      bool lowest_first) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto key = [&](const v1::Job& job) {
    double v = 0;
    const bool has = MetricValue(job, name, &v);
    // Smaller is better in every place.
    const double ordered = lowest_first ? OrWorst(v, kInf) : -OrWorst(v, -kInf);
    return std::make_tuple(job.state() == v1::JOB_STATE_FINISHED ? 0 : 1,
                           has ? 0 : 1, has ? ordered : 0.0, job.id());
  };
  std::stable_sort(
      jobs.begin(), jobs.end(),
      [&](const v1::Job& a, const v1::Job& b) { return key(a) < key(b); });
  return jobs;
}

std::vector<v1::Job> ArrayTableJobs(std::vector<v1::Job> jobs) {
  bool metrics = false;
  for (v1::Job& job : jobs) {
    metrics |= MetricsOf(job).source != SweepMetrics::Source::kNone;
    (*job.mutable_spec()->mutable_sweep_point())["index"] =
        absl::StrCat(job.array_index());
  }
  if (metrics) return RankSweepJobs(std::move(jobs));
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const v1::Job& a, const v1::Job& b) {
                     return a.array_index() < b.array_index();
                   });
  return jobs;
}

int ArrayLimit(const std::vector<v1::Job>& jobs) {
  int limit = 0;
  for (const v1::Job& job : jobs) limit = std::max(limit, job.array_limit());
  return limit;
}

Json ArrayStatesJson(const std::vector<v1::Job>& jobs) {
  Json states = Json::object();
  for (const v1::Job& job : jobs) {
    const bool held = job.held() && job.state() == v1::JOB_STATE_QUEUED;
    const std::string name = held ? "held" : JobStateName(job.state());
    states[name] = states.value(name, 0) + 1;
  }
  return states;
}

}  // namespace dlbatch
