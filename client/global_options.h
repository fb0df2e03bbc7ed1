// The options every command takes: which scheduler it talks to and how
// (--scheduler, --token-file, --ca-file, --retry-for). Each is chosen as
// flag > environment > configuration file > default: the file
// (config.yaml, bound by commands_config.h) only presets the flag, and an
// environment variable that is set keeps the file's value out, to be read
// where the flag is empty (ChooseScheduler, and common/tls_client.h's
// ResolveCa for the CA).
#ifndef DLBATCH_CLIENT_GLOBAL_OPTIONS_H_
#define DLBATCH_CLIENT_GLOBAL_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/connection.h"

namespace dlbatch::client {

// Declares --scheduler, --token-file, --ca-file and --retry-for on `app`,
// bound to *flags (which must outlive `app`), and lets them follow the
// command too (`dlbatch jobs --scheduler unix:/run/s.sock`). A bad
// --retry-for is a CLI::ValidationError, as any bad value.
// REQUIRES: `app` has no subcommand yet (CLI11 copies fallthrough into a
// subcommand as it is made).
void AddGlobalOptions(CLI::App& app, GlobalFlags* flags);

// --retry-for's value in ms: a duration (30s, 2m), or "0" for no retrying.
// An error says what a duration looks like.
absl::StatusOr<int64_t> ParseRetryForMs(absl::string_view text);

// Which scheduler the global options and the environment name, and the
// token to show it.
struct SchedulerChoice {
  // --scheduler, else DLBATCH_SCHEDULER; "" (neither set, or empty): the
  // embedded local cluster.
  std::string address;
  // --token-file, which the caller reads; when it is empty, `token` is
  // DLBATCH_TOKEN's value ("" when that is unset too).
  std::string token_file;
  std::string token;
};
// Pure: `getenv` is std::getenv in the CLI, a fake in tests.
SchedulerChoice ChooseScheduler(
    const GlobalFlags& flags,
    const std::function<const char*(const char*)>& getenv);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_GLOBAL_OPTIONS_H_
