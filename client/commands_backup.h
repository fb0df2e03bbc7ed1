// `dlbatch admin backup FILE` and `dlbatch admin status`
// (commands_backup.cc).
#ifndef DLBATCH_CLIENT_COMMANDS_BACKUP_H_
#define DLBATCH_CLIENT_COMMANDS_BACKUP_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "client/connection.h"

namespace dlbatch::client {

// Registers `backup` and `status` under `admin`.
void AddBackupCommands(CLI::App* admin, const GlobalFlags* flags, int* rc);

// Writes the scheduler's backup archive (a tar of its store, the stored
// files its jobs hold and its keys) to `file`: through `file`.part, mode
// 0600, renamed once every byte has come and is on disk. An existing
// `file` is refused unless `force`.
absl::StatusOr<int> Backup(Connection& conn, const std::string& file,
                           bool force);
// Version, uptime, sizes, jobs and workers by state.
absl::StatusOr<int> ShowStatus(Connection& conn, bool json);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_BACKUP_H_
