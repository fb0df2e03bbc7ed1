// The followers' hub with a fake store: what each follower is sent, and
// what a change of one job costs the followers of another.
#include "scheduler/diary_follow.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::scheduler {
namespace {

// Jobs and their diaries in memory; counts its reads.
class FakeSource final : public FollowSource {
 public:
  void AddJob(int64_t job) {
    absl::MutexLock lock(&mu_);
    jobs_[job];
  }
  // rank < 0: a line of dlbatch's own, of no rank.
  void AddLine(int64_t job, const std::string& text, int rank = 0) {
    absl::MutexLock lock(&mu_);
    v1::DiaryLine line;
    line.set_n(++next_n_);
    line.set_text(text);
    if (rank >= 0) line.set_rank(rank);
    jobs_[job].lines.push_back(line);
  }
  void End(int64_t job) {
    absl::MutexLock lock(&mu_);
    jobs_[job].ended = true;
  }
  int reads(int64_t job) {
    absl::MutexLock lock(&mu_);
    return jobs_[job].reads;
  }

  // As the store reads: lines of other ranks are passed over (`scanned`
  // goes on past them).
  absl::StatusOr<DiaryRead> ReadDiaryLines(
      int64_t job, int64_t after, int limit,
      const std::vector<int32_t>& ranks) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return absl::NotFoundError("no job");
    ++it->second.reads;
    DiaryRead read;
    read.scanned = after;
    read.ended = it->second.ended;
    if (read.ended) read.state = v1::JOB_STATE_FINISHED;
    for (const auto& line : it->second.lines) {
      if (line.n() <= after) continue;
      if (static_cast<int>(read.lines.size()) >= limit) break;
      read.scanned = line.n();
      if (Of(ranks, line)) read.lines.push_back(line);
    }
    return read;
  }
  absl::StatusOr<int64_t> DiaryTailStart(
      int64_t job, int64_t tail, const std::vector<int32_t>& ranks) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return absl::NotFoundError("no job");
    std::vector<int64_t> ns;
    for (const auto& line : it->second.lines) {
      if (Of(ranks, line)) ns.push_back(line.n());
    }
    if (static_cast<int64_t>(ns.size()) <= tail) return 0;
    return ns[ns.size() - tail - 1];
  }
  absl::StatusOr<bool> JobEnded(int64_t job) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end())
      return absl::NotFoundError(absl::StrCat("no job ", job));
    return it->second.ended;
  }
  absl::StatusOr<v1::Job> JobForWait(int64_t job) override {
    v1::Job j;
    j.set_id(job);
    return j;
  }

 private:
  struct Job {
    std::vector<v1::DiaryLine> lines;
    bool ended = false;
    int reads = 0;
  };
  static bool Of(const std::vector<int32_t>& ranks, const v1::DiaryLine& line) {
    if (ranks.empty()) return true;
    return line.has_rank() &&
           std::find(ranks.begin(), ranks.end(), line.rank()) != ranks.end();
  }

  absl::Mutex mu_;
  std::map<int64_t, Job> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_n_ ABSL_GUARDED_BY(mu_) = 0;
};

// A ReadDiary call's writer that completes each write at once.
class Recorder final : public DiaryWriter {
 public:
  void Bind(DiaryFollowHub* hub, DiaryFollowHub::Handle call) {
    hub_ = hub;
    call_ = std::move(call);
  }
  void WriteChunk(v1::DiaryChunk chunk) override {
    {
      absl::MutexLock lock(&mu_);
      chunks_.push_back(chunk);
      if (stalled_) {
        held_ = true;  // completes on Release()
        return;
      }
    }
    hub_->Written(call_, true);
  }
  // Writes stay in flight until Release(), as on a slow connection.
  void Stall() {
    absl::MutexLock lock(&mu_);
    stalled_ = true;
  }
  void Release() {
    bool held;
    {
      absl::MutexLock lock(&mu_);
      stalled_ = false;
      held = held_;
      held_ = false;
    }
    if (held) hub_->Written(call_, true);
  }
  void FinishDiary(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    status_ = status;
  }
  std::vector<std::string> Texts() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> texts;
    for (const auto& c : chunks_) {
      for (const auto& l : c.lines()) texts.push_back(l.text());
    }
    return texts;
  }
  bool finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  v1::DiaryChunk last() {
    absl::MutexLock lock(&mu_);
    return chunks_.empty() ? v1::DiaryChunk() : chunks_.back();
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  DiaryFollowHub* hub_ = nullptr;
  DiaryFollowHub::Handle call_;
  absl::Mutex mu_;
  std::vector<v1::DiaryChunk> chunks_;
  bool finished_ = false;
  absl::Status status_;
  bool stalled_ = false, held_ = false;
};

bool WaitUntil(const std::function<bool()>& ready) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!ready()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

class DiaryFollowTest : public ::testing::Test {
 protected:
  // Starts a follower of `job` from the start.
  std::unique_ptr<Recorder> Follow(int64_t job, bool follow = true,
                                   int64_t tail = 0,
                                   const std::vector<int32_t>& ranks = {}) {
    auto rec = std::make_unique<Recorder>();
    v1::ReadDiaryRequest request;
    request.set_job_id(job);
    request.set_follow(follow);
    request.set_tail(tail);
    for (int32_t rank : ranks) request.add_ranks(rank);
    auto call = hub_.ReadDiary(request, rec.get());
    rec->Bind(&hub_, call);
    calls_.push_back(call);
    hub_.Start(call);
    return rec;
  }
  bool Has(Recorder& rec, size_t lines) {
    return WaitUntil([&] { return rec.Texts().size() >= lines; });
  }
  void TearDown() override {
    for (auto& call : calls_) hub_.Detach(call);
  }

  FakeSource source_;
  FakeClock clock_;
  DiaryFollowHub hub_{&source_, &clock_};
  std::vector<DiaryFollowHub::Handle> calls_;
};

TEST_F(DiaryFollowTest, FollowerGetsBacklogThenLiveLinesThenTheEnd) {
  source_.AddJob(1);
  source_.AddLine(1, "one");
  auto rec = Follow(1);
  ASSERT_TRUE(Has(*rec, 1));
  source_.AddLine(1, "two");
  source_.AddLine(1, "three");
  hub_.Notify(1);
  ASSERT_TRUE(Has(*rec, 3));
  EXPECT_EQ(rec->Texts(), (std::vector<std::string>{"one", "two", "three"}));
  source_.End(1);
  hub_.Notify(1);
  ASSERT_TRUE(WaitUntil([&] { return rec->finished(); }));
  EXPECT_TRUE(rec->status().ok()) << rec->status();
  EXPECT_TRUE(rec->last().end());
  EXPECT_EQ(rec->last().state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(rec->last().lines_size(), 0);
}

TEST_F(DiaryFollowTest, WithoutFollowEndsAfterWhatIsThereSayingTheJobRuns) {
  source_.AddJob(1);
  source_.AddLine(1, "one");
  auto rec = Follow(1, /*follow=*/false);
  ASSERT_TRUE(WaitUntil([&] { return rec->finished(); }));
  EXPECT_EQ(rec->Texts(), std::vector<std::string>{"one"});
  EXPECT_FALSE(rec->last().end());
}

TEST_F(DiaryFollowTest, TailSendsOnlyTheLastLinesThenFollows) {
  source_.AddJob(1);
  for (int i = 1; i <= 2500; ++i) source_.AddLine(1, absl::StrCat("l", i));
  auto rec = Follow(1, /*follow=*/true, /*tail=*/3);
  ASSERT_TRUE(Has(*rec, 3));
  source_.AddLine(1, "l2501");
  hub_.Notify(1);
  ASSERT_TRUE(Has(*rec, 4));
  // Nothing before the last three was sent, in one read of the store.
  EXPECT_EQ(rec->Texts(),
            (std::vector<std::string>{"l2498", "l2499", "l2500", "l2501"}));

  auto all = Follow(1, /*follow=*/false, /*tail=*/10000);  // more than there
  ASSERT_TRUE(WaitUntil([&] { return all->finished(); }));
  EXPECT_EQ(all->Texts().size(), 2501u);
  EXPECT_EQ(all->Texts().front(), "l1");
}

TEST_F(DiaryFollowTest, TailOfAnUnknownJobIsNotFound) {
  auto rec = Follow(99, /*follow=*/false, /*tail=*/5);
  ASSERT_TRUE(WaitUntil([&] { return rec->finished(); }));
  EXPECT_EQ(rec->status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DiaryFollowTest, UnknownJobIsNotFound) {
  auto rec = Follow(99);
  ASSERT_TRUE(WaitUntil([&] { return rec->finished(); }));
  EXPECT_EQ(rec->status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DiaryFollowTest, ManyFollowersOfAJobShareOneReadPerChange) {
  source_.AddJob(1);
  std::vector<std::unique_ptr<Recorder>> recs;
  for (int i = 0; i < 50; ++i) recs.push_back(Follow(1));
  source_.AddLine(1, "first");
  hub_.Notify(1);
  for (auto& r : recs) ASSERT_TRUE(Has(*r, 1));
  // A follower that read "first" from the store joins the feed only after
  // one more, empty, store read, and its joining schedules a refresh: let
  // those settle (no read for 100 ms) before counting.
  int before = source_.reads(1);
  absl::Time quiet_since = absl::Now();
  ASSERT_TRUE(WaitUntil([&] {
    const int now = source_.reads(1);
    if (now != before) {
      before = now;
      quiet_since = absl::Now();
    }
    return absl::Now() - quiet_since >= absl::Milliseconds(100);
  }));
  for (int k = 0; k < 10; ++k) {
    source_.AddLine(1, absl::StrCat("line ", k));
    hub_.Notify(1);
    for (auto& r : recs) ASSERT_TRUE(Has(*r, 2 + static_cast<size_t>(k)));
  }
  // One read of the job's feed per change (fewer when changes coalesce),
  // not one per follower (500). Where load kept a follower's joining
  // reads (above) from settling within the quiet spell, each may add two.
  EXPECT_LE(source_.reads(1) - before, 10 + 2 * static_cast<int>(recs.size()));
}

TEST_F(DiaryFollowTest, AFollowerBehindTheFeedCatchesUpFromTheStoreInOrder) {
  source_.AddJob(1);
  auto slow = Follow(1);
  auto fast = Follow(1);
  source_.AddLine(1, "line 0");
  hub_.Notify(1);
  ASSERT_TRUE(Has(*slow, 1));
  ASSERT_TRUE(Has(*fast, 1));
  slow->Stall();
  source_.AddLine(1, "line 1");
  hub_.Notify(1);
  ASSERT_TRUE(Has(*slow, 2));  // its write of line 1 is now in flight
  // More lines than the feed keeps, in bursts the fast follower drains.
  std::vector<std::string> expected = {"line 0", "line 1"};
  for (int k = 2; k < 20000; ++k) {
    source_.AddLine(1, absl::StrCat("line ", k));
    expected.push_back(absl::StrCat("line ", k));
    if (k % 500 == 0) hub_.Notify(1);
  }
  hub_.Notify(1);
  ASSERT_TRUE(Has(*fast, expected.size()));
  slow->Release();
  ASSERT_TRUE(Has(*slow, expected.size()));
  EXPECT_EQ(slow->Texts(), expected);
  EXPECT_EQ(fast->Texts(), expected);
  source_.End(1);
  hub_.Notify(1);
  ASSERT_TRUE(WaitUntil([&] { return slow->finished() && fast->finished(); }));
  EXPECT_TRUE(slow->last().end());
}

TEST_F(DiaryFollowTest, ARankFollowerGetsOnlyItsRanksLinesFromStoreAndFeed) {
  source_.AddJob(1);
  source_.AddLine(1, "0 early", 0);
  source_.AddLine(1, "1 early", 1);
  source_.AddLine(1, "[dlbatch] started", -1);
  auto one = Follow(1, /*follow=*/true, /*tail=*/0, {1});
  auto all = Follow(1);  // shares the feed with it
  ASSERT_TRUE(Has(*one, 1));
  ASSERT_TRUE(Has(*all, 3));
  for (int k = 0; k < 5; ++k) {
    source_.AddLine(1, absl::StrCat("0 line ", k), 0);
    source_.AddLine(1, absl::StrCat("1 line ", k), 1);
    hub_.Notify(1);
  }
  ASSERT_TRUE(Has(*one, 6));
  ASSERT_TRUE(Has(*all, 13));
  source_.AddLine(1, "0 last", 0);  // the job's last line is another rank's
  source_.End(1);
  hub_.Notify(1);
  ASSERT_TRUE(WaitUntil([&] { return one->finished() && all->finished(); }));
  EXPECT_TRUE(one->status().ok()) << one->status();
  EXPECT_TRUE(one->last().end());
  EXPECT_EQ(one->Texts(),
            (std::vector<std::string>{"1 early", "1 line 0", "1 line 1",
                                      "1 line 2", "1 line 3", "1 line 4"}));
  EXPECT_EQ(all->Texts().size(), 14u);
}

TEST_F(DiaryFollowTest, ARankThatWroteNothingEndsWithTheJobAfterFewReads) {
  source_.AddJob(1);
  for (int i = 0; i < 2500; ++i) source_.AddLine(1, "rank 0", 0);
  auto none = Follow(1, /*follow=*/true, /*tail=*/0, {3});
  // Caught up past the other rank's lines, it waits on the feed instead of
  // reading the store again and again.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_LE(source_.reads(1), 5);
  source_.End(1);
  hub_.Notify(1);
  ASSERT_TRUE(WaitUntil([&] { return none->finished(); }));
  EXPECT_TRUE(none->status().ok()) << none->status();
  EXPECT_TRUE(none->Texts().empty());
  EXPECT_TRUE(none->last().end());
  EXPECT_LE(source_.reads(1), 8);
}

TEST_F(DiaryFollowTest, TailCountsOnlyTheSelectedRanksLines) {
  source_.AddJob(1);
  for (int i = 1; i <= 5; ++i) {
    source_.AddLine(1, absl::StrCat("0:", i), 0);
    source_.AddLine(1, absl::StrCat("1:", i), 1);
    source_.AddLine(1, absl::StrCat("2:", i), 2);
  }
  auto rec = Follow(1, /*follow=*/false, /*tail=*/2, {2, 0});
  ASSERT_TRUE(WaitUntil([&] { return rec->finished(); }));
  EXPECT_EQ(rec->Texts(), (std::vector<std::string>{"0:5", "2:5"}));
}

TEST_F(DiaryFollowTest, ANegativeOrHugeRankListIsRefusedSayingWhy) {
  source_.AddJob(1);
  auto bad = Follow(1, /*follow=*/true, /*tail=*/0, {0, -2});
  ASSERT_TRUE(WaitUntil([&] { return bad->finished(); }));
  EXPECT_EQ(bad->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad->status().message().find("rank -2 is not a rank"),
            std::string::npos)
      << bad->status();
  std::vector<int32_t> many(kMaxDiaryRanks + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int32_t>(i);
  auto huge = Follow(1, /*follow=*/false, /*tail=*/0, many);
  ASSERT_TRUE(WaitUntil([&] { return huge->finished(); }));
  EXPECT_EQ(huge->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge->status().message().find("at most 1024 ranks"),
            std::string::npos)
      << huge->status();
  EXPECT_EQ(source_.reads(1), 0);
}

TEST_F(DiaryFollowTest, ChangesOfAnotherJobCostItsFollowersNothing) {
  source_.AddJob(1);
  source_.AddJob(2);
  auto rec = Follow(1);
  source_.AddLine(1, "caught up");
  hub_.Notify(1);
  ASSERT_TRUE(Has(*rec, 1));
  const int before = source_.reads(1);
  for (int k = 0; k < 100; ++k) {
    source_.AddLine(2, "busy");
    hub_.Notify(2);
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(source_.reads(1), before);
  EXPECT_EQ(source_.reads(2), 0);
  EXPECT_EQ(hub_.feeds(), 1u);
}

}  // namespace
}  // namespace dlbatch::scheduler
