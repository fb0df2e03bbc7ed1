// dlbatch: the command line of the batch system.
#include <grpc/support/log.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <functional>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/commands.h"
#include "client/commands_admin.h"
#include "client/commands_config.h"
#include "client/commands_control.h"
#include "client/commands_daily.h"
#include "client/connection.h"
#include "client/local_cluster.h"
#include "common/duration.h"
#include "common/malloc_tuning.h"

namespace dlbatch::client {
namespace {

// --retry-for's value in ms; "0" turns retrying off.
int64_t ParseRetryFor(const std::string& text) {
  if (text == "0") return 0;
  auto seconds = dlbatch::ParseDurationSeconds(text);
  if (!seconds.ok()) {
    throw CLI::ValidationError("--retry-for",
                               std::string(seconds.status().message()));
  }
  return *seconds * 1000;
}

// gRPC's own log lines ("Handshake failed with fatal error ...") would come
// before the CLI's message, which says the same with what to change (the CA
// file used, the address tried). GRPC_VERBOSITY set brings them back.
void QuietGrpcLog(gpr_log_func_args* /*args*/) {}

}  // namespace
}  // namespace dlbatch::client

int main(int argc, char** argv) {
  dlbatch::KeepChunkBuffersInProcess();
  // gRPC's mutexes are abseil's: lock-order checking cost a graph lookup
  // on every lock, a few percent of a short command's CPU.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dlbatch::client;
  signal(SIGPIPE, SIG_IGN);
  if (std::getenv("GRPC_VERBOSITY") == nullptr) {
    gpr_set_log_function(QuietGrpcLog);
  }
  GlobalFlags flags;
  CLI::App app{
      "dlbatch: batch jobs for deep-learning training.\n"
      "With no --scheduler (and no DLBATCH_SCHEDULER), commands use the "
      "embedded local\n"
      "cluster, started in the background on first use."};
  app.require_subcommand(1);
  app.add_option(
      "--scheduler", flags.scheduler,
      "Scheduler address: unix:PATH or HOST:PORT (or DLBATCH_SCHEDULER)");
  app.add_option("--token-file", flags.token_file,
                 "File with the scheduler's token, for TCP (or DLBATCH_TOKEN)");
  app.add_option("--ca-file", flags.ca_file,
                 "CA a TCP scheduler's certificate must chain to (or "
                 "DLBATCH_CA; default: ca.pem beside --token-file)");
  app.add_option_function<std::string>(
         "--retry-for",
         [&](const std::string& text) {
           flags.retry_for_ms = ParseRetryFor(text);
         },
         "While the scheduler is unreachable (a restart), submit, jobs, show, "
         "wait and diary retry for this long (default 30s; 0: not at all)")
      ->type_name("DURATION");
  app.fallthrough();  // global options may follow the command too
  int rc = 0;

  AddDailyCommands(app, &flags, &rc, &argc, argv);  // submit, jobs

  int64_t show_id = 0, show_sweep = 0;
  bool show_json = false;
  auto* c_show =
      app.add_subcommand("show", "Show one job, and why it waits if it does");
  auto* show_id_opt = c_show->add_option("id", show_id, "Job id");
  auto* show_sweep_opt = c_show
                             ->add_option("--sweep", show_sweep,
                                          "Instead: compare a sweep's jobs, "
                                          "their options and final metrics, "
                                          "best first")
                             ->excludes(show_id_opt);
  c_show->add_flag("--json", show_json, "JSON instead of text");
  c_show->callback([&] {
    if (show_sweep_opt->count() == 0 && show_id_opt->count() == 0) {
      rc = Report(UsageError(
          "show: give a job id, or --sweep ID to compare a sweep's jobs"));
      return;
    }
    rc = WithConnection(flags, [&](Connection& c) {
      return show_sweep_opt->count() > 0 ? ShowSweep(c, show_sweep, show_json)
                                         : Show(c, show_id, show_json);
    });
  });

  int64_t diary_id = 0;
  DiaryOptions diary;
  auto* c_diary =
      app.add_subcommand("diary", "Print a job's diary (its output)");
  c_diary->add_option("id", diary_id, "Job id")->required();
  c_diary->add_flag("-f,--follow", diary.follow,
                    "Keep printing until the job ends");
  c_diary->add_option("-n,--tail", diary.tail,
                      "Only the last N lines (with -f: then follow)");
  c_diary->add_flag("-t,--timestamps", diary.timestamps,
                    "Prefix each line with its time");
  auto* diary_raw = c_diary->add_flag(
      "--raw", diary.raw,
      "The exact bytes the job printed. Without it, control characters "
      "(but tab) and bytes that are not UTF-8 are shown as \\xHH, so that "
      "a job cannot drive your terminal");
  c_diary
      ->add_flag("--json", diary.json,
                 "One JSON object a line: n (the line's number in the "
                 "job's diary, from 1), time, stream, attempt, seq; "
                 "\"text\" the line as a string (exact if it is UTF-8, "
                 "else each bad byte as U+FFFD), \"text_base64\" its "
                 "exact bytes and \"ending\" what followed them (\"\\n\", "
                 "\"\\r\\n\", or \"\" where the job's output ended "
                 "without a newline)")
      ->excludes(diary_raw);
  c_diary->callback([&] {
    rc = WithConnection(
        flags, [&](Connection& c) { return Diary(c, diary_id, diary); });
  });

  int64_t fetch_id = 0;
  std::string fetch_dir;
  bool fetch_list = false, fetch_json = false;
  auto* c_fetch =
      app.add_subcommand("fetch-outputs", "Download a job's outputs");
  c_fetch->add_option("id", fetch_id, "Job id")->required();
  c_fetch->add_option("-o,--output", fetch_dir,
                      "Target folder (default dlbatch-ID-outputs)");
  c_fetch->add_flag("--list", fetch_list,
                    "Only list the outputs with their sizes");
  c_fetch->add_flag("--json", fetch_json,
                    "Only list the outputs, as JSON (any state)");
  c_fetch->callback([&] {
    rc = WithConnection(flags, [&](Connection& c) {
      return FetchOutputs(c, fetch_id, fetch_dir, fetch_list, fetch_json);
    });
  });

  std::vector<int64_t> cancel_ids;
  auto* c_cancel = app.add_subcommand("cancel", "Cancel jobs");
  c_cancel->add_option("ids", cancel_ids, "Job ids")->required();
  c_cancel->callback([&] {
    rc = WithConnection(flags,
                        [&](Connection& c) { return Cancel(c, cancel_ids); });
  });

  std::vector<int64_t> wait_ids;
  std::string wait_timeout;
  auto* c_wait = app.add_subcommand(
      "wait",
      "Wait until jobs end; exit 0 if all finished, 1 if not, 2 on timeout "
      "(or a usage error), 4 if a job does not exist");
  c_wait->add_option("ids", wait_ids, "Job ids")->required();
  c_wait->add_option("--timeout", wait_timeout,
                     "Give up after this long (e.g. 10m)");
  c_wait->callback([&] {
    int64_t timeout_ms = 0;
    if (!wait_timeout.empty()) {
      auto s = dlbatch::ParseDurationSeconds(wait_timeout);
      if (!s.ok()) {
        rc = Report(UsageError(absl::StrCat("--timeout ", wait_timeout, ": ",
                                            s.status().message())));
        return;
      }
      timeout_ms = *s * 1000;
    }
    rc = WithConnection(
        flags, [&](Connection& c) { return Wait(c, wait_ids, timeout_ms); });
  });

  bool workers_json = false;
  auto* c_workers =
      app.add_subcommand("workers", "List workers and their devices");
  c_workers->add_flag("--json", workers_json, "JSON instead of a table");
  c_workers->callback([&] {
    rc = WithConnection(
        flags, [&](Connection& c) { return Workers(c, workers_json); });
  });

  bool profiles_json = false;
  auto* c_profiles = app.add_subcommand(
      "profiles", "List cluster profiles: slots, free, queued");
  c_profiles->add_flag("--json", profiles_json, "JSON instead of a table");
  c_profiles->callback([&] {
    rc = WithConnection(
        flags, [&](Connection& c) { return Profiles(c, profiles_json); });
  });

  bool monitor_once = false;
  auto* c_monitor =
      app.add_subcommand("monitor",
                         "Watch the cluster and its jobs live, full screen "
                         "(like MATLAB's Job Monitor).\n"
                         "Top: each worker's slots, free ('.') or held by a "
                         "job (the legend names it).\n"
                         "Below: the jobs with state, progress, loss, "
                         "accuracy, elapsed/ETA, and why a\n"
                         "queued job waits. Keys: Up/Down or j/k select, d the "
                         "selected job's diary live\n"
                         "(q or Esc returns), c cancel it (asks first), / "
                         "filter by name, user or state,\n"
                         "q quit. Without a terminal (or with --once) it "
                         "prints one plain snapshot.");
  c_monitor->add_flag("--once", monitor_once,
                      "Print one plain snapshot and exit");
  c_monitor->callback([&] {
    rc = WithConnection(
        flags, [&](Connection& c) { return Monitor(c, monitor_once); });
  });

  auto* c_local = app.add_subcommand(
      "local", "Start, stop or inspect the embedded local cluster");
  c_local->require_subcommand(1);
  int local_slots = 0;
  auto* c_local_start =
      c_local->add_subcommand("start", "Start the local scheduler and worker");
  c_local_start->add_option(
      "--cpu-slots", local_slots,
      "CPU slots of the local worker (default: the number of cores)");
  c_local_start->callback([&] {
    auto local = LocalCluster::Resolve();
    if (!local.ok()) {
      rc = Report(local.status());
      return;
    }
    absl::Status s = local->EnsureRunning(/*verbose=*/true, local_slots);
    if (!s.ok()) {
      rc = Report(s);
      return;
    }
    std::cout << local->Status();
  });
  bool local_force = false;
  auto* c_local_stop = c_local->add_subcommand(
      "stop", "Stop the local scheduler and worker (not while jobs run)");
  c_local_stop->add_flag("--force", local_force,
                         "Stop even while jobs run (they end with it)");
  c_local_stop->callback([&] { rc = Report(StopLocal(local_force)); });
  c_local
      ->add_subcommand("status",
                       "Is the local cluster running? (exit 0 if it is, "
                       "3 if not)")
      ->callback([&] { rc = Report(LocalStatus()); });

  AddAdminCommands(app, &flags, &rc);
  AddControlCommands(app, &flags, &rc);  // hold, release, requeue
  std::unique_ptr<dlbatch::ConfigBinding> config =
      AddConfigCommands(app, &flags, &rc);
  if (absl::Status s = config->Load(argc, argv); !s.ok()) return Report(s);
  if (auto failed = ParseCommandLine(app, argc, argv)) return *failed;
  return rc;
}
