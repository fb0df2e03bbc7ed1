// The diary's part and rank columns: stored with each line, read back,
// selected by rank (paging past other ranks' lines), and filled in for the
// lines of a file made before ranks were kept.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/store/store.h"
#include "scheduler/store/store_reader.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class DiaryRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "diary_ranks_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/state.db";
    ASSERT_NO_FATAL_FAILURE(Reopen());
    reader_ = std::make_unique<StoreReader>(path_);
    JobRecord job;
    job.user = "ada";
    job.spec.set_name("ranks");
    job.spec.set_profile("local");
    job.spec.mutable_command()->add_argv("true");
    job.submit_ms = 1'000;
    auto id = store_->InsertJob(job);
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
  }
  void TearDown() override {
    reader_.reset();
    store_.reset();
    EXPECT_TRUE(RemoveTree(dir_).ok());
  }
  void Reopen() {
    store_.reset();
    auto store = Store::Open(path_, /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  // A line of process `rank` of `part` (rank < 0: dlbatch's own, seq -1).
  void Add(int part, int rank, int64_t seq, const std::string& text) {
    std::optional<int> r;
    if (rank >= 0) r = rank;
    auto added = store_->AddDiary(job_, 1, part, rank < 0 ? -1 : seq, 10,
                                  rank < 0 ? 0 : 1, text,
                                  v1::DiaryLine::ENDING_NEWLINE, r);
    ASSERT_TRUE(added.ok()) << added.status();
  }
  std::vector<std::string> Texts(const std::vector<v1::DiaryLine>& lines) {
    std::vector<std::string> out;
    for (const auto& line : lines) out.push_back(line.text());
    return out;
  }

  std::string dir_, path_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  int64_t job_ = 0;
};

TEST_F(DiaryRanksTest, EachLineComesBackWithItsPartAndRank) {
  ASSERT_NO_FATAL_FAILURE(Add(0, 0, 1, "zero"));
  ASSERT_NO_FATAL_FAILURE(Add(1, 3, 1, "three"));  // same seq, other part
  ASSERT_NO_FATAL_FAILURE(Add(1, -1, 0, "[dlbatch] part 1 started"));
  auto lines = reader_->ReadDiary(job_, 0, 10);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 3u);
  EXPECT_EQ((*lines)[0].part(), 0);
  EXPECT_TRUE((*lines)[0].has_rank());
  EXPECT_EQ((*lines)[0].rank(), 0);
  EXPECT_EQ((*lines)[1].part(), 1);
  EXPECT_EQ((*lines)[1].rank(), 3);
  EXPECT_EQ((*lines)[1].seq(), 1);
  EXPECT_EQ((*lines)[2].part(), 1);
  EXPECT_FALSE((*lines)[2].has_rank());  // dlbatch's own: no rank
}

TEST_F(DiaryRanksTest, RanksSelectTheirLinesInOrderAndPagePastTheOthers) {
  for (int i = 0; i < 6; ++i) {
    ASSERT_NO_FATAL_FAILURE(Add(0, 0, i, absl::StrCat("0:", i)));
    ASSERT_NO_FATAL_FAILURE(Add(1, 1, i, absl::StrCat("1:", i)));
    ASSERT_NO_FATAL_FAILURE(Add(2, 2, i, absl::StrCat("2:", i)));
  }
  ASSERT_NO_FATAL_FAILURE(Add(0, -1, 0, "[dlbatch] the end"));
  auto all = reader_->ReadDiary(job_, 0, 100);
  ASSERT_TRUE(all.ok());
  const int64_t newest = all->back().n();

  std::vector<std::string> seen;
  int64_t after = 0;
  int pages = 0;
  for (;;) {
    int64_t scanned = -1;
    auto page = reader_->ReadDiary(job_, after, 4, {2, 0}, &scanned);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_GE(scanned, after);
    if (page->empty()) {
      // Nothing of ranks 0 and 2 is left: the cursor is at the job's newest
      // line (another rank's), so a follower does not read it all again.
      EXPECT_EQ(scanned, newest);
      break;
    }
    ++pages;
    for (const auto& line : *page) {
      EXPECT_TRUE(line.rank() == 0 || line.rank() == 2) << line.text();
      seen.push_back(line.text());
    }
    EXPECT_GE(scanned, page->back().n());
    after = scanned;
  }
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(seen, ElementsAre("0:0", "2:0", "0:1", "2:1", "0:2", "2:2", "0:3",
                                "2:3", "0:4", "2:4", "0:5", "2:5"));
  // Without ranks the cursor is the last line read.
  int64_t scanned = -1;
  auto first = reader_->ReadDiary(job_, 0, 2, {}, &scanned);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(scanned, first->back().n());
  // A rank that wrote nothing: no line, the cursor past every line.
  auto none = reader_->ReadDiary(job_, 0, 100, {7}, &scanned);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(*none, IsEmpty());
  EXPECT_EQ(scanned, newest);
  // And past the end, nothing moves.
  EXPECT_THAT(reader_->ReadDiary(job_, newest, 100, {1}, &scanned).value(),
              IsEmpty());
  EXPECT_EQ(scanned, newest);
}

TEST_F(DiaryRanksTest, TailStartCountsOnlyTheSelectedRanks) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_NO_FATAL_FAILURE(Add(0, 0, i, absl::StrCat("0:", i)));
    ASSERT_NO_FATAL_FAILURE(Add(1, 1, i, absl::StrCat("1:", i)));
  }
  auto start = reader_->DiaryTailStart(job_, 2, {1});
  ASSERT_TRUE(start.ok()) << start.status();
  auto last = reader_->ReadDiary(job_, *start, 100, {1});
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(Texts(*last), ElementsAre("1:3", "1:4"));
  EXPECT_EQ(reader_->DiaryTailStart(job_, 5, {1}).value(), 0);
  EXPECT_EQ(reader_->DiaryTailStart(job_, 1, {4}).value(), 0);
}

TEST_F(DiaryRanksTest, OpensAVersion11FileAndGivesItsLinesTheirPartAsRank) {
  ASSERT_NO_FATAL_FAILURE(Add(0, 0, 1, "part 0"));
  ASSERT_NO_FATAL_FAILURE(Add(1, 1, 1, "part 1"));
  ASSERT_NO_FATAL_FAILURE(Add(1, -1, 0, "[dlbatch] of part 1"));
  // What a version 11 scheduler left: no rank column (nor its index).
  absl::Status undone = store_->db()->Exec(
      "DROP INDEX diary_by_rank; ALTER TABLE diary DROP COLUMN rank; "
      "UPDATE meta SET value='11' WHERE key='schema'");
  ASSERT_TRUE(undone.ok()) << undone;
  ASSERT_NO_FATAL_FAILURE(Reopen());
  auto version =
      store_->db()->Prepare("SELECT value FROM meta WHERE key='schema'");
  ASSERT_TRUE(version.ok());
  ASSERT_TRUE((*version)->Step().value());
  EXPECT_EQ((*version)->Text(0), "15");
  (*version)->Reset();

  ASSERT_NO_FATAL_FAILURE(Add(1, 5, 2, "new, rank 5"));
  auto lines = reader_->ReadDiary(job_, 0, 10);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 4u);
  EXPECT_EQ((*lines)[0].rank(), 0);
  EXPECT_EQ((*lines)[1].rank(), 1);
  EXPECT_EQ((*lines)[1].part(), 1);
  EXPECT_FALSE((*lines)[2].has_rank());
  EXPECT_EQ((*lines)[3].rank(), 5);
  EXPECT_THAT(Texts(reader_->ReadDiary(job_, 0, 10, {1}).value()),
              ElementsAre("part 1"));
  ASSERT_NO_FATAL_FAILURE(Reopen());  // current now: opened as it is
  EXPECT_EQ(reader_->ReadDiary(job_, 0, 10).value().size(), 4u);
}

}  // namespace
}  // namespace dlbatch::scheduler
