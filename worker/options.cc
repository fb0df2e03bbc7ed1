#include "worker/options.h"

#include <CLI/CLI.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config_cli.h"
#include "common/tls_client.h"
#include "common/usage_exit.h"
#include "common/version.h"

namespace dlbatch::worker {
namespace {

// Declares every flag of dlbatch-worker on `app`, bound to `f`: what
// --help shows, in its order.
void AddFlags(CLI::App& app, WorkerFlags& f) {
  app.add_option(
      "--scheduler", f.scheduler,
      "Scheduler address, unix:PATH or HOST:PORT (or DLBATCH_SCHEDULER)");
  app.add_option("--profile", f.profile, "Profile to join")
      ->capture_default_str();
  app.add_option("--work-dir", f.work_dir,
                 "Folder for the jobs' working folders")
      ->required();
  app.add_option(
      "--name", f.name,
      "Stable worker name (default: host name and a hash of the work folder)");
  app.add_option("--cpu-slots", f.cpu_slots,
                 "CPU slots to offer when no GPU is used (default: the number "
                 "of cores)")
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--no-gpus", f.no_gpus,
      "Offer CPU slots even where GPUs are found (to offer some of the GPUs, "
      "start the worker under CUDA_VISIBLE_DEVICES naming them)");
  app.add_option(
      "--token-file", f.token_file,
      "File holding the scheduler's token (or DLBATCH_TOKEN); TCP only");
  app.add_option("--ca-file", f.ca_file,
                 "CA a TCP scheduler's certificate must chain to (or "
                 "DLBATCH_CA; default: ca.pem beside --token-file)");
  app.add_flag("--no-cgroups", f.no_cgroups,
               "Do not keep each job in a cgroup of its own; find a job's "
               "processes by their process group, descent and environment "
               "instead (a job that scrubs its environment can then escape)");
  app.add_flag("--keep-job-dirs", f.keep_job_dirs,
               "Keep each job's working folder after it ends");
  app.add_option(
      "--trainer", f.trainer,
      "The dlbatch-train program for train: jobs (default: the one next to "
      "this program)");
  app.add_option(
      "--host", f.host,
      "Address the ranks of a job spread over workers reach this worker's "
      "ranks at (default: the host name)");
  app.add_option(
      "--job-env", f.job_env,
      "A variable of this worker's environment that jobs inherit (repeatable; "
      "e.g. LD_LIBRARY_PATH, NCCL_SOCKET_IFNAME). Jobs start from a clean "
      "environment: PATH, HOME, USER, LOGNAME, LANG, these, the DLBATCH_ "
      "variables the worker sets, then the job's env:");
  app.add_option("--slurm-job", f.slurm_job,
                 "Set by dlbatch's Slurm batch scripts: serve only this job "
                 "(with --attempt) as the node srun started this worker on, "
                 "with the GPUs Slurm gave it, then leave")
      ->group("Slurm profiles");
  app.add_option("--attempt", f.attempt, "The attempt of --slurm-job")
      ->group("Slurm profiles");
  app.add_option("--metrics-listen", f.metrics_listen,
                 "Serve Prometheus metrics (slots; GPUs through NVML), "
                 "/healthz and /readyz on HOST:PORT (e.g. 127.0.0.1:9465); "
                 "off unless set");
  app.add_option("--log-format", f.log_format,
                 "Log lines to stderr as text or json (one object per line)")
      ->capture_default_str();
  // For tests only: the version this worker claims at registration, to
  // show how a scheduler refuses a worker older than it accepts. Hidden
  // from --help, never read from a configuration file.
  app.add_option("--report-version", f.report_version)->group("");
  app.set_version_flag("--version", VersionText("dlbatch-worker"));
}

}  // namespace

absl::StatusOr<WorkerFlags> ParseWorkerFlags(int argc, const char* const* argv,
                                             const EnvLookup& env,
                                             const std::string& config_path,
                                             std::ostream& out,
                                             std::ostream& err) {
  WorkerFlags f;
  if (const char* value = env("DLBATCH_SCHEDULER")) f.scheduler = value;
  CLI::App app{
      "dlbatch-worker: runs the jobs a dlbatch scheduler places on this "
      "machine"};
  AddFlags(app, f);
  ConfigBinding config(&app, config_path);
  config.SetEnv("--scheduler", "DLBATCH_SCHEDULER");
  config.SetEnv("--token-file", "DLBATCH_TOKEN", /*env_is_value=*/false);
  config.SetEnv("--ca-file", "DLBATCH_CA");
  config.Exclude("--report-version");
  config.Exclude("--slurm-job");  // set by the batch script only
  config.Exclude("--attempt");
  if (absl::Status s = config.Load(argc, argv, env); !s.ok()) return s;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    f.exit_code = ExitForParseError(app, e, out, err);
    return f;
  }
  f.config_path = config.path();
  f.settings = config.Settings();
  return f;
}

absl::StatusOr<DaemonOptions> ResolveWorkerOptions(WorkerFlags flags,
                                                   const EnvLookup& env) {
  DaemonOptions o;
  o.flags = std::move(flags);
  const WorkerFlags& f = o.flags;
  o.work_dir = f.work_dir;
  if (f.slurm_job != 0 || f.attempt != 0) {
    absl::StatusOr<SlurmJobContext> context =
        ReadSlurmJob(f.slurm_job, f.attempt, env);
    if (!context.ok()) return context.status();
    o.slurm = *std::move(context);
    o.work_dir = SlurmWorkDir(*o.slurm, f.work_dir);
  }
  if (f.scheduler.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no scheduler given; pass --scheduler unix:PATH or HOST:PORT, set "
        "DLBATCH_SCHEDULER, or write scheduler: in ",
        kWorkerConfigPath, " (or the file of --config)"));
  }
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint(f.scheduler);
  if (!endpoint.ok()) return endpoint.status();
  o.channel.endpoint = *endpoint;
  if (!f.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(f.token_file);
    if (!token.ok()) return token.status();
    o.channel.token = *std::move(token);
  } else if (const char* value = env("DLBATCH_TOKEN")) {
    o.channel.token = value;
  }
  if (!endpoint->is_unix && o.channel.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a TCP scheduler (", f.scheduler,
        ") needs its token: pass --token-file STATE_DIR/token or set "
        "DLBATCH_TOKEN"));
  }
  // TCP is always TLS; a Slurm job's worker has the scheduler's own CA
  // from the batch script.
  if (o.slurm && !o.slurm->ca_pem.empty()) {
    o.channel.ca_pem = o.slurm->ca_pem;
  } else if (absl::Status s =
                 ResolveCa(&o.channel, f.ca_file, f.token_file, env);
             !s.ok()) {
    return s;
  }
  return o;
}

}  // namespace dlbatch::worker
