// Untrusted text on a terminal (client/terminal_text.h): escaped as the
// diary is, measured and cut by display width; and the CLI's tables
// (client/format.h), which lay it out.
#include "client/terminal_text.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "client/diary_text.h"
#include "client/format.h"

namespace dlbatch::client {
namespace {

using namespace std::string_literals;

constexpr char kUe[] = "\xc3\xbc";                     // ü, one cell
constexpr char kNihon[] = "\xe6\x97\xa5\xe6\x9c\xac";  // 日本, two cells each
constexpr char kAcute[] = "\xcc\x81";                  // U+0301, combining

TEST(TerminalText, EscapesControlsAndBrokenBytesAsTheDiaryDoes) {
  EXPECT_EQ(TerminalText("x\x1b]0;pwned\x07\x1b[2J"),
            R"(x\x1b]0;pwned\x07\x1b[2J)");
  EXPECT_EQ(TerminalText("a\xff"
                         "b\0c"s),
            R"(a\xffb\x00c)");
  EXPECT_EQ(TerminalText("\xc2\x9b"
                         "2J\x7f"),
            R"(\xc2\x9b2J\x7f)");
  // A field keeps no tab or newline (they would break a table's layout);
  // a diary line keeps its tabs, a message its line breaks.
  EXPECT_EQ(TerminalText("a\tb\nc"), R"(a\x09b\x0ac)");
  EXPECT_EQ(TerminalText("a\tb\nc", {.tab = true}), "a\tb\\x0ac");
  EXPECT_EQ(TerminalText("a\tb\nc", {.newline = true}), "a\\x09b\nc");
  EXPECT_EQ(EscapeDiaryText("a\tb\x1b"), "a\tb\\x1b");
}

TEST(TerminalText, KeepsValidUtf8AndBackslashes) {
  const std::string text = "r\xc3\xa9snet-"s + kNihon + " e" + kAcute +
                           " \xf0\x9f\x98\x80 \xc2\xa0" + R"( C:\x41)";
  EXPECT_EQ(TerminalText(text), text);
}

TEST(TerminalText, IsItsOwnFixedPoint) {
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte += static_cast<char>(b);
  for (const std::string& text :
       {every_byte, "x\x1b[2J"s + kNihon, "\xe2\x82"s + kUe}) {
    const std::string shown = TerminalText(text);
    EXPECT_EQ(TerminalText(shown), shown);
    EXPECT_EQ(ValidUtf8(shown), shown);
    EXPECT_EQ(DisplayWidth(shown), DisplayWidth(text));
  }
}

TEST(DisplayWidth, CountsCellsNotBytes) {
  EXPECT_EQ(DisplayWidth(""), 0);
  EXPECT_EQ(DisplayWidth("abc"), 3);
  EXPECT_EQ(DisplayWidth(kUe), 1);
  EXPECT_EQ(DisplayWidth("gr"s + kUe + "\xc3\x9f" + "e"), 5);  // grüße
  EXPECT_EQ(DisplayWidth(kNihon), 4);
  EXPECT_EQ(DisplayWidth("e"s + kAcute), 1);
  EXPECT_EQ(DisplayWidth("\xf0\x9f\x98\x80"), 2);  // an emoji
  // What is escaped takes the cells of its escape: \x1b is four.
  EXPECT_EQ(DisplayWidth("\x1b"), 4);
  EXPECT_EQ(DisplayWidth("\xff"), 4);
  EXPECT_EQ(DisplayWidth("\xc2\x9b"), 8);
  EXPECT_EQ(DisplayWidth("\xe6\x97"), 8);  // 日 cut short: two bad bytes
}

TEST(ClipToWidth, CutsAtCharacterBoundariesByWidth) {
  const std::string name = "r\xc3\xa9snet-"s + kNihon;  // résnet-日本: 11
  EXPECT_EQ(ClipToWidth(name, 11), name);
  EXPECT_EQ(ClipToWidth(name, 100), name);
  EXPECT_EQ(ClipToWidth(name, 10), "r\xc3\xa9snet-\xe6\x97\xa5");  // résnet-日
  // 日本 cannot be cut in the middle of 本: the wide character is left out.
  EXPECT_EQ(ClipToWidth(name, 9), "r\xc3\xa9snet-\xe6\x97\xa5");
  EXPECT_EQ(ClipToWidth(name, 2), "r\xc3\xa9");
  EXPECT_EQ(ClipToWidth(name, 0), "");
  EXPECT_EQ(ClipToWidth(name, -3), "");
  // A combining mark stays with its character; never part of a sequence.
  EXPECT_EQ(ClipToWidth("e"s + kAcute + "x", 1), "e"s + kAcute);
  EXPECT_EQ(ClipToWidth(kUe + "x"s, 1), kUe);
  // An escape is whole or not there at all.
  EXPECT_EQ(ClipToWidth("a\x1b[2J", 4), "a");
  EXPECT_EQ(ClipToWidth("a\x1b[2J", 5), R"(a\x1b)");
  for (int w = 0; w <= 14; ++w) {
    const std::string cut = ClipToWidth(name + "\xff", w);
    EXPECT_EQ(ValidUtf8(cut), cut) << w;
    EXPECT_LE(DisplayWidth(cut), w);
    EXPECT_GE(DisplayWidth(cut), w - 3);  // at most an escape short
  }
}

TEST(PadToWidth, FillsExactlyTheCells) {
  EXPECT_EQ(PadToWidth(kNihon, 6), kNihon + "  "s);
  EXPECT_EQ(PadToWidth(kNihon, 3), "\xe6\x97\xa5 ");  // 日 and a space
  EXPECT_EQ(PadToWidth("e"s + kAcute, 3), "e"s + kAcute + "  ");
  EXPECT_EQ(PadToWidth("abc", 2), "ab");
  EXPECT_EQ(PadToWidth("\x1b", 5), R"(\x1b )");
  for (int w = 0; w < 12; ++w)
    EXPECT_EQ(DisplayWidth(PadToWidth("x"s + kNihon + kUe + "\x1b", w)), w);
}

TEST(ShortenToWidth, EndsACutTextInDots) {
  EXPECT_EQ(ShortenToWidth("short", 10), "short");
  EXPECT_EQ(ShortenToWidth("\x1b", 10), R"(\x1b)");
  EXPECT_EQ(ShortenToWidth("waiting for 8 slots", 10), "waiting...");
  EXPECT_EQ(ShortenToWidth(kNihon + "-x"s, 5), "\xe6\x97\xa5...");  // 日...
  EXPECT_EQ(ShortenToWidth(kNihon + "-x"s, 4), "...");
  EXPECT_EQ(ShortenToWidth("abcdef", 2), "ab");
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Table, PadsColumnsByDisplayWidth) {
  Table table({"ID", "NAME", "USER"});
  table.Add({"1", "plain", "alice"});
  table.Add({"2", "gr"s + kUe + "n", "bob"});
  table.Add({"3", "r\xc3\xa9snet-"s + kNihon, "carol"});
  table.Add({"4", "e"s + kAcute + "t" + kAcute, "dave"});
  const std::vector<std::string> lines = Lines(table.Render());
  ASSERT_EQ(lines.size(), 5u);
  // "ID  NAME         USER": USER at cell 17 on every line.
  for (const std::string& line : lines) {
    size_t user = line.find_last_of(' ') + 1;
    EXPECT_EQ(DisplayWidth(line.substr(0, user)), 17) << line;
  }
  EXPECT_EQ(lines[3], "3   r\xc3\xa9snet-"s + kNihon + "  carol");
}

TEST(Table, EscapesEveryCell) {
  Table table({"NAME", "NOTE"});
  table.Add({"x\x1b[2J", "a\nb\tc\x07"});
  table.Add({"ok", "fine"});
  const std::string out = table.Render();
  EXPECT_EQ(out,
            "NAME      NOTE\n"
            R"(x\x1b[2J  a\x0ab\x09c\x07)"
            "\n"
            "ok        fine\n");
}

}  // namespace
}  // namespace dlbatch::client
