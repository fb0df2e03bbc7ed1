// How the CLI shows diary lines of any bytes (client/diary_text.h).
#include "client/diary_text.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"
#include "client/connection.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace {

using namespace std::string_literals;

TEST(EscapeDiaryText, KeepsPrintableTextTabsAndUtf8) {
  EXPECT_EQ(EscapeDiaryText("epoch 1\tloss 0.5"), "epoch 1\tloss 0.5");
  EXPECT_EQ(
      EscapeDiaryText("Genauigkeit \xC3\xA4 \xE2\x82\xAC \xF0\x9F\x98\x80"),
      "Genauigkeit \xC3\xA4 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(EscapeDiaryText(R"(C:\data\x41)"), R"(C:\data\x41)");
  EXPECT_EQ(EscapeDiaryText(""), "");
}

TEST(EscapeDiaryText, EscapesControlCharactersAndInvalidBytes) {
  EXPECT_EQ(EscapeDiaryText("a\xff"
                            "b\x1b[2Jc\0d"s),
            R"(a\xffb\x1b[2Jc\x00d)");
  EXPECT_EQ(EscapeDiaryText("10%\r20%\x7f\x07"), R"(10%\x0d20%\x7f\x07)");
  // C1 controls (U+0080..U+009F, e.g. CSI as U+009B) as their two bytes.
  EXPECT_EQ(EscapeDiaryText("\xC2\x9B"
                            "2J \xC2\xA0"),
            "\\xc2\\x9b2J \xC2\xA0");
}

TEST(EscapeDiaryText, EscapesEachByteOfABrokenSequence) {
  // Overlong '/', a surrogate, past U+10FFFF, a truncated 3-byte sequence,
  // a lone continuation byte.
  EXPECT_EQ(EscapeDiaryText("\xC0\xAF"), R"(\xc0\xaf)");
  EXPECT_EQ(EscapeDiaryText("\xED\xA0\x80"), R"(\xed\xa0\x80)");
  EXPECT_EQ(EscapeDiaryText("\xF4\x90\x80\x80"), R"(\xf4\x90\x80\x80)");
  EXPECT_EQ(EscapeDiaryText("x\xE2\x82"), R"(x\xe2\x82)");
  EXPECT_EQ(EscapeDiaryText("\x80"
                            "ok"),
            R"(\x80ok)");
  // A broken lead does not swallow the valid character after it.
  EXPECT_EQ(EscapeDiaryText("\xE2\xC3\xA4"), "\\xe2\xC3\xA4");
}

TEST(EscapeDiaryText, ResultIsPrintableUtf8WithoutControls) {
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte += static_cast<char>(b);
  std::string shown = EscapeDiaryText(every_byte);
  EXPECT_EQ(ValidUtf8(shown), shown);
  for (char ch : shown) {
    auto b = static_cast<unsigned char>(ch);
    EXPECT_TRUE(b == '\t' || (b >= 0x20 && b != 0x7f)) << int{b};
  }
}

TEST(ValidUtf8, ReplacesOnlyInvalidBytes) {
  EXPECT_EQ(ValidUtf8("a\xC3\xA4\x1b"), "a\xC3\xA4\x1b");
  EXPECT_EQ(ValidUtf8("a\xff"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(DiaryLineJson, CarriesTheTextAsAStringAndItsExactBytes) {
  v1::DiaryLine line;
  line.set_n(12);
  line.set_time_ms(1700000000000);
  line.set_stream(1);
  line.set_attempt(1);
  line.set_part(1);
  line.set_rank(3);
  line.set_text(
      "a\xff"
      "b\x1b[2Jc\0d\"\\"s);
  std::string json = JsonText(DiaryLineJson(line), /*compact=*/true);
  EXPECT_EQ(json, R"({"n":12,"time":"2023-11-14T22:13:20.000Z","stream":1,)"
                  R"("attempt":1,"seq":0,"text":"a)"
                  "\xEF\xBF\xBD"
                  R"(b\u001b[2Jc\u0000d\"\\","text_base64":"Yf9iG1sySmMAZCJc",)"
                  R"("ending":"\n","part":1,"rank":3})");
  // dlbatch's own lines have no rank.
  v1::DiaryLine empty;
  EXPECT_EQ(JsonText(DiaryLineJson(empty), /*compact=*/true),
            R"({"n":0,"time":null,"stream":0,"attempt":0,"seq":0,"text":"",)"
            R"("text_base64":"","ending":"\n","part":0,"rank":null})");
}

TEST(ParseDiaryRanks, TakesRanksRangesAndListsSortedOnce) {
  EXPECT_EQ(ParseDiaryRanks({}).value(), std::vector<int32_t>{});
  EXPECT_EQ(ParseDiaryRanks({"1"}).value(), std::vector<int32_t>{1});
  EXPECT_EQ(ParseDiaryRanks({"3,0", "2-4", "0"}).value(),
            (std::vector<int32_t>{0, 2, 3, 4}));
}

TEST(ParseDiaryRanks, RefusesWhatIsNotARankSayingWhatToGive) {
  auto message = [](const std::string& arg) {
    auto ranks = ParseDiaryRanks({arg});
    EXPECT_FALSE(ranks.ok()) << arg;
    EXPECT_TRUE(IsUsageError(ranks.status())) << arg;
    return std::string(ranks.status().message());
  };
  EXPECT_EQ(message("x"),
            "--rank x: not a rank; give a rank (a number from 0, the "
            "\"rank\" `dlbatch diary --json` shows), a range such as 0-3, "
            "or a list such as 0,2");
  EXPECT_NE(message("-1").find("--rank -1: ranks are numbered from 0, never "
                               "negative"),
            std::string::npos);
  EXPECT_NE(message("1,,2").find("an empty rank"), std::string::npos);
  EXPECT_NE(message("3-1").find("from the lower rank to the higher"),
            std::string::npos);
  EXPECT_NE(message("1-x").find("not a range of ranks"), std::string::npos);
  EXPECT_NE(message("+1").find("not a rank"), std::string::npos);
  EXPECT_NE(message("99999999999").find("not a rank"), std::string::npos);
  EXPECT_NE(message("0-5000").find("more than 1024 ranks at once"),
            std::string::npos);
  // What a job printed is never sent to the terminal as it is.
  EXPECT_NE(message("\x1b[2J").find("\\x1b[2J"), std::string::npos);
}

v1::DiaryLine RankLine(int rank) {
  v1::DiaryLine line;
  line.set_stream(rank < 0 ? 0 : 1);
  if (rank >= 0) line.set_rank(rank);
  return line;
}

TEST(DiaryLabels, LabelsOnceAJobIsSeenToRunSeveralProcesses) {
  EXPECT_EQ(RankLabel(RankLine(3)), "[3] ");
  EXPECT_EQ(RankLabel(RankLine(-1)), "");

  int asked = 0;
  DiaryLabels one_part([&] {
    ++asked;
    return false;
  });
  EXPECT_FALSE(one_part.Label(RankLine(-1)));  // not asked for dlbatch's
  EXPECT_EQ(asked, 0);
  EXPECT_FALSE(one_part.Label(RankLine(0)));
  EXPECT_FALSE(one_part.Label(RankLine(0)));
  EXPECT_EQ(asked, 1);  // once
  // A rank above 0 means several processes (rank 0 is one): from now on.
  EXPECT_TRUE(one_part.Label(RankLine(1)));
  EXPECT_TRUE(one_part.Label(RankLine(0)));
  EXPECT_EQ(asked, 1);

  DiaryLabels two_parts([] { return true; });
  EXPECT_TRUE(two_parts.Label(RankLine(0)));
  DiaryLabels unknown(nullptr);
  EXPECT_FALSE(unknown.Label(RankLine(0)));
}

TEST(JsonTime, IsRfc3339InUtcOrNullForZero) {
  EXPECT_EQ(JsonTime(1700000000123).get<std::string>(),
            "2023-11-14T22:13:20.123Z");
  EXPECT_TRUE(JsonTime(0).is_null());
}

TEST(JobJson, HasPlainValuesAndEveryKey) {
  v1::Job job;
  job.set_id(9000000000);
  job.set_state(v1::JOB_STATE_FINISHED);
  job.mutable_spec()->mutable_command()->add_argv("true");
  Json j = JobJson(job);
  EXPECT_EQ(j["id"].get<int64_t>(), 9000000000);
  EXPECT_EQ(j["state"], "finished");
  EXPECT_TRUE(j["start_time"].is_null());
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["wait_reason"], "");
  EXPECT_EQ(j["spec"]["command"], Json::array({"true"}));
  EXPECT_TRUE(j["spec"]["train"].is_null());
}

// `checkpoints`: every kept checkpoint with its part, step, attempt, files
// and whether a resume uses it; `checkpoint` stays the resumed files.
TEST(JobJson, ListsTheKeptCheckpoints) {
  v1::Job job;
  job.mutable_spec()->set_checkpoint("per-part");
  v1::KeptCheckpoint* k = job.add_checkpoints();
  k->set_part(1);
  k->set_iteration(20);
  k->set_attempt(2);
  k->set_resume(true);
  v1::OutputFile* f = k->add_files();
  f->set_path("state.pt");
  f->set_size(5);
  Json j = JobJson(job);
  ASSERT_EQ(j["checkpoints"].size(), 1u);
  EXPECT_EQ(j["checkpoints"][0]["part"], 1);
  EXPECT_EQ(j["checkpoints"][0]["iteration"], 20);
  EXPECT_EQ(j["checkpoints"][0]["attempt"], 2);
  EXPECT_EQ(j["checkpoints"][0]["resume"], true);
  EXPECT_EQ(j["checkpoints"][0]["files"][0]["path"], "state.pt");
  EXPECT_EQ(j["checkpoint"], Json::array());
  EXPECT_EQ(j["spec"]["checkpoint"], "per-part");
}

}  // namespace
}  // namespace dlbatch::client
