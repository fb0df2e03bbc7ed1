// `dlbatch admin backup`, `dlbatch admin status` and the placement
// statistics: the scheduler's side. Purges are in admin_purge.cc.
#include "scheduler/admin.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/version.h"
#include "proto/job_state.h"

namespace dlbatch::scheduler {
namespace {

std::string Folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

int64_t ReadRssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long pages_total = 0, pages_rss = 0;
  int n = std::fscanf(f, "%ld %ld", &pages_total, &pages_rss);
  std::fclose(f);
  return n == 2 ? pages_rss * sysconf(_SC_PAGESIZE) : 0;
}

}  // namespace

Admin::Admin(SchedulerState& state)
    : state_(state), start_ms_(state.clock_->NowMs()) {}

Admin::~Admin() { JoinRetention(); }

absl::StatusOr<std::unique_ptr<StagedBackup>> Admin::StageBackup() {
  // Purges are the one path that deletes stored files: while none runs,
  // every file the database's copy names can be linked.
  absl::MutexLock purging(&purge_mu_);
  static std::atomic<int> counter{0};
  const std::string& db_path = state_.store_->db()->path();
  const std::string staging = absl::StrCat(
      state_.blobs_->temp_dir(), "/backup.", ::getpid(), ".", counter++);
  return StagedBackup::Stage(Folder(db_path), db_path, *state_.blobs_, staging,
                             state_.blobs_->min_free_bytes());
}

absl::StatusOr<v1::SchedulerStatus> Admin::StatusReport() {
  v1::SchedulerStatus status;
  status.set_version(std::string(Version()));
  status.set_start_ms(start_ms_);
  status.set_now_ms(state_.clock_->NowMs());
  const std::string& db_path = state_.store_->db()->path();
  status.set_state_dir(Folder(db_path));
  status.set_store_bytes(StoreFileBytes(db_path));
  status.set_blob_bytes(state_.blobs_->stored_bytes());
  if (absl::StatusOr<int64_t> free = FreeBytesIn(status.state_dir());
      free.ok()) {
    status.set_free_bytes(*free);
  }
  status.set_store_full(state_.disk_->full());
  auto& jobs = *status.mutable_jobs_by_state();
  for (v1::JobState state : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING,
                             v1::JOB_STATE_CANCELLING, v1::JOB_STATE_FINISHED,
                             v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    jobs[JobStateName(state)] = 0;
  }
  ASSIGN_OR_RETURN(auto counts, state_.reader_->CountJobsByState());
  for (const auto& [key, n] : counts) jobs[JobStateName(key.second)] += n;
  auto& workers = *status.mutable_workers_by_state();
  for (const char* state : {"online", "draining", "offline"}) {
    workers[state] = 0;
  }
  absl::MutexLock lock(&state_.mu_);
  for (const auto& [id, w] : state_.workers_) {
    const char* state = w.session == nullptr || w.lost ? "offline"
                        : w.draining                   ? "draining"
                                                       : "online";
    ++workers[state];
  }
  return status;
}

v1::Stats Admin::GetStats(bool reset_max) {
  absl::MutexLock lock(&state_.mu_);
  v1::Stats stats;
  auto count = state_.store_->CountJobs();
  stats.set_jobs(count.ok() ? *count : 0);
  stats.set_queued(static_cast<int64_t>(state_.core_->queued_count()));
  stats.set_running(static_cast<int64_t>(state_.core_->running_count()));
  stats.set_placement_passes(state_.passes_);
  stats.set_last_pass_ms(state_.last_pass_ms_);
  stats.set_max_pass_ms(state_.max_pass_ms_);
  stats.set_rss_bytes(ReadRssBytes());
  if (reset_max) state_.max_pass_ms_ = 0;
  return stats;
}

}  // namespace dlbatch::scheduler
