// Serves `dlbatch diary` (ReadDiary) and `dlbatch wait` (WaitJobs) without
// a thread per caller: each call is a callback reactor that this hub feeds
// from a per-job feed.
//
// The scheduler calls Notify(job) after every committed change of a job
// (under its lock; Notify only marks and queues). A job nobody follows costs
// a hash lookup. For a followed job one pool thread reads the new lines from
// the store once into the job's feed, a window of its latest lines, and
// every follower that is caught up takes its next chunk from there; a
// follower behind the window (a new one reading from the start, or one too
// slow to keep up) reads the store itself until it catches up. Store reads
// and chunk building run on the hub's few pool threads, never on gRPC's and
// never under the hub's lock; a write is started only when the previous one
// of that call has completed.
//
// The reply semantics are ReadDiary's and WaitJobs' (scheduler.proto):
// chunks of at most kDiaryChunkLines lines, then one chunk without lines
// whose `end` says whether the job has ended (with its final state); with
// follow, that last chunk comes once the job has ended and every line has
// been sent. WaitJobs replies with every job once all have ended or the
// timeout passes (timed_out), NotFound for an unknown job. A ReadDiary with
// `ranks` sends only those ranks' lines, chunk by chunk as without; its
// cursor goes on past the other ranks' lines it passed over.
#ifndef DLBATCH_SCHEDULER_DIARY_FOLLOW_H_
#define DLBATCH_SCHEDULER_DIARY_FOLLOW_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::scheduler {

constexpr int kDiaryChunkLines = 1000;
// The most ranks one ReadDiary may select (ReadDiaryRequest.ranks).
constexpr int kMaxDiaryRanks = 1024;

// InvalidArgument, saying what to change, for a ReadDiary whose `ranks`
// name a negative rank or more than kMaxDiaryRanks; OK otherwise.
absl::Status CheckDiaryRequest(const v1::ReadDiaryRequest& request);

// What the hub reads; implemented by the Scheduler. Thread-safe; may block
// on the store. REQUIRES: not called with the hub's lock held.
class FollowSource {
 public:
  struct DiaryRead {
    std::vector<v1::DiaryLine> lines;  // committed, after `after`, ascending n
    // The n up to which lines were looked at (>= the last line's): with
    // `ranks`, lines of other ranks after the last one returned were
    // passed over, up to the job's newest where fewer than `limit` came.
    int64_t scanned = 0;
    bool ended = false;  // the job had ended before the lines were read, so
                         // with fewer than `limit` lines none follows
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // set when ended
  };
  virtual ~FollowSource() = default;
  // At most `limit` lines after `after`; `ranks` non-empty: only lines of
  // those ranks (DiaryLine.rank). NotFound for an unknown job.
  virtual absl::StatusOr<DiaryRead> ReadDiaryLines(
      int64_t job, int64_t after, int limit,
      const std::vector<int32_t>& ranks) = 0;
  // The `n` after which the job's last `tail` lines (of `ranks`, where
  // non-empty) begin (0 where it has no more than `tail`); NotFound for an
  // unknown job.
  virtual absl::StatusOr<int64_t> DiaryTailStart(
      int64_t job, int64_t tail, const std::vector<int32_t>& ranks) = 0;
  // Whether the job has ended; NotFound for an unknown job.
  virtual absl::StatusOr<bool> JobEnded(int64_t job) = 0;
  virtual absl::StatusOr<v1::Job> JobForWait(int64_t job) = 0;
};

// The sending end of one ReadDiary call. The hub serialises the calls: at
// most one WriteChunk in flight, Finish only while none is, nothing after.
class DiaryWriter {
 public:
  virtual ~DiaryWriter() = default;
  // Starts a write; must not block. The writer then calls
  // DiaryFollowHub::Written(handle, ok) once it completes.
  virtual void WriteChunk(v1::DiaryChunk chunk) = 0;
  virtual void FinishDiary(absl::Status status) = 0;
};

// The replying end of one WaitJobs call; called once, must not block.
class WaitReplier {
 public:
  virtual ~WaitReplier() = default;
  virtual void FinishWait(absl::StatusOr<v1::WaitJobsReply> reply) = 0;
};

class DiaryFollowHub {
 public:
  struct Call;  // one ReadDiary or WaitJobs
  using Handle = std::shared_ptr<Call>;

  // `source` and `clock` are borrowed; `threads` pool threads.
  DiaryFollowHub(FollowSource* source, const Clock* clock, int threads = 2);
  ~DiaryFollowHub();  // ends every call still open (Unavailable)
  DiaryFollowHub(const DiaryFollowHub&) = delete;
  DiaryFollowHub& operator=(const DiaryFollowHub&) = delete;

  // ---- the reactors; any thread, never blocking ----
  // A call, not yet started: keep the handle, then Start() it. `writer` and
  // `replier` are borrowed until Detach().
  Handle ReadDiary(const v1::ReadDiaryRequest& request, DiaryWriter* writer);
  Handle Wait(const v1::WaitJobsRequest& request, WaitReplier* replier);
  void Start(const Handle& call);
  // A chunk write completed; !ok: the client is gone.
  void Written(const Handle& call, bool ok);
  // The client left: the call is finished (Cancelled) as soon as it can be.
  void Cancel(const Handle& call);
  // The reactor is done: nothing more is called on its writer or replier.
  void Detach(const Handle& call);

  // ---- the scheduler, under its lock: a change of `job` is committed ----
  void Notify(int64_t job);

  // Calls and job feeds open now (tests and the bench).
  size_t open_calls() const;
  size_t feeds() const;

 private:
  struct Feed;
  struct Task {
    Handle call;       // pump this call
    int64_t feed = 0;  // or refresh this job's feed
  };

  void Run();
  void RefreshFeed(int64_t job);
  void Pump(const Handle& call);
  void PumpDiary(const Handle& call);
  void PumpWait(const Handle& call);
  // What to call on a writer or replier once mu_ is released.
  using Actions = std::vector<std::function<void()>>;
  // A live follower's next chunk from its job's feed (or its last one), if
  // the feed has it.
  void TakeFromFeed(const Handle& call, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a pump unless one is queued or running (then it runs again).
  void SchedulePump(const Handle& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a live follower has lines (or the end) to take from its feed.
  bool HasMore(const Call& call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleRefresh(int64_t job, Feed& feed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Join(const Handle& call, int64_t job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveFeeds(const Handle& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWrite(const Handle& call, v1::DiaryChunk chunk, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call now if no write is in flight, else once it completes.
  void FinishDiary(const Handle& call, absl::Status status, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishWait(const Handle& call, absl::StatusOr<v1::WaitJobsReply> reply,
                  Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::WaitJobsReply WaitReplyJobs(const Handle& call, bool timed_out,
                                  absl::Status* error) ABSL_LOCKS_EXCLUDED(mu_);

  FollowSource* const source_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<int64_t, std::unique_ptr<Feed>> feeds_
      ABSL_GUARDED_BY(mu_);
  std::set<Handle> calls_ ABSL_GUARDED_BY(mu_);
  // WaitJobs deadlines (MonotonicMs), earliest first.
  std::multimap<int64_t, Handle> deadlines_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// The blocking forms, for in-process callers and tests: run one call on the
// calling thread until it ends. `send` false: the client left; `gone`
// (polled) true: likewise.
absl::Status ReadDiaryBlocking(
    DiaryFollowHub& hub, const v1::ReadDiaryRequest& request,
    const std::function<bool(const v1::DiaryChunk&)>& send,
    const std::function<bool()>& gone);
absl::StatusOr<v1::WaitJobsReply> WaitBlocking(
    DiaryFollowHub& hub, const v1::WaitJobsRequest& request,
    const std::function<bool()>& gone);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_DIARY_FOLLOW_H_
