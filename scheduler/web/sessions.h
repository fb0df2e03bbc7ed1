// The web face's logins, pure and fed a Clock: the sessions a login opens
// (a cookie's id and a CSRF token, each 256 random bits), the one-time
// codes `dlbatch web` hands out, and the rate limit on login attempts per
// client address. Nothing here reads a socket, the store or the time of
// day by itself, so tests drive it with a fake clock.
//
// Secrets are kept as their sha256 only (a session id, a one-time code):
// a lookup goes by the hash, so no secret is compared byte by byte; the
// CSRF token, which the session's owner reads back, is kept and compared
// in constant time.
#ifndef DLBATCH_SCHEDULER_WEB_SESSIONS_H_
#define DLBATCH_SCHEDULER_WEB_SESSIONS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "scheduler/rpc/identity.h"

namespace dlbatch::scheduler::web {

// 32 bytes of OpenSSL's RAND_bytes as 64 hex digits.
absl::StatusOr<std::string> RandomSecret();
// True when `a` and `b` are equal, in time that depends on their lengths
// only.
bool SecretsEqual(absl::string_view a, absl::string_view b);

struct Session {
  std::string id;    // the cookie's value; only in what Create returns
  std::string csrf;  // X-CSRF-Token of state-changing requests
  Caller caller;
  int64_t expires_ms = 0;  // Clock::NowMs
  // The caller's registration for revocation (OpenCalls' id), handed back
  // when the session goes.
  int64_t tag = 0;
};

// Thread-safe.
class Sessions {
 public:
  // `clock` is borrowed. A session lasts `lifetime_ms` from its login; at
  // most `max_sessions` are open (past it the one nearest its end goes).
  Sessions(const Clock* clock, int64_t lifetime_ms, int max_sessions = 10000);

  // A new session of `caller`. Its tag goes with it (Session::tag).
  absl::StatusOr<Session> Create(const Caller& caller, int64_t tag = 0);
  // The open session of cookie value `id`; nullopt when unknown, logged
  // out or expired (an expired one is dropped).
  std::optional<Session> Find(absl::string_view id);
  // Whether `presented` is the CSRF token of `session`.
  static bool CsrfMatches(const Session& session, absl::string_view presented);
  // Logs out the session of `id`; its tag, or nullopt if none was open.
  std::optional<int64_t> Revoke(absl::string_view id);
  // Ends every session, and forgets every one-time code, of the credential
  // `key` (Caller::credential); the ended sessions' tags.
  std::vector<int64_t> RevokeCredential(const std::string& key);
  // Drops expired sessions and codes; the dropped sessions' tags.
  std::vector<int64_t> Prune();

  // A one-time login code for `caller`, valid for kOnceCodeMs and once.
  absl::StatusOr<std::string> CreateOnceCode(const Caller& caller);
  // The caller of a valid code, which is used up by it; nullopt otherwise.
  std::optional<Caller> RedeemOnceCode(absl::string_view code);

  int64_t lifetime_ms() const { return lifetime_ms_; }
  size_t size() const;

  static constexpr int64_t kOnceCodeMs = 2 * 60 * 1000;

 private:
  struct Code {
    Caller caller;
    int64_t expires_ms = 0;
  };
  std::vector<int64_t> PruneLocked(int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const int64_t lifetime_ms_;
  const int max_sessions_;
  mutable absl::Mutex mu_;
  std::map<std::string, Session> by_hash_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Code> codes_ ABSL_GUARDED_BY(mu_);
};

// At most `max_failures` failed logins per client address in any
// `window_ms`; thread-safe.
class LoginLimiter {
 public:
  LoginLimiter(const Clock* clock, int max_failures = 10,
               int64_t window_ms = 60 * 1000, int max_addresses = 10000);
  // 0 when `address` may try now; else the seconds until it may
  // (Retry-After).
  int64_t RetryAfterSeconds(const std::string& address);
  void RecordFailure(const std::string& address);

 private:
  const Clock* const clock_;
  const int max_failures_;
  const int64_t window_ms_;
  const int max_addresses_;
  absl::Mutex mu_;
  // Each address's failures in the window, oldest first (MonotonicMs).
  std::map<std::string, std::deque<int64_t>> failures_ ABSL_GUARDED_BY(mu_);
};

// The value of cookie `name` in a Cookie header ("a=1; b=2"); "" if absent.
std::string CookieValue(absl::string_view header, absl::string_view name);

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_SESSIONS_H_
