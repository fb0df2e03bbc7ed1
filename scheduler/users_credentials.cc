// The scheduler's side of credentials: their rows in the store, and what a
// worker credential may fetch. (The one-job credentials of Slurm jobs are
// the Scheduler's, with their Slurm records.)
#include "common/status.h"
#include "scheduler/users.h"

namespace dlbatch::scheduler {

absl::StatusOr<std::vector<CredentialRecord>> Users::Credentials() {
  absl::MutexLock lock(&state_.mu_);
  return state_.store_->Credentials();
}

absl::Status Users::PutCredential(const CredentialRecord& record) {
  absl::MutexLock lock(&state_.mu_);
  RETURN_IF_ERROR(state_.CheckWritable());
  return state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
    return state_.store_->PutCredential(record);
  });
}

absl::StatusOr<bool> Users::DeleteCredential(const std::string& name,
                                             bool worker) {
  absl::MutexLock lock(&state_.mu_);
  // A revoke is let through on a full disk: deleting a row needs no room
  // SQLite cannot find in its own pages.
  bool deleted = false;
  RETURN_IF_ERROR(state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                           state_.mu_) -> absl::Status {
    ASSIGN_OR_RETURN(deleted, state_.store_->DeleteCredential(name, worker));
    return absl::OkStatus();
  }));
  return deleted;
}

bool Users::WorkerNeedsBlob(const std::string& credential,
                            const std::string& sha256) {
  absl::MutexLock lock(&state_.mu_);
  for (const auto& [id, job] : state_.jobs_) {
    if (job.record.state == v1::JOB_STATE_QUEUED) continue;
    bool holds = false;
    for (const auto& a : job.record.spec.attach()) {
      if (a.sha256() == sha256) holds = true;
    }
    for (const auto& f : job.checkpoint.files()) {
      if (f.sha256() == sha256) holds = true;
    }
    // With `checkpoint: per-part` each part fetches its own.
    for (const auto& kept : job.kept_checkpoints) {
      for (const auto& f : kept.files()) {
        if (f.sha256() == sha256) holds = true;
      }
    }
    if (!holds) continue;
    for (size_t p = 0; p < job.record.parts.size(); ++p) {
      if (p < job.part_ended.size() && job.part_ended[p]) continue;
      auto w = state_.workers_.find(job.record.parts[p].worker);
      if (w != state_.workers_.end() && w->second.session &&
          w->second.session->owner() == credential) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace dlbatch::scheduler
