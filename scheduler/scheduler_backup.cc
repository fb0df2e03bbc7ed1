// `dlbatch admin backup` and `dlbatch admin status`: the scheduler's side.
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/version.h"
#include "proto/job_state.h"
#include "scheduler/scheduler.h"

namespace dlbatch::scheduler {
namespace {

std::string Folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagedBackup>> Scheduler::StageBackup() {
  // Purges are the one path that deletes stored files: while none runs,
  // every file the database's copy names can be linked.
  absl::MutexLock purging(&purge_mu_);
  static std::atomic<int> counter{0};
  const std::string& db_path = store_->db()->path();
  const std::string staging =
      absl::StrCat(blobs_->temp_dir(), "/backup.", ::getpid(), ".", counter++);
  return StagedBackup::Stage(Folder(db_path), db_path, *blobs_, staging,
                             blobs_->min_free_bytes());
}

absl::StatusOr<v1::SchedulerStatus> Scheduler::StatusReport() {
  v1::SchedulerStatus status;
  status.set_version(std::string(Version()));
  status.set_start_ms(start_ms_);
  status.set_now_ms(clock_->NowMs());
  const std::string& db_path = store_->db()->path();
  status.set_state_dir(Folder(db_path));
  status.set_store_bytes(StoreFileBytes(db_path));
  status.set_blob_bytes(blobs_->stored_bytes());
  if (absl::StatusOr<int64_t> free = FreeBytesIn(status.state_dir());
      free.ok()) {
    status.set_free_bytes(*free);
  }
  status.set_store_full(disk_->full());
  auto& jobs = *status.mutable_jobs_by_state();
  for (v1::JobState state : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING,
                             v1::JOB_STATE_CANCELLING, v1::JOB_STATE_FINISHED,
                             v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    jobs[JobStateName(state)] = 0;
  }
  ASSIGN_OR_RETURN(auto counts, reader_->CountJobsByState());
  for (const auto& [key, n] : counts) jobs[JobStateName(key.second)] += n;
  auto& workers = *status.mutable_workers_by_state();
  for (const char* state : {"online", "draining", "offline"}) {
    workers[state] = 0;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : workers_) {
    const char* state = w.session == nullptr || w.lost ? "offline"
                        : w.draining                   ? "draining"
                                                       : "online";
    ++workers[state];
  }
  return status;
}

}  // namespace dlbatch::scheduler
