#include "client/commands_config.h"

#include <cstdlib>
#include <iostream>

#include "client/terminal_text.h"
#include "common/version.h"

namespace dlbatch::client {

std::string ClientConfigPath() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) {
    return std::string(xdg) + "/dlbatch/config.yaml";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return std::string(home) + "/.config/dlbatch/config.yaml";
  }
  return "";
}

std::unique_ptr<ConfigBinding> AddConfigCommands(CLI::App& app,
                                                 GlobalFlags* flags, int* rc) {
  app.add_option("--default-profile", flags->default_profile,
                 "Profile of a submitted job whose job file and flags name "
                 "none (default: the scheduler's 'local')");
  if (CLI::Option* retry = app.get_option_no_throw("--retry-for")) {
    retry->default_str("30s");
  }
  app.set_version_flag("--version", VersionText("dlbatch"));
  auto binding = std::make_unique<ConfigBinding>(&app, ClientConfigPath());
  binding->SetEnv("--scheduler", "DLBATCH_SCHEDULER");
  binding->SetEnv("--token-file", "DLBATCH_TOKEN", /*env_is_value=*/false);
  binding->SetEnv("--ca-file", "DLBATCH_CA");

  auto json = std::make_shared<bool>(false);
  auto* command = app.add_subcommand(
      "config",
      "Print the settings in effect (scheduler, token, CA, default profile) "
      "and where each came from: a flag, an environment variable, the "
      "configuration file (with its line) or the default");
  command->add_flag("--json", *json, "JSON instead of a table");
  ConfigBinding* b = binding.get();
  command->callback([b, json, rc] {
    // The settings quote the environment and a configuration file, which
    // may be another's (/etc): shown escaped, as all text the CLI did not
    // write.
    const std::string text = FormatSettings(b->Settings(), b->path(), *json);
    std::cout << (*json ? text : TerminalText(text, {.newline = true}));
    *rc = 0;
  });
  return binding;
}

}  // namespace dlbatch::client
