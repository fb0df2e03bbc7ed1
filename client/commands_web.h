// `dlbatch web`: a one-time URL into the scheduler's web face
// (commands_web.cc).
#ifndef DLBATCH_CLIENT_COMMANDS_WEB_H_
#define DLBATCH_CLIENT_COMMANDS_WEB_H_

#include <CLI/CLI.hpp>
#include <string>

#include "client/connection.h"

namespace dlbatch::client {

// Registers `web` on `app`; its exit code goes to *rc.
void AddWebCommand(CLI::App& app, const GlobalFlags* flags, int* rc);

// Starts `browser` (the first entry of $BROWSER's colon-separated list)
// with `url` as its one argument, detached: no shell, nothing waited for,
// its output to /dev/null. False where it could not be started.
bool OpenInBrowser(const std::string& browser, const std::string& url);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_WEB_H_
