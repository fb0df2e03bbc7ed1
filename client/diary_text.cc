#include "client/diary_text.h"

#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace dlbatch::client {
namespace {

// The length of the valid UTF-8 sequence at the start of `s`, 0 if it does
// not start with one (RFC 3629: no overlong forms, no surrogates, nothing
// past U+10FFFF).
size_t Utf8SequenceLength(std::string_view s) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  auto cont = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i < s.size() && byte(i) >= lo && byte(i) <= hi;
  };
  const uint8_t b = byte(0);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    const uint8_t lo = b == 0xE0 ? 0xA0 : 0x80;
    const uint8_t hi = b == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const uint8_t lo = b == 0xF0 ? 0x90 : 0x80;
    const uint8_t hi = b == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

void AppendHex(std::string* out, std::string_view bytes) {
  for (char ch : bytes)
    absl::StrAppendFormat(out, "\\x%02x", static_cast<uint8_t>(ch));
}

}  // namespace

std::string EscapeDiaryText(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const size_t n = Utf8SequenceLength(bytes);
    const auto b = static_cast<uint8_t>(bytes[0]);
    const bool c0 = n == 1 && ((b < 0x20 && b != '\t') || b == 0x7F);
    const bool c1 =
        n == 2 && b == 0xC2 && static_cast<uint8_t>(bytes[1]) < 0xA0;
    if (n == 0) {
      AppendHex(&out, bytes.substr(0, 1));
      bytes.remove_prefix(1);
      continue;
    }
    if (c0 || c1) {
      AppendHex(&out, bytes.substr(0, n));
    } else {
      out.append(bytes.substr(0, n));
    }
    bytes.remove_prefix(n);
  }
  return out;
}

std::string ValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const size_t n = Utf8SequenceLength(bytes);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      bytes.remove_prefix(1);
    } else {
      out.append(bytes.substr(0, n));
      bytes.remove_prefix(n);
    }
  }
  return out;
}

}  // namespace dlbatch::client
