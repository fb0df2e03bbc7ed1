#include "client/monitor_terminal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch::client {
namespace {

// Signal handlers can reach nothing but process-wide state; RawTerminal
// sets these while it lives (one at a time).
volatile sig_atomic_t signal_quit = 0;
volatile sig_atomic_t signal_resize = 0;
volatile sig_atomic_t signal_wake_fd = -1;

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
struct sigaction saved_actions[sizeof(kSignals) / sizeof(kSignals[0])];

void OnSignal(int sig) {
  int saved_errno = errno;
  if (sig == SIGWINCH) {
    signal_resize = 1;
  } else {
    signal_quit = 1;
  }
  int fd = signal_wake_fd;
  if (fd >= 0) {
    char c = 's';
    (void)!::write(fd, &c, 1);
  }
  errno = saved_errno;
}

}  // namespace

std::vector<Key> DecodeKeys(std::string_view bytes) {
  std::vector<Key> keys;
  size_t i = 0;
  while (i < bytes.size()) {
    char c = bytes[i];
    if (c == '\x1b') {
      if (i + 1 >= bytes.size()) {
        keys.push_back({KeyKind::kEscape});
        ++i;
        continue;
      }
      char intro = bytes[i + 1];
      if (intro != '[' && intro != 'O') {
        keys.push_back({KeyKind::kEscape});  // ESC then an ordinary key
        ++i;
        continue;
      }
      // CSI / SS3: parameters, then a final byte in 0x40..0x7e.
      size_t j = i + 2;
      while (j < bytes.size() && (bytes[j] < 0x40 || bytes[j] > 0x7e)) ++j;
      if (j >= bytes.size()) break;  // split across reads: dropped
      std::string_view params = bytes.substr(i + 2, j - i - 2);
      char final_byte = bytes[j];
      i = j + 1;
      switch (final_byte) {
        case 'A':
          keys.push_back({KeyKind::kUp});
          break;
        case 'B':
          keys.push_back({KeyKind::kDown});
          break;
        case 'H':
          keys.push_back({KeyKind::kHome});
          break;
        case 'F':
          keys.push_back({KeyKind::kEnd});
          break;
        case '~':
          if (params == "5") keys.push_back({KeyKind::kPageUp});
          if (params == "6") keys.push_back({KeyKind::kPageDown});
          if (params == "1" || params == "7") keys.push_back({KeyKind::kHome});
          if (params == "4" || params == "8") keys.push_back({KeyKind::kEnd});
          break;
        default:
          break;  // other keys mean nothing here
      }
      continue;
    }
    ++i;
    if (c == '\r' || c == '\n') {
      keys.push_back({KeyKind::kEnter});
    } else if (c == 0x7f || c == 0x08) {
      keys.push_back({KeyKind::kBackspace});
    } else {
      keys.push_back({KeyKind::kChar, c});
    }
  }
  return keys;
}

absl::StatusOr<std::unique_ptr<RawTerminal>> RawTerminal::Open() {
  auto term = std::unique_ptr<RawTerminal>(new RawTerminal());
  if (::tcgetattr(STDIN_FILENO, &term->saved_) != 0) {
    return ErrnoStatus(errno, "tcgetattr", "stdin");
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    return ErrnoStatus(errno, "pipe", "");
  term->wake_read_ = fds[0];
  term->wake_write_ = fds[1];

  struct termios raw = term->saved_;
  // No echo, no line editing, no signals from keys (Ctrl-C arrives as a
  // byte and quits cleanly), no CR/NL translation on input.
  raw.c_lflag &= ~static_cast<tcflag_t>(ECHO | ICANON | ISIG | IEXTEN);
  raw.c_iflag &= ~static_cast<tcflag_t>(IXON | ICRNL | INLCR | IGNCR);
  raw.c_cc[VMIN] = 1;
  raw.c_cc[VTIME] = 0;
  if (::tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) != 0) {
    return ErrnoStatus(errno, "tcsetattr", "stdin");
  }

  signal_quit = 0;
  signal_resize = 0;
  signal_wake_fd = term->wake_write_;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    ::sigaction(kSignals[i], &action, &saved_actions[i]);
  }
  term->active_ = true;
  // Alternate screen, cursor hidden, screen cleared.
  term->WriteAll("\x1b[?1049h\x1b[?25l\x1b[2J");
  return term;
}

RawTerminal::~RawTerminal() {
  if (active_) {
    WriteAll("\x1b[0m\x1b[?25h\x1b[?1049l");
    ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_);
    for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
      ::sigaction(kSignals[i], &saved_actions[i], nullptr);
    }
    signal_wake_fd = -1;
  }
  if (wake_read_ >= 0) ::close(wake_read_);
  if (wake_write_ >= 0) ::close(wake_write_);
}

void RawTerminal::Size(int* rows, int* cols) const {
  struct winsize ws {};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 &&
      ws.ws_col > 0) {
    *rows = ws.ws_row;
    *cols = ws.ws_col;
  } else {
    *rows = 24;
    *cols = 80;
  }
}

void RawTerminal::Wake() {
  char c = 'w';
  (void)!::write(wake_write_, &c, 1);  // a full pipe already wakes
}

void RawTerminal::Drain() {
  char buf[256];
  while (::read(wake_read_, buf, sizeof(buf)) > 0) {
  }
}

bool RawTerminal::quit_requested() const { return signal_quit != 0; }

bool RawTerminal::TakeResize() {
  if (signal_resize == 0) return false;
  signal_resize = 0;
  return true;
}

void RawTerminal::Draw(const std::vector<std::string>& lines, bool full) {
  std::string out;
  if (full || shown_.size() != lines.size()) {
    out = "\x1b[2J";
    shown_.assign(lines.size(), std::string(1, '\0'));  // matches no line
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    if (shown_[i] == lines[i]) continue;
    absl::StrAppend(&out, "\x1b[", i + 1, ";1H", lines[i], "\x1b[K");
    shown_[i] = lines[i];
  }
  if (!out.empty()) WriteAll(out);
}

void RawTerminal::WriteAll(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(STDOUT_FILENO, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the terminal is gone; nothing to show it on
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace dlbatch::client
