// What the CLI answers its user before the scheduler is asked: usage errors
// and their exit code, jobs --state's names (client/commands_daily.h), and
// how diary lines are given back (--raw's bytes, --json's line numbers).
#include <gtest/gtest.h>

#include <string>

#include "client/commands.h"
#include "client/commands_daily.h"
#include "client/connection.h"
#include "common/usage_exit.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace {

TEST(Report, ExitsTwoForAUsageErrorAndOneForAnyOther) {
  EXPECT_EQ(Report(UsageError("--limit -1: give 1 or more")), kExitUsage);
  EXPECT_EQ(kExitUsage, 2);
  EXPECT_TRUE(IsUsageError(UsageError("x")));
  EXPECT_FALSE(IsUsageError(absl::InvalidArgumentError("from the scheduler")));
  EXPECT_EQ(Report(absl::InvalidArgumentError("pool 8 exceeds ...")), 1);
  EXPECT_EQ(Report(absl::NotFoundError("no job 4")), 1);
  EXPECT_EQ(Report(7), 7);
}

TEST(ParseJobStateFilter, HeldIsQueuedAndHeld) {
  v1::Job queued, held, running;
  queued.set_state(v1::JOB_STATE_QUEUED);
  held.set_state(v1::JOB_STATE_QUEUED);
  held.set_held(true);
  running.set_state(v1::JOB_STATE_RUNNING);

  auto only_held = ParseJobStateFilter({"held"});
  ASSERT_TRUE(only_held.ok()) << only_held.status();
  EXPECT_EQ(only_held->states,
            std::vector<v1::JobState>({v1::JOB_STATE_QUEUED}));
  EXPECT_TRUE(only_held->queued_only_held);
  EXPECT_TRUE(only_held->Keeps(held));
  EXPECT_FALSE(only_held->Keeps(queued));
  EXPECT_FALSE(only_held->Keeps(running));

  auto with_running = ParseJobStateFilter({"held", "running"});
  ASSERT_TRUE(with_running.ok());
  EXPECT_TRUE(with_running->Keeps(held));
  EXPECT_TRUE(with_running->Keeps(running));
  EXPECT_FALSE(with_running->Keeps(queued));

  // queued takes the held ones too.
  auto all_queued = ParseJobStateFilter({"held", "queued"});
  ASSERT_TRUE(all_queued.ok());
  EXPECT_FALSE(all_queued->queued_only_held);
  EXPECT_EQ(all_queued->states.size(), 1u);
  EXPECT_TRUE(all_queued->Keeps(queued));

  auto none = ParseJobStateFilter({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->states.empty());
  EXPECT_TRUE(none->Keeps(running));

  auto bad = ParseJobStateFilter({"hold"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(IsUsageError(bad.status()));
  EXPECT_EQ(bad.status().message(),
            "unknown state 'hold'; use queued, held, running, cancelling, "
            "finished, failed or cancelled");
}

v1::DiaryLine Line(const std::string& text, v1::DiaryLine::Ending ending) {
  v1::DiaryLine line;
  line.set_n(130);
  line.set_line(1);
  line.set_text(text);
  line.set_ending(ending);
  return line;
}

TEST(AppendDiaryLine, RawGivesTheJobsBytesWithTheirEnding) {
  DiaryOptions raw;
  raw.raw = true;
  std::string out;
  AppendDiaryLine(raw, Line("a", v1::DiaryLine::ENDING_CRLF), &out);
  AppendDiaryLine(raw, Line("b", v1::DiaryLine::ENDING_NEWLINE), &out);
  AppendDiaryLine(raw, Line("lo", v1::DiaryLine::ENDING_NONE), &out);
  AppendDiaryLine(raw, Line("ng", v1::DiaryLine::ENDING_NONE), &out);
  EXPECT_EQ(out, "a\r\nb\nlong");
  // Shown for a terminal, each is a line of its own.
  std::string shown;
  AppendDiaryLine({}, Line("last", v1::DiaryLine::ENDING_NONE), &shown);
  EXPECT_EQ(shown, "last\n");
}

TEST(AppendDiaryLine, ALabelledLineStartsWithItsRankAfterItsTime) {
  v1::DiaryLine line = Line("epoch 1\x1b[2J", v1::DiaryLine::ENDING_NEWLINE);
  line.set_rank(2);
  std::string out;
  AppendDiaryLine({}, line, &out, /*label=*/true);
  EXPECT_EQ(out, "[2] epoch 1\\x1b[2J\n");  // the job's text still escaped
  out.clear();
  AppendDiaryLine({}, line, &out);  // a job of one process: no label
  EXPECT_EQ(out, "epoch 1\\x1b[2J\n");
  DiaryOptions timed;
  timed.timestamps = true;
  out.clear();
  AppendDiaryLine(timed, line, &out, /*label=*/true);
  EXPECT_NE(out.find("  [2] epoch 1"), std::string::npos) << out;
  // dlbatch's own lines have no rank, so no label.
  v1::DiaryLine own = Line("[dlbatch] started", v1::DiaryLine::ENDING_NEWLINE);
  out.clear();
  AppendDiaryLine({}, own, &out, /*label=*/true);
  EXPECT_EQ(out, "[dlbatch] started\n");
}

TEST(DiaryLineJson, NIsTheLinesNumberInItsJob) {
  Json j = DiaryLineJson(Line("x", v1::DiaryLine::ENDING_NONE));
  EXPECT_EQ(j["n"], 1);
  EXPECT_EQ(j["ending"], "");
  EXPECT_EQ(DiaryLineJson(Line("x", v1::DiaryLine::ENDING_CRLF))["ending"],
            "\r\n");
  // From a scheduler that predates line numbers: its cursor, as before.
  v1::DiaryLine old;
  old.set_n(130);
  EXPECT_EQ(DiaryLineJson(old)["n"], 130);
  EXPECT_EQ(DiaryLineJson(old)["ending"], "\n");
}

}  // namespace
}  // namespace dlbatch::client
