// The key-value store the ranks of a running train job meet through (as
// torchrun's store): Gloo's and NCCL's connection details go in under keys
// of the job's attempt, each rank waits for the others'.
//
// Keys live while the attempt runs: Open() when it is placed, Drop() when it
// ends or is requeued. A call authenticates with the attempt's secret, derived
// from a key this process draws at start, so the job's processes never hold
// the cluster token; a scheduler restart makes running attempts' secrets
// stale, which only matters to ranks still meeting (they fail and are
// retried as the job's next attempt). Thread-safe.
#ifndef DLBATCH_SCHEDULER_RENDEZVOUS_H_
#define DLBATCH_SCHEDULER_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::scheduler {

class RendezvousStore {
 public:
  static constexpr int64_t kMaxValueBytes = 1 << 20;
  static constexpr int kMaxKeysPerJob = 10000;
  static constexpr int64_t kMaxWaitMs = 10000;

  // `key`: secret bytes the attempts' secrets are derived from.
  explicit RendezvousStore(std::string key) : key_(std::move(key)) {}

  std::string SecretFor(int64_t job_id, int attempt) const;

  void Open(int64_t job_id, int attempt);
  void Drop(int64_t job_id);

  absl::Status Set(int64_t job_id, int attempt, const std::string& secret,
                   const std::string& key, std::string value);
  // Waits up to min(timeout_ms, kMaxWaitMs) for `key`; NOT_FOUND if it is
  // still missing then. `gone` (polled) ends the wait early.
  absl::StatusOr<std::string> Get(int64_t job_id, int attempt,
                                  const std::string& secret,
                                  const std::string& key, int64_t timeout_ms,
                                  const std::function<bool()>& gone);

  size_t open_jobs() const;

 private:
  struct Attempt {
    int attempt = 0;
    std::map<std::string, std::string> values;
  };
  absl::Status Check(int64_t job_id, int attempt,
                     const std::string& secret) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string key_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Attempt> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RENDEZVOUS_H_
