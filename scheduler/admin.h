// The scheduler's administration: deleting ended jobs (`dlbatch admin
// purge` and the background retention of SchedulerOptions::keep_ended_ms),
// the backup's staged copy and `dlbatch admin status`, and the placement
// statistics. Reached as Scheduler::admin().
//
// Lock story. Admin owns purge_mu_, which serialises purges (the RPC and
// the retention task) and keeps a backup from being staged while one runs:
// purges are the one path that deletes stored files. purge_mu_ is taken
// before the shared mu_ (scheduler_state.h), never under it. A purge holds
// mu_ one chunk at a time (kPurgeChunk jobs in a transaction), never for
// the whole purge, and steps aside between chunks; it reads the jobs' rows
// with the reader, outside mu_. The status report and the statistics read
// the store outside mu_ where they can and take mu_ only for memory (the
// workers, the placement counters, which PlaceJobs writes). Admin owns the
// retention thread; it waits for the scheduler's stop through the function
// StartRetention is given (the Scheduler's queue lock), holding no lock of
// Admin's while it waits.
#ifndef DLBATCH_SCHEDULER_ADMIN_H_
#define DLBATCH_SCHEDULER_ADMIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/store/backup.h"

namespace dlbatch::scheduler {

class Admin {
 public:
  // `state` must outlive the Admin. The status report's start time is the
  // clock now.
  explicit Admin(SchedulerState& state);
  // Joins the retention task (it must have been told to stop).
  ~Admin();
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // Deletes ended jobs (the named ones, or every one ended before
  // before_ms) with their diary, history, progress and the blobs no other
  // job holds, a few hundred per transaction so placement never waits
  // long. (admin_purge.cc)
  absl::StatusOr<v1::PurgeJobsReply> Purge(const v1::PurgeJobsRequest& request)
      ABSL_LOCKS_EXCLUDED(state_.mu_, purge_mu_);
  // `dlbatch admin backup`: the backup's staged copy (backup.h), made while
  // no purge runs; it removes itself when dropped.
  absl::StatusOr<std::unique_ptr<StagedBackup>> StageBackup()
      ABSL_LOCKS_EXCLUDED(state_.mu_, purge_mu_);
  // `dlbatch admin status`.
  absl::StatusOr<v1::SchedulerStatus> StatusReport()
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Placement passes and their times; reset_max starts the maximum anew.
  v1::Stats GetStats(bool reset_max) ABSL_LOCKS_EXCLUDED(state_.mu_);

  // Sleeps up to the duration given; false once the scheduler stops (then
  // at once).
  using SleepUnlessStopped = std::function<bool(absl::Duration)>;
  // Starts the background purge of jobs ended more than keep_ended_ms ago,
  // looking every retention_interval_ms until `sleep` says the scheduler
  // stops. Call once, where keep_ended_ms > 0.
  void StartRetention(SleepUnlessStopped sleep);
  // Waits for the retention task to end (after the scheduler's stop).
  void JoinRetention();

 private:
  // Purges `ids` (ended jobs) in one transaction; adds to `reply`.
  absl::Status PurgeChunk(const std::vector<int64_t>& ids,
                          v1::PurgeJobsReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(purge_mu_) ABSL_LOCKS_EXCLUDED(state_.mu_);
  void RetentionLoop(const SleepUnlessStopped& sleep)
      ABSL_LOCKS_EXCLUDED(state_.mu_, purge_mu_);

  SchedulerState& state_;
  const int64_t start_ms_;  // the clock at construction, for the status
  absl::Mutex purge_mu_ ABSL_ACQUIRED_BEFORE(state_.mu_);
  std::thread retention_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_ADMIN_H_
