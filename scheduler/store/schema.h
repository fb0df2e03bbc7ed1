// The store's schema and the migrations that bring an older file to it.
// Store::Open calls MigrateSchema before anything reads or writes the file.
#ifndef DLBATCH_SCHEDULER_STORE_SCHEMA_H_
#define DLBATCH_SCHEDULER_STORE_SCHEMA_H_

#include <string>

#include "absl/status/status.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

// Checks the schema version `db` (the store at `path`, opened for writing)
// holds: FailedPrecondition for a version this scheduler does not read,
// naming both. A file of an older version (or a new, empty one) is brought
// to the current version (schema.cc says what each added) in one
// transaction, so a crash mid-migration leaves the old version whole; each
// migration is idempotent. A current file is not written at all, so a
// scheduler whose disk is full still starts.
absl::Status MigrateSchema(Database* db, const std::string& path);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_SCHEMA_H_
