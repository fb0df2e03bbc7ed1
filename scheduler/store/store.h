// The scheduler's durable state in one SQLite file (WAL): jobs and their
// state history, diary lines, workers, profiles, users' credentials and
// limits, Slurm records and output metadata.
//
// Store is the single writer. It is made of one class per group of tables
// (job_tables.h, diary_tables.h, worker_tables.h, user_tables.h,
// slurm_tables.h), all on the one writer connection it owns; schema.h
// brings an older file to the current schema as it opens. StoreReader
// (store_reader.h) serves reads on connections of its own.
//
// Threads and locks:
// - Store (every table class in it) has no lock and is not thread-safe:
//   one thread at a time calls it. The scheduler calls it only under its
//   own mutex (Scheduler::mu_), so Store's members (the writer connection,
//   the last job_events.ev) are guarded by that lock, which Store cannot
//   name, and carry no annotation. The one exception: db()->path(), fixed
//   at Open, may be read on any thread.
// - Each acknowledged change is one Transaction on db(), committed before
//   the reply; the commit may hand a WAL checkpoint to Database's
//   background thread, which uses a connection of its own (sqlite.h).
// - StoreReader is thread-safe and never waits for the writer: each read
//   leases one read-only connection to its thread alone and returns it to
//   a pool guarded by StoreReader::mu_, a lock held only to take or give
//   back a connection. Reads see committed transactions only.
// - So there is one SQLite connection per thread using it, never one
//   shared: the writer's, the checkpointer's, and a reader's per read in
//   flight (at most 8 kept idle).
#ifndef DLBATCH_SCHEDULER_STORE_STORE_H_
#define DLBATCH_SCHEDULER_STORE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/store/diary_tables.h"
#include "scheduler/store/job_tables.h"
#include "scheduler/store/slurm_tables.h"
#include "scheduler/store/sqlite.h"
#include "scheduler/store/store_reader.h"
#include "scheduler/store/user_tables.h"
#include "scheduler/store/worker_tables.h"

namespace dlbatch::scheduler {

// Bytes of the store at `db_path` on disk: the database and its WAL.
int64_t StoreFileBytes(const std::string& db_path);

// The writer: every table's writes and the reads that recovery and
// de-duplication make on the writer's connection, inherited from the table
// classes so that a caller holds one Store (or hands a part on, as a
// SlurmTables*).
class Store : public JobTables,
              public DiaryTables,
              public WorkerTables,
              public UserTables,
              public SlurmTables {
 public:
  // Opens (creating) the store at `path`, migrating an older schema
  // (MigrateSchema), and starts its background checkpoints. sync_full: as
  // Database::Open.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                                     bool sync_full);
  // The writer connection, for Transactions and Savepoints.
  Database* db() { return db_.get(); }
  int64_t LastInsertId() { return db_->LastInsertId(); }

 private:
  Store(std::unique_ptr<Database> db, int64_t last_event);

  std::unique_ptr<Database> db_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_STORE_H_
