#include "scheduler/metrics.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "proto/job_state.h"
#include "scheduler/store/blob_store.h"
#include "scheduler/store/store.h"

namespace dlbatch::scheduler {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

prometheus::MetricFamily OneGauge(const char* name, const char* help,
                                  double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
  return family;
}

// Sizes read when scraped: the store's file with its WAL, and the blobs.
class StoreSizes : public prometheus::Collectable {
 public:
  StoreSizes(std::string db_path, const BlobStore* blobs)
      : db_path_(std::move(db_path)), blobs_(blobs) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    out.push_back(OneGauge(
        "dlbatch_store_bytes",
        "Size of the scheduler's SQLite store on disk (database and WAL)",
        static_cast<double>(StoreFileBytes(db_path_))));
    if (blobs_ != nullptr) {
      out.push_back(OneGauge(
          "dlbatch_blob_bytes",
          "Bytes of the blobs stored (attachments, outputs, checkpoints)",
          static_cast<double>(blobs_->stored_bytes())));
    }
    return out;
  }

 private:
  const std::string db_path_;
  const BlobStore* const blobs_;
};

}  // namespace

struct Metrics::Impl {
  Impl(std::string db_path, const BlobStore* blobs)
      : registry(std::make_shared<prometheus::Registry>()),
        sizes(std::make_shared<StoreSizes>(std::move(db_path), blobs)),
        jobs(BuildGauge()
                 .Name("dlbatch_jobs")
                 .Help("Jobs in the store by profile and state")
                 .Register(*registry)),
        submitted(BuildCounter()
                      .Name("dlbatch_jobs_submitted_total")
                      .Help("Jobs submitted since the scheduler started")
                      .Register(*registry)),
        ended(BuildCounter()
                  .Name("dlbatch_jobs_ended_total")
                  .Help("Jobs that ended since the scheduler started, by "
                        "profile and final state")
                  .Register(*registry)),
        workers(BuildGauge()
                    .Name("dlbatch_workers")
                    .Help("Known workers by profile and state")
                    .Register(*registry)),
        slots(BuildGauge()
                  .Name("dlbatch_slots")
                  .Help("Slots (GPUs or CPU slots) of known workers by "
                        "profile and state")
                  .Register(*registry)),
        queue_wait(
            BuildHistogram()
                .Name("dlbatch_job_queue_wait_seconds")
                .Help("Time from a job's submission to its first "
                      "placement")
                .Register(*registry)
                .Add({}, Histogram::BucketBoundaries{0.01, 0.1, 0.5, 1, 5, 10,
                                                     30, 60, 300, 900, 3600,
                                                     14400, 86400})),
        start_latency(
            BuildHistogram()
                .Name("dlbatch_job_start_latency_seconds")
                .Help("Time from a job's placement to the first report of "
                      "its worker about it")
                .Register(*registry)
                .Add({}, Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05,
                                                     0.1, 0.25, 0.5, 1, 2.5, 5,
                                                     10, 30})),
        pass(BuildHistogram()
                 .Name("dlbatch_placement_pass_seconds")
                 .Help("Time of one placement pass")
                 .Register(*registry)
                 .Add({}, Histogram::BucketBoundaries{1e-5, 5e-5, 1e-4, 5e-4,
                                                      1e-3, 5e-3, 0.01, 0.05,
                                                      0.1, 0.5, 1})),
        commit(BuildHistogram()
                   .Name("dlbatch_store_commit_seconds")
                   .Help("Time of one commit of the store")
                   .Register(*registry)
                   .Add({}, Histogram::BucketBoundaries{1e-4, 5e-4, 1e-3, 5e-3,
                                                        0.01, 0.05, 0.1, 0.5, 1,
                                                        5})),
        diary_lines(BuildCounter()
                        .Name("dlbatch_diary_lines_total")
                        .Help("Diary lines received from workers")
                        .Register(*registry)
                        .Add({})),
        diary_bytes(BuildCounter()
                        .Name("dlbatch_diary_bytes_total")
                        .Help("Bytes of diary lines received from workers")
                        .Register(*registry)
                        .Add({})),
        preemptions(BuildCounter()
                        .Name("dlbatch_preemptions_total")
                        .Help("Jobs stopped and queued again to make room "
                              "for a more urgent one, by profile and kind "
                              "(priority or reclaim)")
                        .Register(*registry)),
        preempted_lost(BuildCounter()
                           .Name("dlbatch_preempted_work_lost_seconds_total")
                           .Help("Work preempted jobs lost: seconds since "
                                 "each one's last stored checkpoint (or its "
                                 "start) when it stopped, summed, by profile")
                           .Register(*registry)),
        job_progress(BuildGauge()
                         .Name("dlbatch_job_progress")
                         .Help("A running job's latest progress report (its "
                               "trainer's, or its program's through "
                               "$DLBATCH_PROGRESS), by job, user, profile "
                               "and field")
                         .Register(*registry)),
        job_metric(BuildGauge()
                       .Name("dlbatch_job_metric")
                       .Help("A running command job's own numbers from its "
                             "latest progress report, by job, user, "
                             "profile and name")
                       .Register(*registry)) {}

  // The series of a (profile, state), made once; the map's lock is the
  // hooks' alone (a scrape takes only the family's, briefly).
  Gauge& JobGauge(const std::string& profile, v1::JobState state) {
    absl::MutexLock lock(&mu);
    Gauge*& g = job_series[{profile, state}];
    if (g == nullptr) {
      g = &jobs.Add({{"profile", profile}, {"state", JobStateName(state)}});
    }
    return *g;
  }
  Gauge& Series(Family<Gauge>& family,
                std::map<std::pair<std::string, std::string>, Gauge*>& map,
                const std::string& profile, const std::string& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Gauge*& g = map[{profile, state}];
    if (g == nullptr) g = &family.Add({{"profile", profile}, {"state", state}});
    return *g;
  }

  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<StoreSizes> sizes;
  Family<Gauge>& jobs;
  Family<Counter>& submitted;
  Family<Counter>& ended;
  Family<Gauge>& workers;
  Family<Gauge>& slots;
  Histogram& queue_wait;
  Histogram& start_latency;
  Histogram& pass;
  Histogram& commit;
  Counter& diary_lines;
  Counter& diary_bytes;
  Family<Counter>& preemptions;
  Family<Counter>& preempted_lost;
  Family<Gauge>& job_progress;
  Family<Gauge>& job_metric;

  absl::Mutex mu;
  std::map<std::pair<std::string, v1::JobState>, Gauge*> job_series
      ABSL_GUARDED_BY(mu);
  std::map<std::string, Counter*> submitted_series ABSL_GUARDED_BY(mu);
  std::map<std::pair<std::string, std::string>, Counter*> preemption_series
      ABSL_GUARDED_BY(mu);
  std::map<std::string, Counter*> lost_series ABSL_GUARDED_BY(mu);
  std::map<std::pair<std::string, v1::JobState>, Counter*> ended_series
      ABSL_GUARDED_BY(mu);
  std::map<std::pair<std::string, std::string>, Gauge*> worker_series
      ABSL_GUARDED_BY(mu);
  std::map<std::pair<std::string, std::string>, Gauge*> slot_series
      ABSL_GUARDED_BY(mu);
  // Each running job's progress series: job -> ("field:loss" or
  // "metric:NAME" -> series).
  std::map<int64_t, std::map<std::string, Gauge*>> progress_series
      ABSL_GUARDED_BY(mu);
  // Placed jobs not reported on yet: job -> (attempt, when placed).
  absl::Mutex placed_mu;
  std::map<int64_t, std::pair<int, std::chrono::steady_clock::time_point>>
      placed ABSL_GUARDED_BY(placed_mu);
};

Metrics::Metrics(std::string db_path, const BlobStore* blobs)
    : impl_(std::make_unique<Impl>(std::move(db_path), blobs)) {}

Metrics::~Metrics() = default;

std::vector<std::shared_ptr<prometheus::Collectable>> Metrics::Collectables()
    const {
  return {impl_->registry, impl_->sizes};
}

void Metrics::SetJobCounts(
    const std::map<std::pair<std::string, v1::JobState>, int64_t>& counts) {
  {
    absl::MutexLock lock(&impl_->mu);
    for (auto& [key, gauge] : impl_->job_series) {
      if (!counts.contains(key)) gauge->Set(0);
    }
  }
  for (const auto& [key, n] : counts) {
    impl_->JobGauge(key.first, key.second).Set(static_cast<double>(n));
  }
}

void Metrics::JobMoved(const std::string& profile, v1::JobState from,
                       v1::JobState to) {
  if (from == to) return;
  if (from != v1::JOB_STATE_UNSPECIFIED)
    impl_->JobGauge(profile, from).Decrement();
  if (to == v1::JOB_STATE_UNSPECIFIED) return;
  impl_->JobGauge(profile, to).Increment();
  if (IsTerminal(to)) {
    Counter* c;
    {
      absl::MutexLock lock(&impl_->mu);
      Counter*& slot = impl_->ended_series[{profile, to}];
      if (slot == nullptr) {
        slot = &impl_->ended.Add(
            {{"profile", profile}, {"state", JobStateName(to)}});
      }
      c = slot;
    }
    c->Increment();
  }
}

void Metrics::JobSubmitted(const std::string& profile) {
  Counter* c;
  {
    absl::MutexLock lock(&impl_->mu);
    Counter*& slot = impl_->submitted_series[profile];
    if (slot == nullptr) slot = &impl_->submitted.Add({{"profile", profile}});
    c = slot;
  }
  c->Increment();
}

void Metrics::QueueWait(double seconds) { impl_->queue_wait.Observe(seconds); }
void Metrics::JobPlaced(int64_t job_id, int attempt) {
  absl::MutexLock lock(&impl_->placed_mu);
  // Jobs whose worker was lost before it said anything are never reported:
  // the oldest entries go past a bound.
  if (impl_->placed.size() >= 100000)
    impl_->placed.erase(impl_->placed.begin());
  impl_->placed[job_id] = {attempt, std::chrono::steady_clock::now()};
}

void Metrics::JobReported(int64_t job_id, int attempt) {
  std::chrono::steady_clock::time_point placed;
  {
    absl::MutexLock lock(&impl_->placed_mu);
    auto it = impl_->placed.find(job_id);
    if (it == impl_->placed.end() || it->second.first != attempt) return;
    placed = it->second.second;
    impl_->placed.erase(it);
  }
  impl_->start_latency.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - placed)
          .count());
}
void Metrics::PlacementPass(double seconds) { impl_->pass.Observe(seconds); }
void Metrics::StoreCommit(double seconds) { impl_->commit.Observe(seconds); }

void Metrics::Profiles(const std::vector<ProfileSummary>& profiles) {
  absl::MutexLock lock(&impl_->mu);
  for (const ProfileSummary& p : profiles) {
    auto set = [&](Family<Gauge>& family, auto& map, const char* state,
                   int value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu) {
      impl_->Series(family, map, p.name, state).Set(value);
    };
    set(impl_->workers, impl_->worker_series, "online", p.workers_online);
    set(impl_->workers, impl_->worker_series, "offline",
        p.workers - p.workers_online);
    set(impl_->slots, impl_->slot_series, "free", p.free_slots);
    set(impl_->slots, impl_->slot_series, "busy",
        p.online_slots - p.free_slots);
    set(impl_->slots, impl_->slot_series, "offline",
        p.known_slots - p.online_slots);
  }
}

void Metrics::DiaryStored(int64_t lines, int64_t bytes) {
  impl_->diary_lines.Increment(static_cast<double>(lines));
  impl_->diary_bytes.Increment(static_cast<double>(bytes));
}

void Metrics::Preempted(const std::string& profile, const std::string& kind,
                        double lost_seconds) {
  Counter* count;
  Counter* lost;
  {
    absl::MutexLock lock(&impl_->mu);
    Counter*& c = impl_->preemption_series[{profile, kind}];
    if (c == nullptr)
      c = &impl_->preemptions.Add({{"profile", profile}, {"kind", kind}});
    Counter*& l = impl_->lost_series[profile];
    if (l == nullptr) l = &impl_->preempted_lost.Add({{"profile", profile}});
    count = c;
    lost = l;
  }
  count->Increment();
  lost->Increment(std::max(0.0, lost_seconds));
}

void Metrics::JobProgress(int64_t job_id, const std::string& user,
                          const std::string& profile,
                          const v1::TrainProgress& p) {
  const std::pair<const char*, double> fields[] = {
      {"iteration", static_cast<double>(p.iteration())},
      {"iterations", static_cast<double>(p.iterations())},
      {"epoch", p.epoch()},
      {"loss", p.loss()},
      {"accuracy", p.accuracy()},
      {"learn_rate", p.learn_rate()},
      {"images_per_s", p.images_per_s()},
      {"eta_s", p.eta_s()},
      {"validation_loss", p.validation_loss()},
      {"validation_accuracy", p.validation_accuracy()},
  };
  const std::string job = std::to_string(job_id);
  absl::MutexLock lock(&impl_->mu);
  std::map<std::string, Gauge*>& series = impl_->progress_series[job_id];
  auto set = [&](Family<Gauge>& family, const std::string& key,
                 const char* label, const std::string& name, double value) {
    Gauge*& g = series[key];
    if (g == nullptr) {
      g = &family.Add(
          {{"job", job}, {"user", user}, {"profile", profile}, {label, name}});
    }
    g->Set(value);
  };
  for (const auto& [name, value] : fields) {
    if (std::string(name).rfind("validation_", 0) == 0 && !p.has_validation())
      continue;
    set(impl_->job_progress, std::string("field:") + name, "field", name,
        value);
  }
  for (const auto& [name, value] : p.metrics())
    set(impl_->job_metric, "metric:" + name, "name", name, value);
}

void Metrics::JobProgressGone(int64_t job_id) {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->progress_series.find(job_id);
  if (it == impl_->progress_series.end()) return;
  for (const auto& [key, gauge] : it->second) {
    (key.rfind("metric:", 0) == 0 ? impl_->job_metric : impl_->job_progress)
        .Remove(gauge);
  }
  impl_->progress_series.erase(it);
}

}  // namespace dlbatch::scheduler
