#include "scheduler/store/worker_tables.h"

#include "common/status.h"

namespace dlbatch::scheduler {

absl::StatusOr<int64_t> WorkerTables::UpsertWorker(const WorkerRecord& worker) {
  v1::WorkerInfo devices;  // only its devices are serialised
  for (const auto& d : worker.devices) *devices.add_devices() = d;
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO workers(name, host, profile, devices, last_seen_ms) "
          "VALUES(?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
          "host=excluded.host, profile=excluded.profile, "
          "devices=excluded.devices, last_seen_ms=excluded.last_seen_ms"));
  st->Bind(1, worker.name)
      .Bind(2, worker.host)
      .Bind(3, worker.profile)
      .BindBlob(4, devices.SerializeAsString())
      .Bind(5, worker.last_seen_ms);
  RETURN_IF_ERROR(st->Run());
  ASSIGN_OR_RETURN(Statement * get,
                   db_->Prepare("SELECT id FROM workers WHERE name=?"));
  ASSIGN_OR_RETURN(bool found, get->Bind(1, worker.name).Step());
  if (!found) return absl::InternalError("worker vanished after upsert");
  int64_t id = get->Int(0);
  get->Reset();
  return id;
}

absl::Status WorkerTables::UpsertProfile(const std::string& name,
                                         int max_pool) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare(
          "INSERT INTO profiles(name, max_pool) VALUES(?,?) "
          "ON CONFLICT(name) DO UPDATE SET max_pool=excluded.max_pool"));
  return st->Bind(1, name).Bind(2, max_pool).Run();
}

absl::StatusOr<std::vector<WorkerRecord>> WorkerTables::Workers() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT id, name, host, profile, devices, last_seen_ms "
                   "FROM workers ORDER BY id"));
  std::vector<WorkerRecord> workers;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    WorkerRecord w;
    w.id = st->Int(0);
    w.name = st->Text(1);
    w.host = st->Text(2);
    w.profile = st->Text(3);
    v1::WorkerInfo devices;
    absl::string_view blob = st->Blob(4);
    devices.ParseFromArray(blob.data(), static_cast<int>(blob.size()));
    w.devices.assign(devices.devices().begin(), devices.devices().end());
    w.last_seen_ms = st->Int(5);
    workers.push_back(std::move(w));
  }));
  return workers;
}

absl::StatusOr<std::vector<std::pair<std::string, int>>>
WorkerTables::Profiles() {
  ASSIGN_OR_RETURN(
      Statement * st,
      db_->Prepare("SELECT name, max_pool FROM profiles ORDER BY name"));
  std::vector<std::pair<std::string, int>> out;
  RETURN_IF_ERROR(st->ForEachRow(
      [&] { out.emplace_back(st->Text(0), static_cast<int>(st->Int(1))); }));
  return out;
}

absl::Status WorkerTables::PutDrain(const WorkerDrain& drain) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("INSERT INTO worker_drains(name, reason, "
                                "since_ms) VALUES(?,?,?) ON CONFLICT(name) DO "
                                "UPDATE SET reason=excluded.reason"));
  return st->Bind(1, drain.name)
      .Bind(2, drain.reason)
      .Bind(3, drain.since_ms)
      .Run();
}

absl::Status WorkerTables::DeleteDrain(const std::string& name) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM worker_drains WHERE name=?"));
  return st->Bind(1, name).Run();
}

absl::StatusOr<std::vector<WorkerDrain>> WorkerTables::Drains() {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("SELECT name, reason, since_ms FROM "
                                "worker_drains ORDER BY name"));
  std::vector<WorkerDrain> out;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    out.push_back({st->Text(0), st->Text(1), st->Int(2)});
  }));
  return out;
}

absl::Status WorkerTables::DeleteWorker(int64_t id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db_->Prepare("DELETE FROM workers WHERE id=?"));
  return st->Bind(1, id).Run();
}

}  // namespace dlbatch::scheduler
