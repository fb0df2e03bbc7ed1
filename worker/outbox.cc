#include "worker/outbox.h"

#include <algorithm>
#include <utility>

namespace dlbatch::worker {

void Outbox::Open(const JobRef& ref) { entries_.try_emplace(ref); }

void Outbox::Add(const v1::WorkerMessage& record) {
  switch (record.msg_case()) {
    case v1::WorkerMessage::kDiary: {
      auto it = entries_.find(JobRef::Of(record.diary()));
      if (it == entries_.end()) return;
      for (const auto& line : record.diary().lines()) {
        auto& lines = it->second.lines;
        // Callers add in seq order; a line out of order is put in its place.
        auto pos = std::upper_bound(
            lines.begin(), lines.end(), line.seq(),
            [](int64_t seq, const v1::DiaryLine& l) { return seq < l.seq(); });
        lines.insert(pos, line);
      }
      return;
    }
    case v1::WorkerMessage::kProgress: {
      auto it = entries_.find(JobRef::Of(record.progress()));
      if (it == entries_.end()) return;
      it->second.progress = record.progress();
      it->second.progress_due = true;
      return;
    }
    case v1::WorkerMessage::kCheckpoint: {
      auto it = entries_.find(JobRef::Of(record.checkpoint()));
      if (it == entries_.end()) return;
      it->second.checkpoint = record.checkpoint();
      it->second.checkpoint_due = true;
      return;
    }
    case v1::WorkerMessage::kEnded: {
      auto it = entries_.find(JobRef::Of(record.ended()));
      if (it == entries_.end()) return;
      it->second.ended = record.ended();
      it->second.ended_due = true;
      return;
    }
    default:
      return;
  }
}

void Outbox::AckDiary(const JobRef& ref, int64_t seq) {
  auto it = entries_.find(ref);
  if (it == entries_.end()) return;
  auto& lines = it->second.lines;
  while (!lines.empty() && lines.front().seq() <= seq) lines.pop_front();
}

bool Outbox::AckEnded(const JobRef& ref) {
  auto it = entries_.find(ref);
  if (it == entries_.end() || !it->second.ended.has_value()) return false;
  entries_.erase(it);
  return true;
}

void Outbox::Rewind() {
  for (auto& [ref, e] : entries_) {
    e.sent_seq = e.lines.empty() ? 0 : e.lines.front().seq() - 1;
    e.progress_due = e.progress.has_value();
    e.checkpoint_due = e.checkpoint.has_value();
    e.ended_due = e.ended.has_value();
  }
}

bool Outbox::Due(const Entry& e) {
  return (!e.lines.empty() && e.lines.back().seq() > e.sent_seq) ||
         e.progress_due || e.checkpoint_due || e.ended_due;
}

bool Outbox::HasDue() const {
  for (const auto& [ref, e] : entries_) {
    if (Due(e)) return true;
  }
  return false;
}

std::vector<v1::WorkerMessage> Outbox::TakeDue() {
  std::vector<v1::WorkerMessage> out;
  for (auto& [ref, e] : entries_) {
    // Captured by value: clang 14 cannot capture a structured binding.
    auto it = std::find_if(
        e.lines.begin(), e.lines.end(),
        [sent = e.sent_seq](const v1::DiaryLine& l) { return l.seq() > sent; });
    while (it != e.lines.end()) {
      v1::WorkerMessage m;
      v1::DiaryBatch* batch = m.mutable_diary();
      ref.To(batch);
      for (int n = 0; n < kBatchLines && it != e.lines.end(); ++n, ++it)
        *batch->add_lines() = *it;
      e.sent_seq = batch->lines(batch->lines_size() - 1).seq();
      out.push_back(std::move(m));
    }
    if (e.progress_due) {
      v1::WorkerMessage m;
      *m.mutable_progress() = *e.progress;
      out.push_back(std::move(m));
      e.progress_due = false;
    }
    if (e.checkpoint_due) {
      v1::WorkerMessage m;
      *m.mutable_checkpoint() = *e.checkpoint;
      out.push_back(std::move(m));
      e.checkpoint_due = false;
    }
    if (e.ended_due) {
      v1::WorkerMessage m;
      *m.mutable_ended() = *e.ended;
      out.push_back(std::move(m));
      e.ended_due = false;
    }
  }
  return out;
}

std::vector<JobRef> Outbox::Held() const {
  std::vector<JobRef> out;
  for (const auto& [ref, e] : entries_) out.push_back(ref);
  return out;
}

size_t Outbox::Unacked(const JobRef& ref) const {
  auto it = entries_.find(ref);
  return it == entries_.end() ? 0 : it->second.lines.size();
}

}  // namespace dlbatch::worker
