#include "scheduler/web/sessions.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "scheduler/rpc/credentials.h"

namespace dlbatch::scheduler::web {

absl::StatusOr<std::string> RandomSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    return absl::InternalError(
        "OpenSSL's random generator failed; the web face cannot make a "
        "session");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Sessions::Sessions(const Clock* clock, int64_t lifetime_ms, int max_sessions)
    : clock_(clock),
      lifetime_ms_(lifetime_ms),
      max_sessions_(std::max(1, max_sessions)) {}

absl::StatusOr<Session> Sessions::Create(const Caller& caller, int64_t tag) {
  absl::StatusOr<std::string> id = RandomSecret();
  if (!id.ok()) return id.status();
  absl::StatusOr<std::string> csrf = RandomSecret();
  if (!csrf.ok()) return csrf.status();
  Session session;
  session.csrf = *csrf;
  session.caller = caller;
  session.expires_ms = clock_->NowMs() + lifetime_ms_;
  session.tag = tag;
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(by_hash_.size()) >= max_sessions_) {
    // The one nearest its end makes room. Its tag is not handed back: its
    // registration ends with the credential's (an entry that only says
    // "revoke these sessions", which finds none of it).
    auto soonest = std::min_element(
        by_hash_.begin(), by_hash_.end(), [](const auto& a, const auto& b) {
          return a.second.expires_ms < b.second.expires_ms;
        });
    by_hash_.erase(soonest);
  }
  by_hash_[TokenSha256(*id)] = session;
  session.id = *std::move(id);
  return session;
}

std::optional<Session> Sessions::Find(absl::string_view id) {
  if (id.empty()) return std::nullopt;
  const std::string hash = TokenSha256(id);
  absl::MutexLock lock(&mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  if (it->second.expires_ms <= clock_->NowMs()) {
    by_hash_.erase(it);
    return std::nullopt;
  }
  return it->second;
}

bool Sessions::CsrfMatches(const Session& session,
                           absl::string_view presented) {
  return !presented.empty() && SecretsEqual(session.csrf, presented);
}

std::optional<int64_t> Sessions::Revoke(absl::string_view id) {
  if (id.empty()) return std::nullopt;
  const std::string hash = TokenSha256(id);
  absl::MutexLock lock(&mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  int64_t tag = it->second.tag;
  by_hash_.erase(it);
  return tag;
}

std::vector<int64_t> Sessions::RevokeCredential(const std::string& key) {
  std::vector<int64_t> tags;
  absl::MutexLock lock(&mu_);
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    if (it->second.caller.credential == key) {
      tags.push_back(it->second.tag);
      it = by_hash_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = codes_.begin(); it != codes_.end();) {
    it = it->second.caller.credential == key ? codes_.erase(it) : std::next(it);
  }
  return tags;
}

std::vector<int64_t> Sessions::Prune() {
  absl::MutexLock lock(&mu_);
  return PruneLocked(clock_->NowMs());
}

std::vector<int64_t> Sessions::PruneLocked(int64_t now) {
  std::vector<int64_t> tags;
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    if (it->second.expires_ms <= now) {
      tags.push_back(it->second.tag);
      it = by_hash_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = codes_.begin(); it != codes_.end();) {
    it = it->second.expires_ms <= now ? codes_.erase(it) : std::next(it);
  }
  return tags;
}

absl::StatusOr<std::string> Sessions::CreateOnceCode(const Caller& caller) {
  absl::StatusOr<std::string> code = RandomSecret();
  if (!code.ok()) return code.status();
  absl::MutexLock lock(&mu_);
  // Codes are few and short-lived; each new one sweeps the expired away,
  // so a caller asking in a loop holds at most two minutes' worth.
  const int64_t now = clock_->NowMs();
  for (auto it = codes_.begin(); it != codes_.end();) {
    it = it->second.expires_ms <= now ? codes_.erase(it) : std::next(it);
  }
  codes_[TokenSha256(*code)] = Code{caller, now + kOnceCodeMs};
  return code;
}

std::optional<Caller> Sessions::RedeemOnceCode(absl::string_view code) {
  if (code.empty()) return std::nullopt;
  const std::string hash = TokenSha256(code);
  absl::MutexLock lock(&mu_);
  auto it = codes_.find(hash);
  if (it == codes_.end()) return std::nullopt;
  Code found = std::move(it->second);
  codes_.erase(it);
  if (found.expires_ms <= clock_->NowMs()) return std::nullopt;
  return found.caller;
}

size_t Sessions::size() const {
  absl::MutexLock lock(&mu_);
  return by_hash_.size();
}

LoginLimiter::LoginLimiter(const Clock* clock, int max_failures,
                           int64_t window_ms, int max_addresses)
    : clock_(clock),
      max_failures_(std::max(1, max_failures)),
      window_ms_(window_ms),
      max_addresses_(std::max(1, max_addresses)) {}

int64_t LoginLimiter::RetryAfterSeconds(const std::string& address) {
  const int64_t now = clock_->MonotonicMs();
  absl::MutexLock lock(&mu_);
  auto it = failures_.find(address);
  if (it == failures_.end()) return 0;
  std::deque<int64_t>& times = it->second;
  while (!times.empty() && times.front() + window_ms_ <= now) times.pop_front();
  if (times.empty()) {
    failures_.erase(it);
    return 0;
  }
  if (static_cast<int>(times.size()) < max_failures_) return 0;
  // Free once the oldest failure leaves the window.
  int64_t wait_ms = times.front() + window_ms_ - now;
  return std::max<int64_t>(1, (wait_ms + 999) / 1000);
}

void LoginLimiter::RecordFailure(const std::string& address) {
  const int64_t now = clock_->MonotonicMs();
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(failures_.size()) >= max_addresses_ &&
      failures_.find(address) == failures_.end()) {
    // Many addresses at once: those whose failures are all old go first;
    // if none is, the table is full of live limits and the newcomer shares
    // nothing (it is still counted below, in place of the oldest).
    for (auto it = failures_.begin(); it != failures_.end();) {
      it = it->second.empty() || it->second.back() + window_ms_ <= now
               ? failures_.erase(it)
               : std::next(it);
    }
    if (static_cast<int>(failures_.size()) >= max_addresses_)
      failures_.erase(failures_.begin());
  }
  std::deque<int64_t>& times = failures_[address];
  times.push_back(now);
  // Only the last max_failures_ matter for the limit.
  while (static_cast<int>(times.size()) > max_failures_) times.pop_front();
}

std::string CookieValue(absl::string_view header, absl::string_view name) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    size_t eq = part.find('=');
    if (eq == absl::string_view::npos) continue;
    if (absl::StripAsciiWhitespace(part.substr(0, eq)) != name) continue;
    absl::string_view value = absl::StripAsciiWhitespace(part.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
      value = value.substr(1, value.size() - 2);
    return std::string(value);
  }
  return "";
}

}  // namespace dlbatch::scheduler::web
