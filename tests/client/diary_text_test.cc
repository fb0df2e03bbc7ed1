// How the CLI shows diary lines of any bytes (client/diary_text.h).
#include "client/diary_text.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"

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
  line.set_text(
      "a\xff"
      "b\x1b[2Jc\0d\"\\"s);
  std::string json = DiaryLineJson(line);
  EXPECT_EQ(json,
            R"({"n":"12","time_ms":"1700000000000","stream":1,"attempt":1,)"
            "\"text\":\"a\xEF\xBF\xBD"
            R"(b\u001b[2Jc\u0000d\"\\",)"
            R"("text_base64":"Yf9iG1sySmMAZCJc"})");
  v1::DiaryLine empty;
  EXPECT_EQ(DiaryLineJson(empty), R"({"text":"","text_base64":""})");
}

}  // namespace
}  // namespace dlbatch::client
