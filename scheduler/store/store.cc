#include "scheduler/store/store.h"

#include <sys/stat.h>

#include <utility>

#include "common/status.h"
#include "scheduler/store/schema.h"

namespace dlbatch::scheduler {

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path,
                                                   bool sync_full) {
  ASSIGN_OR_RETURN(auto db,
                   Database::Open(path, /*read_only=*/false, sync_full));
  RETURN_IF_ERROR(MigrateSchema(db.get(), path));
  ASSIGN_OR_RETURN(Statement * last,
                   db->Prepare("SELECT MAX(ev) FROM job_events"));
  ASSIGN_OR_RETURN(bool row, last->Step());
  const int64_t last_event = row ? last->Int(0) : 0;
  last->Reset();
  auto store = std::unique_ptr<Store>(new Store(std::move(db), last_event));
  // Commits are made under the scheduler's lock: checkpoints, which take
  // tens of milliseconds, run beside them instead of inside them.
  RETURN_IF_ERROR(store->db_->CheckpointInBackground());
  return store;
}

// The table classes are given the connection before db_ takes it: they
// only keep the pointer, which stays valid for as long as the Store.
Store::Store(std::unique_ptr<Database> db, int64_t last_event)
    : JobTables(db.get(), last_event),
      DiaryTables(db.get()),
      WorkerTables(db.get()),
      UserTables(db.get()),
      SlurmTables(db.get()),
      db_(std::move(db)) {}

int64_t StoreFileBytes(const std::string& db_path) {
  int64_t total = 0;
  for (const char* suffix : {"", "-wal"}) {
    struct stat st;
    if (::stat((db_path + suffix).c_str(), &st) == 0) total += st.st_size;
  }
  return total;
}

}  // namespace dlbatch::scheduler
