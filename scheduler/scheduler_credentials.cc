// The scheduler's side of credentials: their rows in the store, and what a
// worker credential may fetch.
#include "common/status.h"
#include "scheduler/scheduler.h"

namespace dlbatch::scheduler {

absl::StatusOr<std::vector<CredentialRecord>> Scheduler::Credentials() {
  absl::MutexLock lock(&mu_);
  return store_->Credentials();
}

absl::StatusOr<std::vector<CredentialRecord>> Scheduler::JobCredentials() {
  absl::MutexLock lock(&mu_);
  SlurmLockHeld();
  return slurm_->JobCredentials();
}

absl::Status Scheduler::PutCredential(const CredentialRecord& record) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritable());
  return InTransaction([&] { return store_->PutCredential(record); });
}

absl::StatusOr<bool> Scheduler::DeleteCredential(const std::string& name,
                                                 bool worker) {
  absl::MutexLock lock(&mu_);
  // A revoke is let through on a full disk: deleting a row needs no room
  // SQLite cannot find in its own pages.
  bool deleted = false;
  RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    ASSIGN_OR_RETURN(deleted, store_->DeleteCredential(name, worker));
    return absl::OkStatus();
  }));
  return deleted;
}

bool Scheduler::WorkerNeedsBlob(const std::string& credential,
                                const std::string& sha256) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    if (job.record.state == v1::JOB_STATE_QUEUED) continue;
    bool holds = false;
    for (const auto& a : job.record.spec.attach()) {
      if (a.sha256() == sha256) holds = true;
    }
    for (const auto& f : job.checkpoint.files()) {
      if (f.sha256() == sha256) holds = true;
    }
    if (!holds) continue;
    for (size_t p = 0; p < job.record.parts.size(); ++p) {
      if (p < job.part_ended.size() && job.part_ended[p]) continue;
      auto w = workers_.find(job.record.parts[p].worker);
      if (w != workers_.end() && w->second.session &&
          w->second.session->owner() == credential) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace dlbatch::scheduler
