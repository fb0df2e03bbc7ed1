// The web face's hot reads on a real store file: a page of jobs picks its
// ids on a covering index for every (filter, sort) pair the API offers
// (checked on SQLite's own query plans), pages come back as the whole
// sorted listing has them, and a diary's line count, found on indexes, is
// exact for a capped diary cut and trimmed; and the migration from
// version 14 adds the indexes.
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/store/store.h"
#include "scheduler/store/store_reader.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class PageQueriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "page_queries_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/state.db";
    ASSERT_NO_FATAL_FAILURE(Reopen());
    reader_ = std::make_unique<StoreReader>(path_);
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
  int64_t Insert(const std::string& name, const std::string& user, int priority,
                 int64_t submit_ms, v1::JobState state) {
    JobRecord job;
    job.user = user;
    job.spec.set_name(name);
    job.spec.set_profile("local");
    job.spec.set_priority(priority);
    job.spec.mutable_command()->add_argv("true");
    job.submit_ms = submit_ms;
    job.state = state;
    auto id = store_->InsertJob(job);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  // SQLite's plan of `sql`, as (id, parent, detail) rows.
  struct PlanRow {
    int id, parent;
    std::string detail;
  };
  std::vector<PlanRow> Plan(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    std::vector<PlanRow> out;
    const std::string explain = "EXPLAIN QUERY PLAN " + sql;
    EXPECT_EQ(sqlite3_prepare_v2(store_->db()->raw(), explain.c_str(), -1, &st,
                                 nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(store_->db()->raw()) << "\n"
        << sql;
    while (st != nullptr && sqlite3_step(st) == SQLITE_ROW) {
      out.push_back(
          {sqlite3_column_int(st, 0), sqlite3_column_int(st, 1),
           reinterpret_cast<const char*>(sqlite3_column_text(st, 3))});
    }
    sqlite3_finalize(st);
    return out;
  }
  // The plan's rows under its "LIST SUBQUERY" (the page's ids).
  std::vector<std::string> SubqueryPlan(const std::string& sql) {
    std::vector<PlanRow> plan = Plan(sql);
    std::set<int> inside;
    std::vector<std::string> out;
    for (const PlanRow& row : plan) {  // parents come before their children
      if (row.detail.find("LIST SUBQUERY") == 0 || inside.count(row.parent)) {
        inside.insert(row.id);
        out.push_back(row.detail);
      }
    }
    return out;
  }
  // The first column of `sql`'s first row, -1 where none (prepared here:
  // Database::Prepare caches by the text's address).
  int64_t Scalar(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    int64_t v = -1;
    if (sqlite3_prepare_v2(store_->db()->raw(), sql.c_str(), -1, &st,
                           nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      v = sqlite3_column_int64(st, 0);
    }
    EXPECT_NE(st, nullptr) << sqlite3_errmsg(store_->db()->raw());
    sqlite3_finalize(st);
    return v;
  }
  int64_t CountedByScan(int64_t job) {
    return Scalar(
        absl::StrCat("SELECT COUNT(*) FROM diary WHERE job_id=", job));
  }
  void Line(int64_t job, int64_t seq, int rank, const std::string& text) {
    auto added = store_->AddDiary(job, 1, 0, seq, 10, 1, text,
                                  v1::DiaryLine::ENDING_NEWLINE, rank);
    ASSERT_TRUE(added.ok()) << added.status();
  }

  std::string dir_, path_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
};

const char* const kSorts[] = {"id",   "submit_ms", "name",
                              "user", "state",     "priority"};

TEST_F(PageQueriesTest, EveryFilterAndSortPicksThePageOnACoveringIndex) {
  Insert("a", "ada", 1, 5, v1::JOB_STATE_QUEUED);
  Insert("b", "bob", 2, 4, v1::JOB_STATE_RUNNING);
  struct Filter {
    const char* what;
    std::vector<v1::JobState> states;
    std::string user;
  };
  const Filter filters[] = {
      {"none", {}, ""},
      {"one state", {v1::JOB_STATE_CANCELLED}, ""},
      {"states", {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING}, ""},
      {"user", {}, "ada"},
  };
  for (const Filter& f : filters) {
    for (const char* sort : kSorts) {
      for (bool desc : {false, true}) {
        JobListQuery q;
        q.states = f.states;
        q.user = f.user;
        q.sort_column = sort;
        q.descending = desc;
        q.limit = 100;
        q.offset = 90'000;
        auto sql = JobListingSql(q);
        ASSERT_TRUE(sql.ok()) << sql.status();
        const std::vector<std::string> plan = SubqueryPlan(*sql);
        const std::string shown = absl::StrJoin(plan, " | ");
        SCOPED_TRACE(absl::StrCat(f.what, ", sort ", sort, desc ? " desc" : "",
                                  ": ", shown));
        ASSERT_FALSE(plan.empty()) << *sql;
        // The jobs table is read only through an index holding every
        // column the filter and the sort need: no row is read to skip.
        int on_jobs = 0;
        for (const std::string& step : plan) {
          if (step.find(" jobs") == std::string::npos) continue;
          ++on_jobs;
          EXPECT_THAT(step, HasSubstr("USING COVERING INDEX"));
        }
        EXPECT_EQ(on_jobs, 1);
        // Sorting only where a list of states joins several ranges of
        // their index (within one state, or a user, the index is in order;
        // a list of states sorted by state also is, range after range).
        const bool sorted_by_index =
            f.states.size() < 2 || std::string(sort) == "state";
        if (sorted_by_index) {
          EXPECT_THAT(shown, Not(HasSubstr("TEMP B-TREE")));
        }
      }
    }
  }
}

TEST_F(PageQueriesTest, PagesAreSlicesOfTheSortedListing) {
  const char* users[] = {"ada", "bob", "cy"};
  const v1::JobState states[] = {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING,
                                 v1::JOB_STATE_CANCELLED};
  for (int i = 0; i < 30; ++i) {
    Insert(absl::StrCat("job-", i % 7), users[i % 3], i % 4, 100 - i % 5,
           states[i % 3 == 0 ? 0 : (i % 2) + 1]);
  }
  for (const char* sort : kSorts) {
    for (bool desc : {false, true}) {
      for (const std::string& user : {std::string(), std::string("bob")}) {
        JobListQuery all;
        all.sort_column = sort;
        all.descending = desc;
        all.user = user;
        all.states = {v1::JOB_STATE_QUEUED, v1::JOB_STATE_CANCELLED};
        v1::ListJobsReply whole;
        ASSERT_TRUE(reader_->ListJobSummaries(all, &whole).ok());
        std::vector<int64_t> expected;
        for (const auto& job : whole.jobs()) expected.push_back(job.id());
        ASSERT_GE(expected.size(), 5u);
        JobListQuery page = all;
        page.limit = 3;
        page.offset = 2;
        page.count_total = true;
        v1::ListJobsReply got;
        ASSERT_TRUE(reader_->ListJobSummaries(page, &got).ok());
        std::vector<int64_t> ids;
        for (const auto& job : got.jobs()) ids.push_back(job.id());
        EXPECT_EQ(ids, std::vector<int64_t>(expected.begin() + 2,
                                            expected.begin() + 5))
            << sort << (desc ? " desc" : "") << " user " << user;
        EXPECT_EQ(got.total(), static_cast<int64_t>(expected.size()));
      }
    }
  }
}

TEST_F(PageQueriesTest, DiaryCountIsExactForACutAndTrimmedDiary) {
  const int64_t job = Insert("capped", "ada", 0, 1, v1::JOB_STATE_RUNNING);
  const int64_t other = Insert("plain", "ada", 0, 1, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(reader_->DiaryCount(job).value(), 0);
  // As StoreCappedDiary stores it: a head, the marker (dlbatch's own line),
  // then a tail trimmed from its oldest line, again and again.
  for (int i = 0; i < 5; ++i) {
    ASSERT_NO_FATAL_FAILURE(Line(job, i, i % 2, absl::StrCat("head ", i)));
    ASSERT_NO_FATAL_FAILURE(Line(other, i, 0, "other"));
  }
  ASSERT_TRUE(store_->AddDiary(job, 1, 0, -1, 10, 0, "[dlbatch] cut").ok());
  DiaryCut cut;
  cut.marker_n = store_->LastInsertId();
  ASSERT_TRUE(store_->PutDiaryCut(job, cut).ok());
  EXPECT_EQ(reader_->DiaryCount(job).value(), 6);  // the marker is the newest
  int64_t seq = 5;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 10; ++i, ++seq) {
      ASSERT_NO_FATAL_FAILURE(Line(job, seq, seq % 2, "tail line"));
    }
    auto trimmed = store_->TrimDiary(job, cut.marker_n, 9 * 4);  // 4 lines
    ASSERT_TRUE(trimmed.ok()) << trimmed.status();
    EXPECT_EQ(trimmed->first, 4);
    const int64_t stored = CountedByScan(job);
    EXPECT_EQ(stored, 6 + 6 * (round + 1));
    EXPECT_EQ(reader_->DiaryCount(job).value(), stored) << "round " << round;
    EXPECT_EQ(reader_->DiaryCount(job, {1}).value(),
              Scalar(absl::StrCat("SELECT COUNT(*) FROM diary WHERE job_id=",
                                  job, " AND rank=1")));
  }
  // A trim down to the newest line alone.
  ASSERT_TRUE(store_->TrimDiary(job, cut.marker_n, 1'000'000).ok());
  EXPECT_EQ(CountedByScan(job), 7);
  EXPECT_EQ(reader_->DiaryCount(job).value(), 7);
  // A later attempt's lines go on after it, and a duplicate adds none.
  auto again = store_->AddDiary(job, 2, 0, 0, 10, 1, "attempt 2");
  ASSERT_TRUE(again.ok() && *again);
  again = store_->AddDiary(job, 2, 0, 0, 10, 1, "attempt 2 again");
  ASSERT_TRUE(again.ok() && !*again);
  EXPECT_EQ(reader_->DiaryCount(job).value(), 8);
  EXPECT_EQ(reader_->DiaryCount(other).value(), 5);
  EXPECT_EQ(reader_->DiaryCount(other, {0}).value(), 5);
  EXPECT_EQ(reader_->DiaryCount(other, {3}).value(), 0);
}

TEST_F(PageQueriesTest, MigrationFromVersion14AddsTheIndexes) {
  const int64_t job = Insert("old", "ada", 0, 1, v1::JOB_STATE_QUEUED);
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(Line(job, i, 0, "x"));
  const char* const added[] = {"jobs_by_id",           "jobs_by_state_name",
                               "jobs_by_state_submit", "jobs_by_state_priority",
                               "jobs_by_state_user",   "jobs_by_user_name",
                               "jobs_by_user_submit",  "jobs_by_user_priority",
                               "jobs_by_user_state",   "diary_by_rank"};
  std::string undo;
  for (const char* index : added)
    absl::StrAppend(&undo, "DROP INDEX ", index, ";");
  ASSERT_TRUE(store_->db()
                  ->Exec(absl::StrCat(
                      undo, "UPDATE meta SET value='14' WHERE key='schema'"))
                  .ok());
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_EQ(Scalar("SELECT CAST(value AS INTEGER) FROM meta WHERE "
                   "key='schema'"),
            15);
  for (const char* index : added) {
    EXPECT_EQ(Scalar(absl::StrCat("SELECT COUNT(*) FROM sqlite_master WHERE "
                                  "type='index' AND name='",
                                  index, "'")),
              1)
        << index;
  }
  EXPECT_EQ(reader_->DiaryCount(job).value(), 3);
  EXPECT_EQ(reader_->DiaryCount(job, {0}).value(), 3);
}

}  // namespace
}  // namespace dlbatch::scheduler
