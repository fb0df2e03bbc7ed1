// `dlbatch admin …`: operations on the scheduler itself (commands_admin.cc).
#ifndef DLBATCH_CLIENT_COMMANDS_ADMIN_H_
#define DLBATCH_CLIENT_COMMANDS_ADMIN_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"

namespace dlbatch::client {

// Registers `admin` and its subcommands on `app`. `flags` is read when a
// command runs (after parsing); the command's exit code goes to *rc.
void AddAdminCommands(CLI::App& app, const GlobalFlags* flags, int* rc);

// --before: a date (2026-01-31, 2026-01-31T12:00, 2026-01-31 12:00:00, in
// local time, or with a zone such as Z or +02:00), or a duration meaning
// that long before `now` (30d, 12h).
absl::StatusOr<absl::Time> ParsePurgeBefore(const std::string& text,
                                            absl::Time now);

// Deletes the named ended jobs, or (ids empty) every job ended before
// `before`, with their diaries and the outputs no other job holds.
absl::StatusOr<int> Purge(Connection& conn, const std::vector<int64_t>& ids,
                          const std::string& before);

// `dlbatch admin limit set|list` and `dlbatch admin usage`: per-user limits
// and fair-share usage. set: slots/queued < 0 leave that limit as it is, 0
// removes it; clear removes both.
struct LimitArgs {
  std::string user;
  std::string profile;
  int slots = -1;
  int queued = -1;
  bool clear = false;
  bool json = false;
};
absl::StatusOr<int> SetLimit(Connection& conn, const LimitArgs& args);
absl::StatusOr<int> ListLimits(Connection& conn, bool json);
absl::StatusOr<int> ShowUsage(Connection& conn, bool json);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_ADMIN_H_
