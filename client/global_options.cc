#include "client/global_options.h"

#include "common/duration.h"

namespace dlbatch::client {

void AddGlobalOptions(CLI::App& app, GlobalFlags* flags) {
  app.add_option(
      "--scheduler", flags->scheduler,
      "Scheduler address: unix:PATH or HOST:PORT (or DLBATCH_SCHEDULER)");
  app.add_option("--token-file", flags->token_file,
                 "File with the scheduler's token, for TCP (or DLBATCH_TOKEN)");
  app.add_option("--ca-file", flags->ca_file,
                 "CA a TCP scheduler's certificate must chain to (or "
                 "DLBATCH_CA; default: ca.pem beside --token-file)");
  app.add_option_function<std::string>(
         "--retry-for",
         [flags](const std::string& text) {
           absl::StatusOr<int64_t> ms = ParseRetryForMs(text);
           if (!ms.ok()) {
             throw CLI::ValidationError("--retry-for",
                                        std::string(ms.status().message()));
           }
           flags->retry_for_ms = *ms;
         },
         "While the scheduler is unreachable (a restart), submit, jobs, show, "
         "wait and diary retry for this long (default 30s; 0: not at all)")
      ->type_name("DURATION");
  app.fallthrough();
}

absl::StatusOr<int64_t> ParseRetryForMs(absl::string_view text) {
  if (text == "0") return 0;
  absl::StatusOr<int64_t> seconds = dlbatch::ParseDurationSeconds(text);
  if (!seconds.ok()) return seconds.status();
  return *seconds * 1000;
}

SchedulerChoice ChooseScheduler(
    const GlobalFlags& flags,
    const std::function<const char*(const char*)>& getenv) {
  auto env = [&](const char* name) -> std::string {
    const char* value = getenv(name);
    return value != nullptr ? value : "";
  };
  SchedulerChoice choice;
  choice.address =
      flags.scheduler.empty() ? env("DLBATCH_SCHEDULER") : flags.scheduler;
  choice.token_file = flags.token_file;
  if (choice.token_file.empty()) choice.token = env("DLBATCH_TOKEN");
  return choice;
}

}  // namespace dlbatch::client
