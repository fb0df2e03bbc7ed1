#include "client/app.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/commands_admin.h"
#include "client/commands_config.h"
#include "client/commands_control.h"
#include "client/commands_daily.h"
#include "client/commands_web.h"
#include "client/connection.h"
#include "client/diary_text.h"
#include "client/global_options.h"
#include "client/local_cluster.h"
#include "common/duration.h"
#include "common/status.h"

namespace dlbatch::client {
namespace {

// Each command's parsed options live in a shared_ptr its callback holds, so
// they outlive the function that declared them; `flags` and `rc` are the
// caller's and outlive the parse.

// show, diary, fetch-outputs, cancel and wait: one job's (or a few jobs')
// record, output and end.
void AddJobCommands(CLI::App& app, const GlobalFlags* flags, int* rc) {
  struct ShowArgs {
    int64_t id = 0;
    int64_t sweep = 0;
    int64_t array = 0;
    bool json = false;
  };
  auto show = std::make_shared<ShowArgs>();
  auto* c_show =
      app.add_subcommand("show", "Show one job, and why it waits if it does");
  auto* show_id_opt = c_show->add_option("id", show->id, "Job id");
  auto* show_sweep_opt = c_show
                             ->add_option("--sweep", show->sweep,
                                          "Instead: compare a sweep's jobs, "
                                          "their options and final metrics, "
                                          "best first")
                             ->excludes(show_id_opt);
  auto* show_array_opt =
      c_show
          ->add_option("--array", show->array,
                       "Instead: sum up an array's jobs by state, and list "
                       "them by index (best first where they report "
                       "metrics)")
          ->excludes(show_id_opt)
          ->excludes(show_sweep_opt);
  c_show->add_flag("--json", show->json, "JSON instead of text");
  c_show->callback([=] {
    if (show_sweep_opt->count() == 0 && show_id_opt->count() == 0 &&
        show_array_opt->count() == 0) {
      *rc = Report(UsageError(
          "show: give a job id, --sweep ID to compare a sweep's jobs, or "
          "--array ID to sum up an array's"));
      return;
    }
    *rc = WithConnection(*flags, [&](Connection& c) {
      if (show_array_opt->count() > 0) {
        return ShowArray(c, show->array, show->json);
      }
      return show_sweep_opt->count() > 0 ? ShowSweep(c, show->sweep, show->json)
                                         : Show(c, show->id, show->json);
    });
  });

  struct DiaryArgs {
    int64_t id = 0;
    DiaryOptions options;
  };
  auto diary = std::make_shared<DiaryArgs>();
  auto* c_diary =
      app.add_subcommand("diary", "Print a job's diary (its output)");
  c_diary->add_option("id", diary->id, "Job id")->required();
  c_diary->add_flag("-f,--follow", diary->options.follow,
                    "Keep printing until the job ends");
  c_diary->add_option("-n,--tail", diary->options.tail,
                      "Only the last N lines (with -f: then follow)");
  c_diary->add_flag("-t,--timestamps", diary->options.timestamps,
                    "Prefix each line with its time");
  c_diary
      ->add_option("--rank", diary->options.ranks,
                   "Only the lines of these ranks (the job's processes, "
                   "numbered from 0 across its parts): N, a range N-M or a "
                   "list N,M; repeatable. Where a job runs several processes "
                   "the text view prefixes each line with its rank, [N], as "
                   "srun --label does; dlbatch's own lines have no rank")
      ->type_name("RANKS")
      ->allow_extra_args(false);
  auto* diary_raw = c_diary->add_flag(
      "--raw", diary->options.raw,
      "The exact bytes the job printed. Without it, control characters "
      "(but tab) and bytes that are not UTF-8 are shown as \\xHH, so that "
      "a job cannot drive your terminal");
  c_diary
      ->add_flag("--json", diary->options.json,
                 "One JSON object a line: n (the line's number in the "
                 "job's diary, from 1), time, stream, attempt, seq (the "
                 "line's number in its part's output of the attempt), part "
                 "and rank (of the process that wrote it; null for "
                 "dlbatch's own lines); "
                 "\"text\" the line as a string (exact if it is UTF-8, "
                 "else each bad byte as U+FFFD), \"text_base64\" its "
                 "exact bytes and \"ending\" what followed them (\"\\n\", "
                 "\"\\r\\n\", or \"\" where the job's output ended "
                 "without a newline)")
      ->excludes(diary_raw);
  c_diary->callback([=] {
    // A bad --rank is refused before a scheduler is asked (or the local
    // one started).
    if (absl::Status ranks = ParseDiaryRanks(diary->options.ranks).status();
        !ranks.ok()) {
      *rc = Report(ranks);
      return;
    }
    *rc = WithConnection(*flags, [&](Connection& c) {
      return Diary(c, diary->id, diary->options);
    });
  });

  struct FetchArgs {
    int64_t id = 0;
    std::string dir;
    bool list = false;
    bool json = false;
  };
  auto fetch = std::make_shared<FetchArgs>();
  auto* c_fetch =
      app.add_subcommand("fetch-outputs", "Download a job's outputs");
  c_fetch->add_option("id", fetch->id, "Job id")->required();
  c_fetch->add_option("-o,--output", fetch->dir,
                      "Target folder (default dlbatch-ID-outputs)");
  c_fetch->add_flag("--list", fetch->list,
                    "Only list the outputs with their sizes");
  c_fetch->add_flag("--json", fetch->json,
                    "Only list the outputs, as JSON (any state)");
  c_fetch->callback([=] {
    *rc = WithConnection(*flags, [&](Connection& c) {
      return FetchOutputs(c, fetch->id, fetch->dir, fetch->list, fetch->json);
    });
  });

  auto cancel_ids = std::make_shared<std::vector<int64_t>>();
  auto cancel_array = std::make_shared<int64_t>(0);
  auto* c_cancel = app.add_subcommand("cancel", "Cancel jobs");
  auto* cancel_ids_opt = c_cancel->add_option("ids", *cancel_ids, "Job ids");
  auto* cancel_array_opt =
      c_cancel
          ->add_option("--array", *cancel_array,
                       "Instead: every queued or running job of this array")
          ->excludes(cancel_ids_opt);
  c_cancel->callback([=] {
    if (cancel_array_opt->count() == 0 && cancel_ids_opt->count() == 0) {
      *rc = Report(UsageError("cancel: give job ids, or --array ID"));
      return;
    }
    *rc = WithConnection(*flags, [&](Connection& c) -> absl::StatusOr<int> {
      if (cancel_array_opt->count() == 0) return Cancel(c, *cancel_ids);
      ASSIGN_OR_RETURN(
          std::vector<int64_t> ids,
          ArrayJobIds(c, *cancel_array,
                      {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING}));
      if (ids.empty()) {
        std::cout << "array " << *cancel_array
                  << ": no queued or running job to cancel\n";
        return 0;
      }
      return Cancel(c, ids);
    });
  });

  struct WaitArgs {
    std::vector<int64_t> ids;
    std::string timeout;
  };
  auto wait_args = std::make_shared<WaitArgs>();
  auto* c_wait = app.add_subcommand(
      "wait",
      "Wait until jobs end; exit 0 if all finished, 1 if not, 2 on timeout "
      "(or a usage error), 4 if a job does not exist");
  c_wait->add_option("ids", wait_args->ids, "Job ids")->required();
  c_wait->add_option("--timeout", wait_args->timeout,
                     "Give up after this long (e.g. 10m)");
  c_wait->callback([=] {
    int64_t timeout_ms = 0;
    if (!wait_args->timeout.empty()) {
      auto s = dlbatch::ParseDurationSeconds(wait_args->timeout);
      if (!s.ok()) {
        *rc = Report(UsageError(absl::StrCat("--timeout ", wait_args->timeout,
                                             ": ", s.status().message())));
        return;
      }
      timeout_ms = *s * 1000;
    }
    *rc = WithConnection(*flags, [&](Connection& c) {
      return Wait(c, wait_args->ids, timeout_ms);
    });
  });
}

// workers, profiles, monitor: the cluster as a whole.
void AddClusterCommands(CLI::App& app, const GlobalFlags* flags, int* rc) {
  auto workers_json = std::make_shared<bool>(false);
  auto* c_workers =
      app.add_subcommand("workers", "List workers and their devices");
  c_workers->add_flag("--json", *workers_json, "JSON instead of a table");
  c_workers->callback([=] {
    *rc = WithConnection(
        *flags, [&](Connection& c) { return Workers(c, *workers_json); });
  });

  auto profiles_json = std::make_shared<bool>(false);
  auto* c_profiles = app.add_subcommand(
      "profiles", "List cluster profiles: slots, free, queued");
  c_profiles->add_flag("--json", *profiles_json, "JSON instead of a table");
  c_profiles->callback([=] {
    *rc = WithConnection(
        *flags, [&](Connection& c) { return Profiles(c, *profiles_json); });
  });

  auto monitor_once = std::make_shared<bool>(false);
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
  c_monitor->add_flag("--once", *monitor_once,
                      "Print one plain snapshot and exit");
  c_monitor->callback([=] {
    *rc = WithConnection(
        *flags, [&](Connection& c) { return Monitor(c, *monitor_once); });
  });
}

// local start, stop and status: the embedded local cluster, which needs no
// connection options.
void AddLocalCommands(CLI::App& app, int* rc) {
  auto* c_local = app.add_subcommand(
      "local", "Start, stop or inspect the embedded local cluster");
  c_local->require_subcommand(1);
  auto local_slots = std::make_shared<int>(0);
  auto* c_local_start =
      c_local->add_subcommand("start", "Start the local scheduler and worker");
  c_local_start->add_option(
      "--cpu-slots", *local_slots,
      "CPU slots of the local worker (default: the number of cores)");
  c_local_start->callback([=] {
    auto local = LocalCluster::Resolve();
    if (!local.ok()) {
      *rc = Report(local.status());
      return;
    }
    absl::Status s = local->EnsureRunning(/*verbose=*/true, *local_slots);
    if (!s.ok()) {
      *rc = Report(s);
      return;
    }
    std::cout << local->Status();
  });
  auto local_force = std::make_shared<bool>(false);
  auto* c_local_stop = c_local->add_subcommand(
      "stop", "Stop the local scheduler and worker (not while jobs run)");
  c_local_stop->add_flag("--force", *local_force,
                         "Stop even while jobs run (they end with it)");
  c_local_stop->callback([=] { *rc = Report(StopLocal(*local_force)); });
  c_local
      ->add_subcommand("status",
                       "Is the local cluster running? (exit 0 if it is, "
                       "3 if not)")
      ->callback([=] { *rc = Report(LocalStatus()); });
}

}  // namespace

int RunCommandLine(int argc, char** argv) {
  GlobalFlags flags;
  CLI::App app{
      "dlbatch: batch jobs for deep-learning training.\n"
      "With no --scheduler (and no DLBATCH_SCHEDULER), commands use the "
      "embedded local\n"
      "cluster, started in the background on first use."};
  app.require_subcommand(1);
  AddGlobalOptions(app, &flags);
  int rc = 0;
  // The order of the commands here is the order --help lists them in.
  AddDailyCommands(app, &flags, &rc, &argc, argv);  // submit, jobs
  AddJobCommands(app, &flags, &rc);
  AddClusterCommands(app, &flags, &rc);
  AddWebCommand(app, &flags, &rc);
  AddLocalCommands(app, &rc);
  AddAdminCommands(app, &flags, &rc);
  AddControlCommands(app, &flags, &rc);  // hold, release, requeue
  // Last: the binding reads every global option declared before it.
  std::unique_ptr<ConfigBinding> config = AddConfigCommands(app, &flags, &rc);
  if (absl::Status s = config->Load(argc, argv); !s.ok()) return Report(s);
  if (auto failed = ParseCommandLine(app, argc, argv)) return *failed;
  return rc;
}

}  // namespace dlbatch::client
