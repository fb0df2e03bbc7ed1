// The store's user tables, on the writer's connection: the tokens by their
// hash (credentials, schema version 5), per-user limits (user_limits) and
// fair-share usage of ended jobs (user_usage, both version 4).
#ifndef DLBATCH_SCHEDULER_STORE_USER_TABLES_H_
#define DLBATCH_SCHEDULER_STORE_USER_TABLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/core/placement.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// A user's fair-share usage of ended jobs: slot_ms, decayed as of at_ms.
struct StoredUsage {
  std::string user;
  int64_t slot_ms = 0;
  int64_t at_ms = 0;
};

class UserTables {
 public:
  UserTables(const UserTables&) = delete;
  UserTables& operator=(const UserTables&) = delete;

  // Writes; the caller holds a Transaction on the store's db().
  // Tokens, by their hash (credentials.h). Put replaces the name's token;
  // Delete returns whether there was one.
  absl::Status PutCredential(const CredentialRecord& record);
  absl::StatusOr<bool> DeleteCredential(const std::string& name, bool worker);
  absl::StatusOr<std::vector<CredentialRecord>> Credentials();

  // A limit that is unlimited in both is deleted.
  absl::Status PutUserLimit(const LimitEntry& entry);
  absl::StatusOr<std::vector<LimitEntry>> UserLimits();
  absl::Status PutUsage(const StoredUsage& usage);
  absl::StatusOr<std::vector<StoredUsage>> Usages();

 protected:
  explicit UserTables(Database* db) : db_(db) {}  // db outlives this
  ~UserTables() = default;

 private:
  Database* const db_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_USER_TABLES_H_
