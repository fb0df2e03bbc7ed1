// The diary lines workers send, stored (a running job's within its cap) or
// counted as lost while the disk is full. A job's diary against its cap
// (SchedulerOptions::max_diary_bytes): the first half of the cap keeps the
// diary's first lines, then a marker line, then the last lines within the other
// half; the oldest of those are deleted as new ones come, and the marker says
// how much went.
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"
#include "scheduler/worker_streams.h"

namespace dlbatch::scheduler {
namespace {

std::string MarkerText(const DiaryCut& cut, int64_t cap) {
  return absl::StrCat(
      "[dlbatch] ", cut.dropped_lines, " line",
      cut.dropped_lines == 1 ? "" : "s", " (", HumanBytes(cut.dropped_bytes),
      ", ", cut.dropped_bytes,
      " bytes) of this diary were dropped here: a diary keeps at most ",
      HumanBytes(cap),
      " (the scheduler's --max-diary-bytes), its first and its last lines");
}

// The rank a worker's line is stored with: the one it names; none for
// dlbatch's own; a job's line from a worker that predates ranks (one
// process per part) its part's number.
std::optional<int> LineRank(const v1::DiaryLine& line, int part) {
  if (line.stream() == 0) return std::nullopt;
  if (line.has_rank()) {
    if (line.rank() < 0) return std::nullopt;  // not a rank
    return line.rank();
  }
  return part;
}

}  // namespace

absl::Status WorkerStreams::HandleDiary(SchedulerState& s,
                                        const v1::DiaryBatch& d) {
  s.mu_.AssertHeld();
  if (d.lines().empty()) return absl::OkStatus();
  auto it = s.jobs_.find(d.job_id());
  if (it == s.jobs_.end()) {
    if (s.disk_->full()) return absl::OkStatus();
    // An ended job's late lines are stored (its diary is still whole);
    // lines of a job that does not exist (or was purged) are not.
    ASSIGN_OR_RETURN(std::optional<v1::JobState> state,
                     s.store_->JobState(d.job_id()));
    if (!state) {
      return absl::NotFoundError(absl::StrCat("no job ", d.job_id()));
    }
    for (const auto& line : d.lines()) {
      RETURN_IF_ERROR(s.store_
                          ->AddDiary(d.job_id(), d.attempt(), d.part(),
                                     line.seq(), line.time_ms(), line.stream(),
                                     line.text(), line.ending(),
                                     LineRank(line, d.part()))
                          .status());
    }
    s.Changed(d.job_id());
    return absl::OkStatus();
  }
  ActiveJob& job = it->second;
  if (s.disk_->full()) {
    // What grows without bound waits for space; counted, and said at the
    // job's end.
    for (const auto& line : d.lines()) {
      ++job.disk_dropped_lines;
      job.disk_dropped_bytes += static_cast<int64_t>(line.text().size());
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(StoreCappedDiary(s, job, d));
  s.Changed(d.job_id());
  return absl::OkStatus();
}

absl::Status WorkerStreams::LoadDiaryBudget(SchedulerState& s, ActiveJob& job) {
  s.mu_.AssertHeld();
  if (job.diary.loaded) return absl::OkStatus();
  const int64_t id = job.record.id;
  DiaryBudget budget;
  ASSIGN_OR_RETURN(std::optional<DiaryCut> cut, s.store_->GetDiaryCut(id));
  if (cut) {
    budget.cut = *cut;
    ASSIGN_OR_RETURN(auto seqs, s.store_->DiaryLastSeqs(id, cut->marker_n));
    for (const auto& [attempt, part, seq] : seqs)
      budget.last_seq[{attempt, part}] = seq;
  } else {
    ASSIGN_OR_RETURN(budget.cut.head_bytes, s.store_->DiaryBytes(id));
  }
  budget.loaded = true;
  job.diary = std::move(budget);
  return absl::OkStatus();
}

absl::Status WorkerStreams::StoreCappedDiary(SchedulerState& s, ActiveJob& job,
                                             const v1::DiaryBatch& d) {
  s.mu_.AssertHeld();
  const int64_t id = job.record.id;
  const int64_t cap = s.options_.max_diary_bytes;
  if (cap <= 0) {
    for (const auto& line : d.lines()) {
      RETURN_IF_ERROR(s.store_
                          ->AddDiary(id, d.attempt(), d.part(), line.seq(),
                                     line.time_ms(), line.stream(), line.text(),
                                     line.ending(), LineRank(line, d.part()))
                          .status());
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(LoadDiaryBudget(s, job));
  // Worked on a copy: a batch refused (its savepoint undone) leaves the
  // budget as it was.
  DiaryBudget budget = job.diary;
  DiaryCut& cut = budget.cut;
  const int64_t half = cap / 2;
  for (const auto& line : d.lines()) {
    const int64_t size = static_cast<int64_t>(line.text().size());
    if (cut.marker_n == 0) {
      if (cut.head_bytes + size <= half) {
        ASSIGN_OR_RETURN(
            bool added,
            s.store_->AddDiary(id, d.attempt(), d.part(), line.seq(),
                               line.time_ms(), line.stream(), line.text(),
                               line.ending(), LineRank(line, d.part())));
        if (added) cut.head_bytes += size;
        continue;
      }
      // The first half is full: the marker goes here, the rest is the
      // tail.
      RETURN_IF_ERROR(s.store_
                          ->AddDiary(id, d.attempt(), 0, -1, s.clock_->NowMs(),
                                     0, MarkerText(cut, cap))
                          .status());
      cut.marker_n = s.store_->LastInsertId();
    }
    int64_t& last = budget.last_seq[{d.attempt(), d.part()}];
    // A line at or before the newest stored one was stored already (and
    // may have been trimmed since): never again.
    if (last > 0 && line.seq() <= last) continue;
    ASSIGN_OR_RETURN(bool added, s.store_->AddDiary(
                                     id, d.attempt(), d.part(), line.seq(),
                                     line.time_ms(), line.stream(), line.text(),
                                     line.ending(), LineRank(line, d.part())));
    if (added) cut.tail_bytes += size;
    last = std::max(last, line.seq());
  }
  if (cut.marker_n != 0) {
    if (cut.tail_bytes > half) {
      ASSIGN_OR_RETURN(
          auto trimmed,
          s.store_->TrimDiary(id, cut.marker_n, cut.tail_bytes - half));
      cut.tail_bytes -= trimmed.second;
      cut.dropped_lines += trimmed.first;
      cut.dropped_bytes += trimmed.second;
      if (trimmed.first > 0) {
        RETURN_IF_ERROR(
            s.store_->SetDiaryText(cut.marker_n, MarkerText(cut, cap)));
      }
    }
    RETURN_IF_ERROR(s.store_->PutDiaryCut(id, cut));
  }
  job.diary = std::move(budget);
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler
