// What the worker owes the scheduler, kept until acknowledged (pure, no
// I/O): per job, its diary lines until a DiaryAck covers them, its end
// report until an EndedAck, and its latest progress and checkpoint (sent
// again after every reconnect while the job is held; the scheduler keeps
// the newest). A reconnect makes everything unacknowledged due again, so a
// scheduler killed at any moment loses nothing.
//
// Not thread-safe: SchedulerLink guards it.
#ifndef DLBATCH_WORKER_OUTBOX_H_
#define DLBATCH_WORKER_OUTBOX_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "dlbatch/v1/scheduler.pb.h"
#include "worker/job_ref.h"

namespace dlbatch::worker {

class Outbox {
 public:
  // Diary lines per message at most.
  static constexpr int kBatchLines = 500;

  // Holds `ref` (reported in registrations) until its end is acknowledged.
  void Open(const JobRef& ref);
  // Adds a record of a held job: a diary batch (lines in seq order), an end
  // report, progress or a checkpoint. Records of unknown jobs are dropped.
  void Add(const v1::WorkerMessage& record);
  // Diary lines up to `seq` are committed.
  void AckDiary(const JobRef& ref, int64_t seq);
  // The end report is committed: the job is no longer held. False if it was
  // not held or had no report.
  bool AckEnded(const JobRef& ref);
  // A new connection: everything unacknowledged is due again.
  void Rewind();

  // Messages due now, marked sent: per job its lines first, then progress,
  // checkpoint and end report (the scheduler ends a job only after every
  // line before its report is committed).
  std::vector<v1::WorkerMessage> TakeDue();
  bool HasDue() const;
  std::vector<JobRef> Held() const;
  // Unacknowledged diary lines of `ref` (tests and limits).
  size_t Unacked(const JobRef& ref) const;

 private:
  struct Entry {
    std::deque<v1::DiaryLine> lines;  // unacknowledged, seq order
    int64_t sent_seq = 0;             // last seq taken on this connection
    std::optional<v1::JobProgress> progress;
    bool progress_due = false;
    std::optional<v1::CheckpointStored> checkpoint;
    bool checkpoint_due = false;
    std::optional<v1::JobEnded> ended;
    bool ended_due = false;
  };
  static bool Due(const Entry& e);

  std::map<JobRef, Entry> entries_;
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_OUTBOX_H_
