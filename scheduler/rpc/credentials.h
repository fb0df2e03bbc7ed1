// Tokens the scheduler accepts, and the calls open under each. A user token
// acts as its user (an admin token as any user it names); a worker token
// may register workers and move their blobs, and nothing else. Only the
// sha256 of a token is kept, in the store and here: a token is looked up
// by its hash, so nothing compares secrets byte by byte. The table is the
// scheduler's working copy of the store's credentials; the service writes
// the store first, then the table, so a revoke that returns is in force.
#ifndef DLBATCH_SCHEDULER_RPC_CREDENTIALS_H_
#define DLBATCH_SCHEDULER_RPC_CREDENTIALS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::scheduler {

struct CredentialRecord {
  std::string name;
  bool worker = false;
  bool admin = false;
  std::string token_sha256;  // hex
  int64_t created_ms = 0;
  // A one-job credential (profiles of Slurm; `worker` true): the token in
  // one Slurm batch job's script. It registers that job's own workers and
  // nothing else (slurm_registration.h), and fetches only the blobs its
  // job needs. Kept with the job's Slurm job, not among the credentials
  // admins make. 0: not one.
  int64_t job_id = 0;

  // What identifies the credential's calls: "user:NAME", "worker:NAME" or,
  // for a one-job credential, "job:ID".
  std::string Key() const;
};

// Names: letters, digits and . _ - (a user's login name, a worker group),
// at most 64 characters, not starting with '-'.
absl::Status CheckCredentialName(absl::string_view name);

// A new token: "dlbu_" (user) or "dlbw_" (worker) and 64 hex digits from
// /dev/urandom.
absl::StatusOr<std::string> NewToken(bool worker);
// A new one-job token: "dlbj_" and 64 hex digits.
absl::StatusOr<std::string> NewJobToken();
// The one-job credential of job `job_id` whose token has `token_sha256`.
CredentialRecord JobCredential(int64_t job_id, std::string token_sha256);
std::string TokenSha256(absl::string_view token);

class CredentialTable {
 public:
  void Reset(std::vector<CredentialRecord> records);
  // Replaces the token of the same name and kind (of the same job, for a
  // one-job credential).
  void Put(CredentialRecord record);
  // Removes the user's or worker credential `name` (never a one-job one).
  void Remove(const std::string& name, bool worker);
  // Removes job `job_id`'s one-job credential.
  void RemoveJob(int64_t job_id);
  std::optional<CredentialRecord> FindByToken(absl::string_view token) const;
  bool empty() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, CredentialRecord> by_hash_ ABSL_GUARDED_BY(mu_);
};

// The long-lived calls (diary -f, monitor, wait, a worker's stream) open
// under each credential, so a revoke can end them at once.
class OpenCalls {
 public:
  // `end` ends the call (e.g. the call's ServerContext::TryCancel); it is
  // called at most once, never after Remove(id) has returned. It may run
  // the call's own reactor callbacks inline, Remove included.
  int64_t Add(const std::string& key, std::function<void()> end);
  // The call is done: from here on `end` is not called. Waits for an `end`
  // running on another thread.
  void Remove(int64_t id);
  // Ends every call open under `key`; returns how many.
  int EndAll(const std::string& key);

 private:
  // A std::recursive_mutex that the thread-safety analysis knows as a
  // capability (absl::Mutex is not recursive).
  class ABSL_LOCKABLE RecursiveMutex {
   public:
    void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
    void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

   private:
    std::recursive_mutex mu_;
  };
  struct Entry {
    std::string key;
    std::function<void()> end;
    // Held while `end` runs; recursive because `end` may reach Remove on
    // the same thread.
    RecursiveMutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
  };
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::shared_ptr<Entry>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_CREDENTIALS_H_
