// The scheduler's Prometheus metrics. The scheduler calls the hooks below
// where events happen (each a few atomic adds on series found once); a
// scrape reads those series and stats two paths, and never takes the
// scheduler's lock, so placement does not wait for it. Only this file's .cc
// includes prometheus-cpp.
#ifndef DLBATCH_SCHEDULER_METRICS_H_
#define DLBATCH_SCHEDULER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dlbatch/v1/job.pb.h"
#include "scheduler/core/placement.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace dlbatch::scheduler {

class BlobStore;

class Metrics {
 public:
  // db_path: the store, whose file and WAL sizes a scrape reads; blobs
  // (may be null): the blob store whose bytes it reads.
  Metrics(std::string db_path, const BlobStore* blobs);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // What a metrics listener serves.
  std::vector<std::shared_ptr<prometheus::Collectable>> Collectables() const;

  // ---- hooks; any thread ----
  // Jobs by (profile, state), replacing every count (after a load).
  void SetJobCounts(
      const std::map<std::pair<std::string, v1::JobState>, int64_t>& counts);
  // A job of `profile` went from `from` to `to`; JOB_STATE_UNSPECIFIED as
  // `from`: it is new (submitted), as `to`: it was deleted (purged).
  void JobMoved(const std::string& profile, v1::JobState from, v1::JobState to);
  void JobSubmitted(const std::string& profile);
  void QueueWait(double seconds);  // queued to placed
  // Start latency: from a job's placement to the first report about that
  // attempt from its worker (a diary line, progress, its end).
  void JobPlaced(int64_t job_id, int attempt);
  void JobReported(int64_t job_id, int attempt);
  void PlacementPass(double seconds);  // one PlacementCore::Schedule
  void StoreCommit(double seconds);    // one transaction's commit
  // Workers and slots per profile, as the placement core has them now.
  void Profiles(const std::vector<ProfileSummary>& profiles);
  void DiaryStored(int64_t lines, int64_t bytes);
  // A job of `profile` stopped for preemption (kind "priority" or
  // "reclaim"), losing `lost_seconds` of work since its last checkpoint.
  void Preempted(const std::string& profile, const std::string& kind,
                 double lost_seconds);
  // A running job's latest progress (a train job's or a command job's) as
  // gauges, dlbatch_job_progress and dlbatch_job_metric; `user` is shown
  // as a label value (escaped by the exposition).
  void JobProgress(int64_t job_id, const std::string& user,
                   const std::string& profile, const v1::TrainProgress& p);
  // The job no longer runs: its progress series go.
  void JobProgressGone(int64_t job_id);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_METRICS_H_
