// The terminal of a full-screen program, with termios and ANSI escapes:
// raw input, the alternate screen, redraws of only the lines that changed,
// and the signals that must leave the terminal as it was found.
#ifndef DLBATCH_CLIENT_MONITOR_TERMINAL_H_
#define DLBATCH_CLIENT_MONITOR_TERMINAL_H_

#include <termios.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dlbatch::client {

enum class KeyKind {
  kChar,  // a printable character, or a control character as itself
  kUp,
  kDown,
  kPageUp,
  kPageDown,
  kHome,
  kEnd,
  kEnter,
  kEscape,
  kBackspace,
};
struct Key {
  KeyKind kind = KeyKind::kChar;
  char ch = 0;  // kChar only
};

// Decodes the keys in `bytes` as one read() delivered them. A lone ESC is
// the Escape key; an escape sequence split across reads is dropped.
std::vector<Key> DecodeKeys(std::string_view bytes);

// Only one may exist at a time: it owns the process's handlers of SIGINT,
// SIGTERM, SIGHUP and SIGWINCH while it lives.
class RawTerminal {
 public:
  // Switches stdin to raw input and stdout to the alternate screen with the
  // cursor hidden, and installs the signal handlers (they only note the
  // signal and wake the poll loop). Fails if stdin is not a terminal.
  static absl::StatusOr<std::unique_ptr<RawTerminal>> Open();
  // Restores the terminal and the signal handlers.
  ~RawTerminal();
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

  // Rows and columns now (24x80 if the size cannot be read).
  void Size(int* rows, int* cols) const;
  // Readable when Wake() was called or a signal came; the poll loop drains
  // it with Drain().
  int wake_fd() const { return wake_read_; }
  // Any thread; async-signal-safe.
  void Wake();
  void Drain();
  // True once SIGINT, SIGTERM or SIGHUP came.
  bool quit_requested() const;
  // True if SIGWINCH came since the last call.
  bool TakeResize();

  // Shows `lines`, one per row from the top, rewriting only the rows that
  // differ from the last Draw (all of them after a resize or with `full`).
  void Draw(const std::vector<std::string>& lines, bool full);

 private:
  RawTerminal() = default;
  void WriteAll(std::string_view bytes);

  struct termios saved_ {};
  bool active_ = false;  // raw, alternate screen, handlers installed
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::vector<std::string> shown_;
};

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_MONITOR_TERMINAL_H_
