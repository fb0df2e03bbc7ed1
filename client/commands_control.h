// Job control and worker administration: `dlbatch hold|release|requeue
// ID…` and `dlbatch admin drain|resume|remove WORKER` (commands_control.cc).
#ifndef DLBATCH_CLIENT_COMMANDS_CONTROL_H_
#define DLBATCH_CLIENT_COMMANDS_CONTROL_H_

#include <CLI/CLI.hpp>
#include <string>

#include "client/connection.h"
#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::client {

// Registers hold, release and requeue on `app`; the command's exit code
// goes to *rc. `flags` is read when a command runs.
void AddControlCommands(CLI::App& app, const GlobalFlags* flags, int* rc);
// Registers drain, resume and remove under `admin`.
void AddWorkerAdminCommands(CLI::App* admin, const GlobalFlags* flags, int* rc);

// A job's state as tables show it: "held" for a held queued job.
std::string JobStateText(const v1::Job& job);
// A worker's state as tables show it: online, offline, draining (online
// and drained), drained (offline and drained).
std::string WorkerStateText(const v1::WorkerInfo& worker);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_CONTROL_H_
