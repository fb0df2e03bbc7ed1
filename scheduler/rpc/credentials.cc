#include "scheduler/rpc/credentials.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/files.h"

namespace dlbatch::scheduler {

std::string CredentialRecord::Key() const {
  if (job_id != 0) return absl::StrCat("job:", job_id);
  return absl::StrCat(worker ? "worker:" : "user:", name);
}

absl::Status CheckCredentialName(absl::string_view name) {
  bool ok = !name.empty() && name.size() <= 64 && name[0] != '-';
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      ok = false;
    }
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "'", name,
      "' is not a credential name: use letters, digits and . _ - (at most 64, "
      "not starting with -), as a login name"));
}

absl::StatusOr<std::string> NewToken(bool worker) {
  absl::StatusOr<std::string> random = GenerateToken();
  if (!random.ok()) return random.status();
  return absl::StrCat(worker ? "dlbw_" : "dlbu_", *random);
}

absl::StatusOr<std::string> NewJobToken() {
  absl::StatusOr<std::string> random = GenerateToken();
  if (!random.ok()) return random.status();
  return absl::StrCat("dlbj_", *random);
}

CredentialRecord JobCredential(int64_t job_id, std::string token_sha256) {
  CredentialRecord r;
  r.name = absl::StrCat("job-", job_id);
  r.worker = true;
  r.job_id = job_id;
  r.token_sha256 = std::move(token_sha256);
  return r;
}

std::string TokenSha256(absl::string_view token) { return Sha256Hex(token); }

void CredentialTable::Reset(std::vector<CredentialRecord> records) {
  absl::MutexLock lock(&mu_);
  by_hash_.clear();
  for (auto& r : records) {
    std::string hash = r.token_sha256;
    by_hash_[hash] = std::move(r);
  }
}

void CredentialTable::Put(CredentialRecord record) {
  absl::MutexLock lock(&mu_);
  // A name holds one token at a time.
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    if (it->second.name == record.name && it->second.worker == record.worker &&
        it->second.job_id == record.job_id) {
      it = by_hash_.erase(it);
    } else {
      ++it;
    }
  }
  std::string hash = record.token_sha256;
  by_hash_[hash] = std::move(record);
}

void CredentialTable::Remove(const std::string& name, bool worker) {
  absl::MutexLock lock(&mu_);
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    if (it->second.name == name && it->second.worker == worker &&
        it->second.job_id == 0) {
      it = by_hash_.erase(it);
    } else {
      ++it;
    }
  }
}

void CredentialTable::RemoveJob(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    if (it->second.job_id == job_id) {
      it = by_hash_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<CredentialRecord> CredentialTable::FindByToken(
    absl::string_view token) const {
  if (token.empty()) return std::nullopt;
  std::string hash = TokenSha256(token);
  absl::MutexLock lock(&mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

bool CredentialTable::empty() const {
  absl::MutexLock lock(&mu_);
  return by_hash_.empty();
}

int64_t OpenCalls::Add(const std::string& key, std::function<void()> end) {
  auto entry = std::make_shared<Entry>();
  entry->key = key;
  entry->end = std::move(end);
  absl::MutexLock lock(&mu_);
  int64_t id = next_++;
  open_[id] = std::move(entry);
  return id;
}

void OpenCalls::Remove(int64_t id) {
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(id);
    if (it == open_.end()) return;
    entry = std::move(it->second);
    open_.erase(it);
  }
  entry->mu.Lock();
  entry->done = true;
  entry->mu.Unlock();
}

int OpenCalls::EndAll(const std::string& key) {
  std::vector<std::shared_ptr<Entry>> ending;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : open_) {
      if (entry->key == key) ending.push_back(entry);
    }
  }
  // Outside the registry's lock: `end` may call Remove.
  int ended = 0;
  for (const auto& entry : ending) {
    entry->mu.Lock();
    if (!entry->done) {
      entry->done = true;
      entry->end();
      ++ended;
    }
    entry->mu.Unlock();
  }
  return ended;
}

}  // namespace dlbatch::scheduler
