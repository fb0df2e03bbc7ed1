#include "scheduler/rendezvous.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch::scheduler {

std::string RendezvousStore::SecretFor(int64_t job_id, int attempt) const {
  return Sha256Hex(absl::StrCat(key_, ":rendezvous:", job_id, ":", attempt));
}

void RendezvousStore::Open(int64_t job_id, int attempt) {
  absl::MutexLock lock(&mu_);
  Attempt& a = jobs_[job_id];
  a.attempt = attempt;
  a.values.clear();
}

void RendezvousStore::Drop(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

size_t RendezvousStore::open_jobs() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

absl::Status RendezvousStore::Check(int64_t job_id, int attempt,
                                    const std::string& secret) const {
  mu_.AssertHeld();
  // Compared in full whatever the prefix, so timing says nothing.
  if (!ConstantTimeEqual(SecretFor(job_id, attempt), secret)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "wrong rendezvous secret for job ", job_id, " attempt ", attempt));
  }
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.attempt != attempt) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of job ", job_id,
                     " is not running; its rendezvous is closed"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(int64_t job_id, int attempt,
                                  const std::string& secret,
                                  const std::string& key, std::string value) {
  if (key.empty())
    return absl::InvalidArgumentError("a rendezvous key must not be empty");
  if (static_cast<int64_t>(value.size()) > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous value of '", key, "' is ", value.size(),
                     " bytes; at most ", kMaxValueBytes, " are kept"));
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Check(job_id, attempt, secret));
  Attempt& a = jobs_[job_id];
  if (a.values.size() >= static_cast<size_t>(kMaxKeysPerJob) &&
      !a.values.count(key)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id, " has ", kMaxKeysPerJob, " rendezvous keys already"));
  }
  a.values[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(
    int64_t job_id, int attempt, const std::string& secret,
    const std::string& key, int64_t timeout_ms,
    const std::function<bool()>& gone) {
  const absl::Time deadline =
      absl::Now() +
      absl::Milliseconds(std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs));
  absl::MutexLock lock(&mu_);
  for (;;) {
    RETURN_IF_ERROR(Check(job_id, attempt, secret));
    const auto& values = jobs_.at(job_id).values;
    if (auto it = values.find(key); it != values.end()) return it->second;
    const absl::Time now = absl::Now();
    if (now >= deadline || (gone && gone())) break;
    // Woken by any Set; sliced so that a departed caller is noticed.
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto j = jobs_.find(job_id);
      return j == jobs_.end() || j->second.values.count(key) != 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&present),
                          std::min(deadline, now + absl::Milliseconds(200)));
  }
  return absl::NotFoundError(absl::StrCat("rendezvous key '", key, "' of job ",
                                          job_id, " is not there yet"));
}

}  // namespace dlbatch::scheduler
