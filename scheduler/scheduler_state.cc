// The helpers every part of the scheduler uses over the shared state:
// transactions that recover when they fail, the store's writability, the
// placement core's making, and sending what was collected under mu_.
#include "scheduler/scheduler_state.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"

namespace dlbatch::scheduler {

SchedulerState::SchedulerState(Store* store, StoreReader* reader,
                               BlobStore* blobs, const Clock* clock,
                               SchedulerOptions options, DiskGuard* disk)
    : store_(store),
      reader_(reader),
      blobs_(blobs),
      clock_(clock),
      options_(std::move(options)),
      own_disk_(disk ? nullptr
                     : std::make_unique<DiskGuard>("", /*reserve_bytes=*/0)),
      disk_(disk ? disk : own_disk_.get()),
      rendezvous_(GenerateToken().value_or(std::to_string(clock->NowMs()))) {}

absl::Status SchedulerState::InTransaction(
    const std::function<absl::Status()>& body) {
  mu_.AssertHeld();
  absl::Status s;
  {
    Transaction txn(store_->db());
    s = txn.status();
    if (s.ok()) s = body();
    if (s.ok()) s = TimedCommit(txn);
  }  // rolled back unless committed
  if (!s.ok()) Recover(s);
  return s;
}

absl::Status SchedulerState::TimedCommit(Transaction& txn) {
  if (metrics_ == nullptr) return txn.Commit();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = txn.Commit();
  metrics_->StoreCommit(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  return s;
}

absl::Status SchedulerState::CheckWritable() const {
  mu_.AssertHeld();
  if (!broken_.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the scheduler cannot write its store (",
                     broken_.message(), "); it retries by itself"));
  }
  if (disk_->full()) return absl::ResourceExhaustedError(disk_->Reason());
  return absl::OkStatus();
}

absl::Status SchedulerState::SaveUsage(const std::string& user) {
  mu_.AssertHeld();
  const int64_t now = clock_->NowMs();
  return store_->PutUsage(
      {user, std::llround(core_->EndedUsage(user, now)), now});
}

std::unique_ptr<PlacementCore> SchedulerState::NewCore() const {
  mu_.AssertHeld();
  auto core = std::make_unique<PlacementCore>();
  core->SetFairShareHalfLife(options_.fair_share_half_life_ms);
  for (const auto& [key, limit] : limits_) {
    core->SetLimit(key.first, key.second, limit);
  }
  return core;
}

void SchedulerState::Deliver(Outbox& out) {
  for (auto& [session, message] : out) {
    if (session) session->Send(message);
  }
  out.clear();
}

}  // namespace dlbatch::scheduler
