// How the CLI shows text it did not write on a terminal. Job names, reasons,
// user, worker and file names, diary lines: a user or a job wrote them, and
// they may hold anything, terminal escape sequences and invalid UTF-8
// included. Every human-output printer sends such text through
// TerminalText (or the width functions below, which call it), so that no
// one can drive another's terminal; `--json` is a medium of its own
// (json_out.h).
//
// Widths are display cells as a terminal lays them out: wide (CJK)
// characters take two, combining marks none. They come from glibc's
// wcwidth() under the C.UTF-8 locale, whatever the process's own locale is
// (it is never changed).
#ifndef DLBATCH_CLIENT_TERMINAL_TEXT_H_
#define DLBATCH_CLIENT_TERMINAL_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace dlbatch::client {

// The control characters a text may keep as themselves: a diary line keeps
// its tabs, a multi-line message its line breaks. A field shown in a table
// or on one line keeps none (a tab or newline would break the layout).
struct KeepControls {
  bool tab = false;
  bool newline = false;
};

// `bytes` made safe for a terminal: valid UTF-8 is kept; every control
// character (C0, DEL, and C1 as its two UTF-8 bytes) but those `keep` names,
// and every byte that is not part of valid UTF-8, is written as \xHH (ESC
// as \x1b, a NUL as \x00, a stray 0xff as \xff). A backslash is kept: the
// result is for reading. The result holds no control character but those
// kept, and TerminalText of it is itself.
std::string TerminalText(std::string_view bytes, KeepControls keep = {});

// The display cells TerminalText(bytes) takes; each \xHH takes four.
int DisplayWidth(std::string_view bytes);

// TerminalText(bytes) cut to at most `width` cells: only whole characters
// (never part of a UTF-8 sequence, nor of a \xHH), combining marks kept
// with the character they follow.
std::string ClipToWidth(std::string_view bytes, int width);
// ClipToWidth, then spaces to exactly `width` cells (a wide character that
// would cross the edge is left out, and its cell filled with a space).
std::string PadToWidth(std::string_view bytes, int width);
// ClipToWidth, but a text cut ends in "..." (within `width`).
std::string ShortenToWidth(std::string_view bytes, int width);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_TERMINAL_TEXT_H_
