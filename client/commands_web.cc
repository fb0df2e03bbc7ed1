#include "client/commands_web.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <vector>

#include "client/terminal_text.h"
#include "common/status.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace {

absl::StatusOr<int> Web(Connection& conn, bool json) {
  v1::CreateWebLoginReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->CreateWebLogin(ctx, v1::CreateWebLoginRequest(), &reply);
      })));
  if (json) {
    PrintJson(Json{{"url", reply.url()}, {"ca_file", reply.ca_file()}});
  } else {
    std::cout << TerminalText(reply.url()) << "\n";
    std::cerr << "(opens the dashboard once, within 2 minutes; ";
    if (reply.ca_file().empty()) {
      std::cerr << "its certificate is the operator's)\n";
    } else {
      std::cerr << "trust the CA " << TerminalText(reply.ca_file())
                << " in the browser, or accept its warning)\n";
    }
  }
  const char* browser = std::getenv("BROWSER");
  if (browser != nullptr && *browser != '\0' &&
      !OpenInBrowser(browser, reply.url())) {
    std::cerr << "dlbatch: could not start $BROWSER (" << TerminalText(browser)
              << "); open the URL yourself\n";
  }
  return 0;
}

}  // namespace

bool OpenInBrowser(const std::string& browser, const std::string& url) {
  std::string program = browser.substr(0, browser.find(':'));
  if (program.empty()) return false;
  // Twice forked: the browser is nobody's child here, so nothing waits
  // for it and it leaves no zombie; the middle child's exit status says
  // whether the exec was reached (127: it failed).
  pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0) {
    ::setsid();
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) ::_exit(127);
    pid_t grandchild = ::fork();
    if (grandchild < 0) ::_exit(127);
    if (grandchild == 0) {
      ::close(pipefd[0]);
      int null = ::open("/dev/null", O_RDWR);
      if (null >= 0) {
        ::dup2(null, 0);
        ::dup2(null, 1);
        ::dup2(null, 2);
      }
      std::vector<char*> argv = {const_cast<char*>(program.c_str()),
                                 const_cast<char*>(url.c_str()), nullptr};
      ::execvp(argv[0], argv.data());
      char failed = 1;
      (void)!::write(pipefd[1], &failed, 1);
      ::_exit(127);
    }
    ::close(pipefd[1]);
    // The pipe closes on a successful exec (close-on-exec) with nothing
    // written.
    char failed = 0;
    ssize_t n = ::read(pipefd[0], &failed, 1);
    ::_exit(n == 1 ? 127 : 0);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void AddWebCommand(CLI::App& app, const GlobalFlags* flags, int* rc) {
  auto json = std::make_shared<bool>(false);
  auto* command = app.add_subcommand(
      "web",
      "Print a one-time URL that logs you in to the scheduler's web "
      "dashboard\n(valid once, for 2 minutes) and the CA file its "
      "certificate chains to;\nopens it with $BROWSER when that is set. The "
      "scheduler serves the dashboard\nwith --web-listen (the local cluster "
      "always does, on loopback).");
  command->add_flag("--json", *json, "Print {\"url\", \"ca_file\"} as JSON");
  command->callback([flags, rc, json] {
    *rc = WithConnection(*flags, [&](Connection& c) { return Web(c, *json); });
  });
}

}  // namespace dlbatch::client
