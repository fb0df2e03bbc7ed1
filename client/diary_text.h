// How the CLI shows a diary line. A line holds the bytes the job printed,
// which may be anything: invalid UTF-8, NULs, terminal escape sequences.
#ifndef DLBATCH_CLIENT_DIARY_TEXT_H_
#define DLBATCH_CLIENT_DIARY_TEXT_H_

#include <string>
#include <string_view>

#include "dlbatch/v1/job.pb.h"

namespace dlbatch::client {

// The line made safe for a terminal: TerminalText (terminal_text.h) that
// keeps tabs. Valid UTF-8 and tabs are kept; every other control character
// (C0, DEL, and C1 as its two UTF-8 bytes) and every byte that is not part
// of valid UTF-8 is written as \xHH (ESC as \x1b, a NUL as \x00, a stray
// 0xff as \xff). A backslash is kept as it is: the result is for reading,
// and `diary --raw` / `--json` carry the exact bytes (json_out.h:
// DiaryLineJson).
std::string EscapeDiaryText(std::string_view bytes);

// The line as valid UTF-8, each byte that is not part of valid UTF-8
// replaced by U+FFFD; exactly `bytes` when they are valid UTF-8.
std::string ValidUtf8(std::string_view bytes);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_DIARY_TEXT_H_
