// `dlbatch admin user …` and `dlbatch admin worker-token …`: the tokens a
// shared cluster's scheduler accepts over TCP (commands_credentials.cc).
#ifndef DLBATCH_CLIENT_COMMANDS_CREDENTIALS_H_
#define DLBATCH_CLIENT_COMMANDS_CREDENTIALS_H_

#include <CLI/CLI.hpp>

#include "client/connection.h"

namespace dlbatch::client {

// Registers `user` and `worker-token` under the `admin` command.
void AddCredentialCommands(CLI::App* admin, const GlobalFlags* flags, int* rc);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_CREDENTIALS_H_
