#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace dlbatch {

absl::Status SendNotify(const std::string& socket_name,
                        absl::string_view state) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  const bool abstract = !socket_name.empty() && socket_name[0] == '@';
  if (socket_name.size() < 2 || (!abstract && socket_name[0] != '/') ||
      socket_name.size() > sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NOTIFY_SOCKET '", socket_name,
        "' is neither an absolute socket path nor an abstract '@name'"));
  }
  std::memcpy(addr.sun_path, socket_name.data(), socket_name.size());
  // An abstract name is the same bytes after a leading NUL, and its length
  // counts exactly those bytes (no terminator).
  if (abstract) addr.sun_path[0] = '\0';
  const socklen_t len =
      static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) +
                             socket_name.size() + (abstract ? 0 : 1));
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket for", socket_name);
  UniqueFd closer(fd);
  ssize_t n;
  do {
    n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                 reinterpret_cast<const struct sockaddr*>(&addr), len);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "notify", socket_name);
  if (static_cast<size_t>(n) != state.size()) {
    return absl::InternalError(
        absl::StrCat("notify ", socket_name, ": short datagram"));
  }
  return absl::OkStatus();
}

absl::Status Notify(absl::string_view state) {
  const char* name = std::getenv("NOTIFY_SOCKET");
  if (name == nullptr || *name == '\0') return absl::OkStatus();
  return SendNotify(name, state);
}

std::string ReadyState(absl::string_view status) {
  return absl::StrCat("READY=1\nSTATUS=", status, "\nMAINPID=", ::getpid());
}

}  // namespace dlbatch
