#include "scheduler/diary_follow.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

// Lines a job's feed keeps: followers further behind read the store.
constexpr size_t kFeedLines = 8 * kDiaryChunkLines;

// Whether a call that selects `ranks` (sorted; empty: all) sends `line`.
bool Selected(const std::vector<int32_t>& ranks, const v1::DiaryLine& line) {
  if (ranks.empty()) return true;
  return line.has_rank() &&
         std::binary_search(ranks.begin(), ranks.end(), line.rank());
}

}  // namespace

absl::Status CheckDiaryRequest(const v1::ReadDiaryRequest& request) {
  if (request.ranks_size() > kMaxDiaryRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a diary read selects at most ", kMaxDiaryRanks, " ranks, not ",
        request.ranks_size(), "; select fewer, or read every rank's lines"));
  }
  for (int32_t rank : request.ranks()) {
    if (rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank,
                       " is not a rank: a job's ranks are numbered from 0 "
                       "(`dlbatch diary --json` shows each line's)"));
    }
  }
  return absl::OkStatus();
}

struct DiaryFollowHub::Call {
  bool is_wait = false;
  DiaryWriter* writer = nullptr;   // null once detached
  WaitReplier* replier = nullptr;  // null once detached
  std::vector<int64_t> joined;     // the feeds it is in

  // ReadDiary.
  int64_t job = 0;
  bool follow = false;
  int64_t after = 0;           // the last line sent
  int64_t tail = 0;            // > 0: start at the last `tail` lines (once)
  std::vector<int32_t> ranks;  // sorted, unique; empty: every line
  absl::Status invalid;        // the request's fault, reported at once
  bool live = false;           // takes its lines from the job's feed
  bool writing = false;        // a WriteChunk is in flight
  bool final_sent = false;     // the last chunk is in flight
  bool finish_requested = false;
  absl::Status finish_status;

  // WaitJobs.
  std::vector<int64_t> ids;
  std::set<int64_t> pending;  // not seen ended yet
  // Each job as it was when seen ended: the reply uses it if the job has
  // been purged since (a short --keep-ended), instead of "no job".
  std::map<int64_t, v1::Job> ended;
  bool checked = false;     // every id checked once
  int64_t deadline_ms = 0;  // MonotonicMs; 0: none

  bool started = false;
  bool queued = false, running = false, again = false;
  bool cancelled = false;
  bool finished = false;
};

struct DiaryFollowHub::Feed {
  std::set<Handle> members;
  // Lines with n in (base, cursor], once a follower has caught up.
  bool cursor_known = false;
  int64_t base = 0, cursor = 0;
  std::deque<v1::DiaryLine> lines;
  bool ended = false;  // every line is in `lines` or before base
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  bool refresh_queued = false, refreshing = false, refresh_again = false;
};

DiaryFollowHub::DiaryFollowHub(FollowSource* source, const Clock* clock,
                               int threads)
    : source_(source), clock_(clock) {
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([this] { Run(); });
}

DiaryFollowHub::~DiaryFollowHub() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  for (auto& t : threads_) t.join();
}

size_t DiaryFollowHub::open_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

size_t DiaryFollowHub::feeds() const {
  absl::MutexLock lock(&mu_);
  return feeds_.size();
}

DiaryFollowHub::Handle DiaryFollowHub::ReadDiary(
    const v1::ReadDiaryRequest& request, DiaryWriter* writer) {
  auto call = std::make_shared<Call>();
  call->writer = writer;
  call->job = request.job_id();
  call->follow = request.follow();
  call->after = request.after();
  call->tail = request.tail();
  call->ranks.assign(request.ranks().begin(), request.ranks().end());
  std::sort(call->ranks.begin(), call->ranks.end());
  call->ranks.erase(std::unique(call->ranks.begin(), call->ranks.end()),
                    call->ranks.end());
  call->invalid = CheckDiaryRequest(request);
  return call;
}

DiaryFollowHub::Handle DiaryFollowHub::Wait(const v1::WaitJobsRequest& request,
                                            WaitReplier* replier) {
  auto call = std::make_shared<Call>();
  call->is_wait = true;
  call->replier = replier;
  call->ids.assign(request.job_ids().begin(), request.job_ids().end());
  if (request.timeout_ms() > 0)
    call->deadline_ms = clock_->MonotonicMs() + request.timeout_ms();
  return call;
}

void DiaryFollowHub::Start(const Handle& call) {
  absl::MutexLock lock(&mu_);
  if (call->started || call->finished) return;
  call->started = true;
  calls_.insert(call);
  // A follower joins its job's feed at once, so that no change notified
  // while it catches up is missed.
  if (!call->is_wait && call->follow) Join(call, call->job);
  if (call->deadline_ms > 0) {
    deadlines_.emplace(call->deadline_ms, call);
    work_cv_.Signal();
  }
  SchedulePump(call);
}

void DiaryFollowHub::Notify(int64_t job) {
  absl::MutexLock lock(&mu_);
  auto it = feeds_.find(job);
  if (it != feeds_.end()) ScheduleRefresh(job, *it->second);
}

void DiaryFollowHub::Written(const Handle& call, bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    call->writing = false;
    if (call->finish_requested) {
      FinishDiary(call, call->finish_status, &actions);
    } else if (call->final_sent) {
      FinishDiary(call, absl::OkStatus(), &actions);
    } else if (!ok) {
      FinishDiary(call, absl::CancelledError("client left"), &actions);
    } else if (!call->live || HasMore(*call)) {
      SchedulePump(call);
    }  // else a caught-up follower: the feed's next refresh pumps it
  }
  for (auto& a : actions) a();
}

void DiaryFollowHub::Cancel(const Handle& call) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    call->cancelled = true;
    if (call->is_wait) {
      // An unknown job is reported before the client's leaving is.
      if (call->checked) {
        FinishWait(call, absl::CancelledError("client left"), &actions);
      } else {
        SchedulePump(call);
      }
    } else {
      FinishDiary(call, absl::CancelledError("client left"), &actions);
    }
  }
  for (auto& a : actions) a();
}

void DiaryFollowHub::Detach(const Handle& call) {
  absl::MutexLock lock(&mu_);
  call->writer = nullptr;
  call->replier = nullptr;
  call->finished = true;
  LeaveFeeds(call);
  calls_.erase(call);
}

// ---- under mu_ ----

bool DiaryFollowHub::HasMore(const Call& call) const {
  mu_.AssertHeld();
  auto it = feeds_.find(call.job);
  if (it == feeds_.end()) return true;
  const Feed& feed = *it->second;
  return feed.cursor > call.after || feed.ended || call.after < feed.base;
}

void DiaryFollowHub::SchedulePump(const Handle& call) {
  mu_.AssertHeld();
  if (call->finished || !call->started) return;
  if (call->running) {
    call->again = true;
    return;
  }
  if (call->queued) return;
  call->queued = true;
  tasks_.push_back({call, 0});
  work_cv_.Signal();
}

void DiaryFollowHub::ScheduleRefresh(int64_t job, Feed& feed) {
  mu_.AssertHeld();
  if (feed.refreshing) {
    feed.refresh_again = true;
    return;
  }
  if (feed.refresh_queued) return;
  feed.refresh_queued = true;
  tasks_.push_back({nullptr, job});
  work_cv_.Signal();
}

void DiaryFollowHub::Join(const Handle& call, int64_t job) {
  mu_.AssertHeld();
  if (std::find(call->joined.begin(), call->joined.end(), job) !=
      call->joined.end()) {
    return;
  }
  auto& feed = feeds_[job];
  if (!feed) feed = std::make_unique<Feed>();
  feed->members.insert(call);
  call->joined.push_back(job);
}

void DiaryFollowHub::LeaveFeeds(const Handle& call) {
  mu_.AssertHeld();
  for (int64_t job : call->joined) {
    auto it = feeds_.find(job);
    if (it == feeds_.end()) continue;
    it->second->members.erase(call);
    if (it->second->members.empty() && !it->second->refreshing &&
        !it->second->refresh_queued) {
      feeds_.erase(it);
    }
  }
  call->joined.clear();
}

void DiaryFollowHub::StartWrite(const Handle& call, v1::DiaryChunk chunk,
                                Actions* actions) {
  mu_.AssertHeld();
  call->writing = true;
  DiaryWriter* writer = call->writer;
  // Safe after mu_ is released: the writer is not finished while writing.
  actions->push_back([writer, chunk = std::move(chunk)]() mutable {
    writer->WriteChunk(std::move(chunk));
  });
}

void DiaryFollowHub::FinishDiary(const Handle& call, absl::Status status,
                                 Actions* actions) {
  mu_.AssertHeld();
  if (call->finished) return;
  if (call->writing) {
    if (!call->finish_requested) {
      call->finish_requested = true;
      call->finish_status = std::move(status);
    }
    return;
  }
  call->finished = true;
  LeaveFeeds(call);
  calls_.erase(call);
  if (DiaryWriter* writer = call->writer) {
    actions->push_back(
        [writer, status = std::move(status)] { writer->FinishDiary(status); });
  }
}

void DiaryFollowHub::FinishWait(const Handle& call,
                                absl::StatusOr<v1::WaitJobsReply> reply,
                                Actions* actions) {
  mu_.AssertHeld();
  if (call->finished) return;
  call->finished = true;
  LeaveFeeds(call);
  calls_.erase(call);
  if (WaitReplier* replier = call->replier) {
    actions->push_back([replier, reply = std::move(reply)]() mutable {
      replier->FinishWait(std::move(reply));
    });
  }
}

// ---- the pool ----

void DiaryFollowHub::Run() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (tasks_.empty() && !stopping_) {
        if (deadlines_.empty()) {
          work_cv_.Wait(&mu_);
          continue;
        }
        const int64_t now = clock_->MonotonicMs();
        auto first = deadlines_.begin();
        if (first->first <= now) {
          Handle due = first->second;
          deadlines_.erase(first);
          SchedulePump(due);
          continue;
        }
        // Real time is capped so that a moved clock is seen.
        work_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(std::min<int64_t>(
                                           100, first->first - now)));
      }
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    if (task.call) {
      Pump(task.call);
    } else {
      RefreshFeed(task.feed);
    }
  }
}

void DiaryFollowHub::RefreshFeed(int64_t job) {
  absl::MutexLock lock(&mu_);
  auto it = feeds_.find(job);
  if (it == feeds_.end()) return;
  Feed* feed = it->second.get();
  feed->refresh_queued = false;
  if (feed->refreshing) {
    feed->refresh_again = true;
    return;
  }
  feed->refreshing = true;
  for (;;) {
    feed->refresh_again = false;
    const bool read = feed->cursor_known && !feed->ended;
    const int64_t after = feed->cursor;
    absl::StatusOr<FollowSource::DiaryRead> lines;
    if (read) {
      mu_.Unlock();
      lines = source_->ReadDiaryLines(job, after, kDiaryChunkLines, {});
      mu_.Lock();
      if (lines.ok()) {
        for (auto& line : lines->lines) {
          if (line.n() <= feed->cursor) continue;
          feed->cursor = line.n();
          feed->lines.push_back(std::move(line));
        }
        while (feed->lines.size() > kFeedLines) {
          feed->base = feed->lines.front().n();
          feed->lines.pop_front();
        }
        if (static_cast<int>(lines->lines.size()) == kDiaryChunkLines) {
          feed->refresh_again = true;
        } else if (lines->ended) {
          feed->ended = true;
          feed->state = lines->state;
        }
      } else {
        spdlog::warn("diary of job {} for its followers: {}", job,
                     lines.status().ToString());
      }
    }
    for (const Handle& member : feed->members) SchedulePump(member);
    if (!feed->refresh_again) break;
  }
  feed->refreshing = false;
  if (feed->members.empty()) feeds_.erase(job);
}

void DiaryFollowHub::Pump(const Handle& call) {
  {
    absl::MutexLock lock(&mu_);
    call->queued = false;
    if (call->running) {
      call->again = true;
      return;
    }
    call->running = true;
  }
  for (;;) {
    if (call->is_wait) {
      PumpWait(call);
    } else {
      PumpDiary(call);
    }
    absl::MutexLock lock(&mu_);
    if (!call->again || call->finished) {
      call->running = false;
      return;
    }
    call->again = false;
  }
}

void DiaryFollowHub::PumpDiary(const Handle& call) {
  Actions actions;
  int64_t after = 0;
  int64_t tail = 0;
  bool read_store = false;
  {
    absl::MutexLock lock(&mu_);
    if (call->finished || call->writing) return;
    if (!call->invalid.ok()) {
      FinishDiary(call, call->invalid, &actions);
    } else {
      if (call->live && call->after < feeds_.at(call->job)->base) {
        call->live = false;  // fell behind the feed's window
      }
      if (call->live) {
        TakeFromFeed(call, &actions);
      } else {
        read_store = true;
        after = call->after;
        tail = std::exchange(call->tail, 0);
      }
    }
  }
  if (read_store) {
    absl::Status tail_status;
    if (tail > 0) {
      // The lines before the last `tail` are skipped on this side, so that
      // `diary --tail` of a long diary sends only what it shows.
      absl::StatusOr<int64_t> start =
          source_->DiaryTailStart(call->job, tail, call->ranks);
      if (start.ok()) {
        after = std::max(after, *start);
      } else {
        tail_status = start.status();
      }
    }
    auto read = tail_status.ok()
                    ? source_->ReadDiaryLines(call->job, after,
                                              kDiaryChunkLines, call->ranks)
                    : absl::StatusOr<FollowSource::DiaryRead>(tail_status);
    absl::MutexLock lock(&mu_);
    if (call->finished || call->writing) return;
    call->after = std::max(call->after, after);
    if (read.ok()) call->after = std::max(call->after, read->scanned);
    if (!read.ok()) {
      FinishDiary(call, read.status(), &actions);
    } else if (!read->lines.empty()) {
      v1::DiaryChunk chunk;
      for (auto& line : read->lines) *chunk.add_lines() = std::move(line);
      call->after = std::max(call->after, chunk.lines().rbegin()->n());
      StartWrite(call, std::move(chunk), &actions);
    } else if (!call->follow || read->ended) {
      v1::DiaryChunk last;
      last.set_end(read->ended);
      if (read->ended) last.set_state(read->state);
      call->final_sent = true;
      StartWrite(call, std::move(last), &actions);
    } else {
      // Caught up with what is committed: from now on the feed serves it.
      call->live = true;
      Join(call, call->job);
      Feed& feed = *feeds_.at(call->job);
      if (!feed.cursor_known) {
        feed.cursor_known = true;
        feed.base = feed.cursor = call->after;
      }
      ScheduleRefresh(call->job, feed);  // lines committed since the read
    }
  }
  for (auto& a : actions) a();
}

void DiaryFollowHub::TakeFromFeed(const Handle& call, Actions* actions) {
  mu_.AssertHeld();
  const Feed& feed = *feeds_.at(call->job);
  v1::DiaryChunk chunk;
  auto from = std::upper_bound(
      feed.lines.begin(), feed.lines.end(), call->after,
      [](int64_t n, const v1::DiaryLine& line) { return n < line.n(); });
  // Lines of ranks it does not select are passed over: the cursor goes on
  // past them, so that a caught-up follower is one whatever it selects.
  for (; from != feed.lines.end() && chunk.lines_size() < kDiaryChunkLines;
       ++from) {
    call->after = from->n();
    if (Selected(call->ranks, *from)) *chunk.add_lines() = *from;
  }
  if (chunk.lines_size() > 0) {
    StartWrite(call, std::move(chunk), actions);
  } else if (feed.ended && call->after >= feed.cursor) {
    chunk.set_end(true);
    chunk.set_state(feed.state);
    call->final_sent = true;
    StartWrite(call, std::move(chunk), actions);
  }
  // else caught up: the feed's next refresh pumps it
}

void DiaryFollowHub::PumpWait(const Handle& call) {
  Actions actions;
  std::vector<int64_t> check;
  bool first = false, due = false;
  {
    absl::MutexLock lock(&mu_);
    if (call->finished) return;
    first = !call->checked;
    if (first) {
      // Joined before the check, so that an end right after it is notified.
      for (int64_t id : call->ids) Join(call, id);
      check = call->ids;
    } else {
      check.assign(call->pending.begin(), call->pending.end());
    }
    due = call->deadline_ms > 0 && clock_->MonotonicMs() >= call->deadline_ms;
  }
  std::vector<int64_t> running;
  std::map<int64_t, v1::Job> seen_ended;
  for (int64_t id : check) {
    auto ended = source_->JobEnded(id);
    if (!ended.ok()) {
      absl::MutexLock lock(&mu_);
      FinishWait(call, ended.status(), &actions);
      break;
    }
    if (!*ended) {
      running.push_back(id);
    } else if (auto job = source_->JobForWait(id); job.ok()) {
      seen_ended[id] = *std::move(job);
    }
  }
  if (actions.empty()) {
    bool reply = false;
    {
      absl::MutexLock lock(&mu_);
      if (call->finished) return;
      call->checked = true;
      call->pending = std::set<int64_t>(running.begin(), running.end());
      call->ended.merge(seen_ended);
      if (call->cancelled) {
        FinishWait(call, absl::CancelledError("client left"), &actions);
      } else {
        reply = call->pending.empty() || due;
      }
    }
    if (reply) {
      absl::Status error;
      v1::WaitJobsReply jobs = WaitReplyJobs(call, !running.empty(), &error);
      absl::MutexLock lock(&mu_);
      if (error.ok()) {
        FinishWait(call, std::move(jobs), &actions);
      } else {
        FinishWait(call, error, &actions);
      }
    }
  }
  for (auto& a : actions) a();
}

v1::WaitJobsReply DiaryFollowHub::WaitReplyJobs(const Handle& call,
                                                bool timed_out,
                                                absl::Status* error) {
  v1::WaitJobsReply reply;
  reply.set_timed_out(timed_out);
  std::map<int64_t, v1::Job> ended;
  {
    absl::MutexLock lock(&mu_);
    ended = call->ended;
  }
  for (int64_t id : call->ids) {
    auto job = source_->JobForWait(id);
    if (absl::IsNotFound(job.status())) {
      if (auto it = ended.find(id); it != ended.end()) job = it->second;
    }
    if (!job.ok()) {
      *error = job.status();
      return reply;
    }
    *reply.add_jobs() = *std::move(job);
  }
  return reply;
}

// ---- blocking forms ----

namespace {

class BlockingDiary final : public DiaryWriter {
 public:
  void WriteChunk(v1::DiaryChunk chunk) override {
    absl::MutexLock lock(&mu_);
    chunks_.push_back(std::move(chunk));
  }
  void FinishDiary(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
    status_ = std::move(status);
  }
  // The next chunk, or nullopt once finished (status()) or after a while.
  enum class Next { kChunk, kDone, kIdle };
  Next Take(v1::DiaryChunk* chunk) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !chunks_.empty() || done_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
    if (!chunks_.empty()) {
      *chunk = std::move(chunks_.front());
      chunks_.pop_front();
      return Next::kChunk;
    }
    return done_ ? Next::kDone : Next::kIdle;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::DiaryChunk> chunks_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class BlockingWait final : public WaitReplier {
 public:
  void FinishWait(absl::StatusOr<v1::WaitJobsReply> reply) override {
    absl::MutexLock lock(&mu_);
    reply_ = std::move(reply);
  }
  std::optional<absl::StatusOr<v1::WaitJobsReply>> Take() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return reply_.has_value();
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
    return reply_;
  }

 private:
  absl::Mutex mu_;
  std::optional<absl::StatusOr<v1::WaitJobsReply>> reply_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ReadDiaryBlocking(
    DiaryFollowHub& hub, const v1::ReadDiaryRequest& request,
    const std::function<bool(const v1::DiaryChunk&)>& send,
    const std::function<bool()>& gone) {
  BlockingDiary writer;
  auto call = hub.ReadDiary(request, &writer);
  hub.Start(call);
  bool cancelled = false;
  for (;;) {
    v1::DiaryChunk chunk;
    auto next = writer.Take(&chunk);
    if (next == BlockingDiary::Next::kDone) break;
    if (next == BlockingDiary::Next::kChunk) {
      hub.Written(call, send(chunk));
    } else if (!cancelled && gone()) {
      cancelled = true;
      hub.Cancel(call);
    }
  }
  hub.Detach(call);
  return writer.status();
}

absl::StatusOr<v1::WaitJobsReply> WaitBlocking(
    DiaryFollowHub& hub, const v1::WaitJobsRequest& request,
    const std::function<bool()>& gone) {
  BlockingWait replier;
  auto call = hub.Wait(request, &replier);
  hub.Start(call);
  for (;;) {
    if (auto reply = replier.Take()) {
      hub.Detach(call);
      return *std::move(reply);
    }
    if (gone()) hub.Cancel(call);
  }
}

}  // namespace dlbatch::scheduler
