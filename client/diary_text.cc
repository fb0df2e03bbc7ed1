#include "client/diary_text.h"

#include "client/terminal_text.h"

namespace dlbatch::client {

std::string EscapeDiaryText(std::string_view bytes) {
  return TerminalText(bytes, {.tab = true});
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
