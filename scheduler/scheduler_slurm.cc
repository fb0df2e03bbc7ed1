// The scheduler's side of profiles of Slurm: each job's Slurm record in the
// store and in memory, and its one-job credential beside it.
#include "common/status.h"
#include "scheduler/scheduler.h"

namespace dlbatch::scheduler {

absl::Status Scheduler::PutSlurmJob(const slurm::SlurmJobRecord& record) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return store_->PutSlurmJob(record);
  }));
  slurm_jobs_[record.job_id] = record;
  if (job_tokens_ != nullptr && !record.token_sha256.empty()) {
    job_tokens_->Put(JobCredential(record.job_id, record.token_sha256));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::ForgetSlurmJob(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return store_->DeleteSlurmJob(job_id);
  }));
  slurm_jobs_.erase(job_id);
  if (job_tokens_ != nullptr) job_tokens_->RemoveJob(job_id);
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler
