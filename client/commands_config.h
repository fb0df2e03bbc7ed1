// The client's configuration file and `dlbatch config` (commands_config.cc).
#ifndef DLBATCH_CLIENT_COMMANDS_CONFIG_H_
#define DLBATCH_CLIENT_COMMANDS_CONFIG_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "client/connection.h"
#include "common/config_cli.h"

namespace dlbatch::client {

// $XDG_CONFIG_HOME/dlbatch/config.yaml, else ~/.config/dlbatch/config.yaml
// ("" when neither variable is set).
std::string ClientConfigPath();

// Adds --config, --default-profile and --version to `app` and the `config`
// command, which prints each global setting in effect and where it came
// from. Call after the global options are declared; call Load(argc, argv)
// on the result before parsing. Keys of config.yaml: scheduler,
// token_file, ca_file, retry_for, default_profile.
std::unique_ptr<ConfigBinding> AddConfigCommands(CLI::App& app,
                                                 GlobalFlags* flags, int* rc);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_COMMANDS_CONFIG_H_
