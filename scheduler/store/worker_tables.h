// The store's worker tables, on the writer's connection: the workers that
// registered (workers), the drained ones by name (worker_drains, schema
// version 6) and the profiles with their pool limits (profiles).
#ifndef DLBATCH_SCHEDULER_STORE_WORKER_TABLES_H_
#define DLBATCH_SCHEDULER_STORE_WORKER_TABLES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {

struct WorkerRecord {
  int64_t id = 0;
  std::string name;
  std::string host;
  std::string profile;
  std::vector<v1::Device> devices;
  int64_t last_seen_ms = 0;
};

// A drained worker, by name (schema version 6).
struct WorkerDrain {
  std::string name;
  std::string reason;
  int64_t since_ms = 0;
};

class WorkerTables {
 public:
  WorkerTables(const WorkerTables&) = delete;
  WorkerTables& operator=(const WorkerTables&) = delete;

  // Writes; the caller holds a Transaction on the store's db(). A worker
  // keeps the id of its name.
  absl::StatusOr<int64_t> UpsertWorker(const WorkerRecord& worker);
  absl::Status DeleteWorker(int64_t id);
  absl::StatusOr<std::vector<WorkerRecord>> Workers();

  absl::Status PutDrain(const WorkerDrain& drain);
  absl::Status DeleteDrain(const std::string& name);
  absl::StatusOr<std::vector<WorkerDrain>> Drains();

  absl::Status UpsertProfile(const std::string& name, int max_pool);
  absl::StatusOr<std::vector<std::pair<std::string, int>>> Profiles();

 protected:
  explicit WorkerTables(Database* db) : db_(db) {}  // db outlives this
  ~WorkerTables() = default;

 private:
  Database* const db_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_WORKER_TABLES_H_
