// dlbatch-worker: runs the jobs a scheduler places on this machine. The
// settings are read in worker/options.h, the host is prepared in
// worker/startup.h and the parts are wired and served in worker/serve.h.
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/config_cli.h"
#include "common/log_format.h"
#include "common/malloc_tuning.h"
#include "common/signals.h"
#include "common/usage_exit.h"
#include "common/version.h"
#include "spdlog/spdlog.h"
#include "worker/options.h"
#include "worker/serve.h"

namespace {

int Fail(absl::string_view message) {
  std::cerr << "dlbatch-worker: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  dlbatch::KeepChunkBuffersInProcess();
  dlbatch::BlockStopSignals();
  const dlbatch::worker::EnvLookup env = [](const char* name) {
    return static_cast<const char*>(std::getenv(name));
  };
  auto flags = dlbatch::worker::ParseWorkerFlags(
      argc, argv, env, dlbatch::worker::kWorkerConfigPath, std::cout,
      std::cerr);
  if (!flags.ok()) return Fail(flags.status().message());
  if (flags->exit_code.has_value()) return *flags->exit_code;
  if (auto s = dlbatch::SetUpLogging(flags->log_format, "dlbatch-worker");
      !s.ok()) {
    Fail(s.message());
    return dlbatch::kExitUsage;  // --log-format's value
  }
  spdlog::info(
      "dlbatch-worker {}{}; settings: {}", dlbatch::Version(),
      flags->config_path.empty() ? "" : "; configuration " + flags->config_path,
      dlbatch::NonDefaultSettings(flags->settings));

  auto options = dlbatch::worker::ResolveWorkerOptions(*std::move(flags), env);
  if (!options.ok()) return Fail(options.status().message());
  if (absl::Status s = dlbatch::worker::Serve(*options); !s.ok()) {
    return Fail(s.message());
  }
  return 0;
}
