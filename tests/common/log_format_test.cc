// --log-format's JSON escaping: whatever a message holds (quotes, line
// breaks, control characters, bytes that are not UTF-8), the line stays one
// line of valid JSON that reads back as the message.
#include "common/log_format.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dlbatch {
namespace {

std::string RoundTrip(const std::string& text) {
  auto j = nlohmann::json::parse("\"" + JsonEscape(text) + "\"");
  return j.get<std::string>();
}

TEST(LogFormatTest, EscapedTextReadsBackAsItWas) {
  for (const std::string& text : std::vector<std::string>{
           "plain", "say \"hi\"", "a\\b", "two\nlines\r\n", "tab\there",
           std::string("nul\0inside", 10), "\x01\x1f\x7f", "ünïcödé ✓ 🚀"}) {
    const std::string escaped = JsonEscape(text);
    EXPECT_EQ(escaped.find('\n'), std::string::npos) << escaped;
    EXPECT_EQ(RoundTrip(text), text) << escaped;
  }
}

TEST(LogFormatTest, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  const std::string bad =
      "a\xff"
      "b\xc3";  // a stray byte, a cut sequence
  EXPECT_EQ(RoundTrip(bad),
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbd");
}

TEST(LogFormatTest, UnknownFormatIsRefusedNamingTheChoices) {
  absl::Status s = SetUpLogging("yaml", "test");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("text or json"), std::string::npos);
}

}  // namespace
}  // namespace dlbatch
