#include "client/terminal_text.h"

#include <locale.h>
#include <wchar.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace dlbatch::client {
namespace {

// One thing a terminal shows: a character as itself, or a control
// character or a broken byte as \xHH of each of its bytes.
struct Unit {
  std::string_view bytes;  // what it takes of the input
  bool escaped = false;
  int width = 0;  // display cells of what is shown
};

char32_t Decode(std::string_view s, size_t n) {
  auto cont = [&](size_t i) { return static_cast<char32_t>(s[i] & 0x3F); };
  const auto b = static_cast<uint8_t>(s[0]);
  switch (n) {
    case 2:
      return (static_cast<char32_t>(b & 0x1F) << 6) | cont(1);
    case 3:
      return (static_cast<char32_t>(b & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    case 4:
      return (static_cast<char32_t>(b & 0x07) << 18) | (cont(1) << 12) |
             (cont(2) << 6) | cont(3);
    default:
      return b;
  }
}

// The cells a printable character takes. wcwidth() reads the width table
// of the thread's locale: C.UTF-8 is made current for the call only, so
// the process's locale (and what other threads see) stays as it is. A
// character glibc calls unprintable (unassigned, U+2028) is counted as
// the one cell a terminal gives its replacement glyph.
int CharWidth(char32_t c) {
  static const locale_t utf8 =
      ::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  if (utf8 == static_cast<locale_t>(nullptr)) return 1;  // no width table
  const locale_t before = ::uselocale(utf8);
  const int width = ::wcwidth(static_cast<wchar_t>(c));
  ::uselocale(before);
  return width < 0 ? 1 : width;
}

Unit NextUnit(std::string_view bytes, KeepControls keep) {
  const size_t n = Utf8SequenceLength(bytes);
  if (n == 0) return {bytes.substr(0, 1), true, 4};
  const auto b = static_cast<uint8_t>(bytes[0]);
  if (n == 1) {
    if (b >= 0x20 && b != 0x7F) return {bytes.substr(0, 1), false, 1};
    if ((b == '\t' && keep.tab) || (b == '\n' && keep.newline))
      return {bytes.substr(0, 1), false, 0};
    return {bytes.substr(0, 1), true, 4};
  }
  const bool c1 = n == 2 && b == 0xC2 && static_cast<uint8_t>(bytes[1]) < 0xA0;
  if (c1) return {bytes.substr(0, 2), true, 8};
  return {bytes.substr(0, n), false, CharWidth(Decode(bytes, n))};
}

void AppendUnit(const Unit& unit, std::string* out) {
  if (!unit.escaped) {
    out->append(unit.bytes);
    return;
  }
  for (char ch : unit.bytes)
    absl::StrAppendFormat(out, "\\x%02x", static_cast<uint8_t>(ch));
}

// TerminalText(bytes) cut to at most `width` cells; *used: the cells it
// takes.
std::string Clip(std::string_view bytes, int width, int* used) {
  std::string out;
  *used = 0;
  while (!bytes.empty()) {
    const Unit unit = NextUnit(bytes, {});
    if (*used + unit.width > width) break;
    AppendUnit(unit, &out);
    *used += unit.width;
    bytes.remove_prefix(unit.bytes.size());
  }
  return out;
}

}  // namespace

std::string TerminalText(std::string_view bytes, KeepControls keep) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const Unit unit = NextUnit(bytes, keep);
    AppendUnit(unit, &out);
    bytes.remove_prefix(unit.bytes.size());
  }
  return out;
}

int DisplayWidth(std::string_view bytes) {
  int width = 0;
  while (!bytes.empty()) {
    const Unit unit = NextUnit(bytes, {});
    width += unit.width;
    bytes.remove_prefix(unit.bytes.size());
  }
  return width;
}

std::string ClipToWidth(std::string_view bytes, int width) {
  int used = 0;
  return Clip(bytes, width, &used);
}

std::string PadToWidth(std::string_view bytes, int width) {
  int used = 0;
  std::string out = Clip(bytes, width, &used);
  out.append(static_cast<size_t>(std::max(0, width - used)), ' ');
  return out;
}

std::string ShortenToWidth(std::string_view bytes, int width) {
  if (DisplayWidth(bytes) <= width) return TerminalText(bytes);
  constexpr std::string_view kEllipsis = "...";
  const int room = width - static_cast<int>(kEllipsis.size());
  if (room < 0) return ClipToWidth(bytes, width);
  int used = 0;
  std::string out = Clip(bytes, room, &used);
  out.append(kEllipsis);
  return out;
}

}  // namespace dlbatch::client
