#include "scheduler/store/user_tables.h"

#include "common/status.h"

namespace dlbatch::scheduler {

absl::Status UserTables::PutCredential(const CredentialRecord& record) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO credentials(name, worker, admin, "
                   "token_sha256, created_ms) VALUES(?,?,?,?,?) "
                   "ON CONFLICT(name, worker) DO UPDATE SET "
                   "admin=excluded.admin, token_sha256=excluded.token_sha256, "
                   "created_ms=excluded.created_ms"));
  return st->Bind(1, record.name)
      .Bind(2, record.worker ? 1 : 0)
      .Bind(3, record.admin ? 1 : 0)
      .Bind(4, record.token_sha256)
      .Bind(5, record.created_ms)
      .Run();
}

absl::StatusOr<bool> UserTables::DeleteCredential(const std::string& name,
                                                  bool worker) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("DELETE FROM credentials WHERE name=? AND worker=?"));
  RETURN_IF_ERROR(st->Bind(1, name).Bind(2, worker ? 1 : 0).Run());
  return db_->Changes() > 0;
}

absl::StatusOr<std::vector<CredentialRecord>> UserTables::Credentials() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT name, worker, admin, token_sha256, "
                                "created_ms FROM credentials "
                                "ORDER BY worker, name"));
  std::vector<CredentialRecord> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    CredentialRecord r;
    r.name = st->Text(0);
    r.worker = st->Int(1) != 0;
    r.admin = st->Int(2) != 0;
    r.token_sha256 = st->Text(3);
    r.created_ms = st->Int(4);
    out.push_back(std::move(r));
  }));
  return out;
}

absl::Status UserTables::PutUserLimit(const LimitEntry& entry) {
  if (entry.limit == UserLimit{}) {
    ASSIGN_OR_RETURN(
        Statement * del,
        db_->Prepare("DELETE FROM user_limits WHERE user=? AND profile=?"));
    return del->Bind(1, entry.user).Bind(2, entry.profile).Run();
  }
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO user_limits(user, profile, max_slots, "
                   "max_queued) VALUES(?,?,?,?) ON CONFLICT(user, profile) "
                   "DO UPDATE SET max_slots=excluded.max_slots, "
                   "max_queued=excluded.max_queued"));
  return st->Bind(1, entry.user)
      .Bind(2, entry.profile)
      .Bind(3, entry.limit.max_slots)
      .Bind(4, entry.limit.max_queued)
      .Run();
}

absl::StatusOr<std::vector<LimitEntry>> UserTables::UserLimits() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT user, profile, max_slots, max_queued "
                                "FROM user_limits ORDER BY profile, user"));
  std::vector<LimitEntry> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    LimitEntry e;
    e.user = st->Text(0);
    e.profile = st->Text(1);
    e.limit.max_slots = static_cast<int>(st->Int(2));
    e.limit.max_queued = static_cast<int>(st->Int(3));
    out.push_back(std::move(e));
  }));
  return out;
}

absl::Status UserTables::PutUsage(const StoredUsage& usage) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("INSERT INTO user_usage(user, slot_ms, at_ms) VALUES(?,?,?) "
                   "ON CONFLICT(user) DO UPDATE SET slot_ms=excluded.slot_ms, "
                   "at_ms=excluded.at_ms"));
  return st->Bind(1, usage.user)
      .Bind(2, usage.slot_ms)
      .Bind(3, usage.at_ms)
      .Run();
}

absl::StatusOr<std::vector<StoredUsage>> UserTables::Usages() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "SELECT user, slot_ms, at_ms FROM user_usage ORDER BY user"));
  std::vector<StoredUsage> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    out.push_back({st->Text(0), st->Int(1), st->Int(2)});
  }));
  return out;
}

}  // namespace dlbatch::scheduler
