// dlbatch-worker: runs the jobs a scheduler places on this machine.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config_cli.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/log_format.h"
#include "common/malloc_tuning.h"
#include "common/metrics_server.h"
#include "common/tls_client.h"
#include "common/usage_exit.h"
#include "common/version.h"
#include "spdlog/spdlog.h"
#include "worker/devices.h"
#include "worker/job_cgroups.h"
#include "worker/job_guard.h"
#include "worker/metrics.h"
#include "worker/slurm_job.h"
#include "worker/subprocess.h"
#include "worker/worker.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "dlbatch-worker: " << message << "\n";
  return 1;
}

// How long a signalled worker may take to stop before it just exits.
constexpr int kStopDeadlineS = 60;

}  // namespace

int main(int argc, char** argv) {
  dlbatch::KeepChunkBuffersInProcess();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::string scheduler;
  if (const char* env = std::getenv("DLBATCH_SCHEDULER")) scheduler = env;
  std::string profile = "local";
  std::string work_dir;
  std::string name;
  std::string token_file;
  std::string ca_file;
  int cpu_slots = 0;
  bool no_gpus = false;
  bool keep = false;
  bool no_cgroups = false;
  std::string trainer, host_address;
  std::vector<std::string> job_env;
  std::string metrics_listen, log_format = "text";  // metrics off if empty
  CLI::App app{
      "dlbatch-worker: runs the jobs a dlbatch scheduler places on this "
      "machine"};
  app.add_option(
      "--scheduler", scheduler,
      "Scheduler address, unix:PATH or HOST:PORT (or DLBATCH_SCHEDULER)");
  app.add_option("--profile", profile, "Profile to join")
      ->capture_default_str();
  app.add_option("--work-dir", work_dir, "Folder for the jobs' working folders")
      ->required();
  app.add_option(
      "--name", name,
      "Stable worker name (default: host name and a hash of the work folder)");
  app.add_option("--cpu-slots", cpu_slots,
                 "CPU slots to offer when no GPU is used (default: the number "
                 "of cores)")
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--no-gpus", no_gpus,
      "Offer CPU slots even where GPUs are found (to offer some of the GPUs, "
      "start the worker under CUDA_VISIBLE_DEVICES naming them)");
  app.add_option(
      "--token-file", token_file,
      "File holding the scheduler's token (or DLBATCH_TOKEN); TCP only");
  app.add_option("--ca-file", ca_file,
                 "CA a TCP scheduler's certificate must chain to (or "
                 "DLBATCH_CA; default: ca.pem beside --token-file)");
  app.add_flag("--no-cgroups", no_cgroups,
               "Do not keep each job in a cgroup of its own; find a job's "
               "processes by their process group, descent and environment "
               "instead (a job that scrubs its environment can then escape)");
  app.add_flag("--keep-job-dirs", keep,
               "Keep each job's working folder after it ends");
  app.add_option(
      "--trainer", trainer,
      "The dlbatch-train program for train: jobs (default: the one next to "
      "this program)");
  app.add_option(
      "--host", host_address,
      "Address the ranks of a job spread over workers reach this worker's "
      "ranks at (default: the host name)");
  app.add_option(
      "--job-env", job_env,
      "A variable of this worker's environment that jobs inherit (repeatable; "
      "e.g. LD_LIBRARY_PATH, NCCL_SOCKET_IFNAME). Jobs start from a clean "
      "environment: PATH, HOME, USER, LOGNAME, LANG, these, the DLBATCH_ "
      "variables the worker sets, then the job's env:");
  int64_t slurm_job = 0;
  int attempt = 0;
  app.add_option("--slurm-job", slurm_job,
                 "Set by dlbatch's Slurm batch scripts: serve only this job "
                 "(with --attempt) as the node srun started this worker on, "
                 "with the GPUs Slurm gave it, then leave")
      ->group("Slurm profiles");
  app.add_option("--attempt", attempt, "The attempt of --slurm-job")
      ->group("Slurm profiles");
  app.add_option("--metrics-listen", metrics_listen,
                 "Serve Prometheus metrics (slots; GPUs through NVML), "
                 "/healthz and /readyz on HOST:PORT (e.g. 127.0.0.1:9465); "
                 "off unless set");
  app.add_option("--log-format", log_format,
                 "Log lines to stderr as text or json (one object per line)")
      ->capture_default_str();
  // For tests only: the version this worker claims at registration, to
  // show how a scheduler refuses a worker older than it accepts. Hidden
  // from --help, never read from a configuration file.
  std::string report_version;
  app.add_option("--report-version", report_version)->group("");
  app.set_version_flag("--version", dlbatch::VersionText("dlbatch-worker"));
  dlbatch::ConfigBinding config(&app, "/etc/dlbatch/worker.yaml");
  config.SetEnv("--scheduler", "DLBATCH_SCHEDULER");
  config.SetEnv("--token-file", "DLBATCH_TOKEN", /*env_is_value=*/false);
  config.SetEnv("--ca-file", "DLBATCH_CA");
  config.Exclude("--report-version");
  config.Exclude("--slurm-job");  // set by the batch script only
  config.Exclude("--attempt");
  if (absl::Status s = config.Load(argc, argv); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dlbatch::ExitForParseError(app, e);
  }
  if (auto s = dlbatch::SetUpLogging(log_format, "dlbatch-worker"); !s.ok()) {
    Fail(std::string(s.message()));
    return dlbatch::kExitUsage;  // --log-format's value
  }

  spdlog::info("dlbatch-worker {}{}; settings: {}", dlbatch::Version(),
               config.path().empty() ? "" : "; configuration " + config.path(),
               dlbatch::NonDefaultSettings(config.Settings()));

  std::optional<dlbatch::worker::SlurmJobContext> slurm;
  if (slurm_job != 0 || attempt != 0) {
    auto context = dlbatch::worker::ReadSlurmJob(
        slurm_job, attempt, [](const char* n) { return std::getenv(n); });
    if (!context.ok()) return Fail(std::string(context.status().message()));
    slurm = *context;
    work_dir = dlbatch::worker::SlurmWorkDir(*slurm, work_dir);
  }

  if (scheduler.empty()) {
    return Fail(
        "no scheduler given; pass --scheduler unix:PATH or HOST:PORT, set "
        "DLBATCH_SCHEDULER, or write scheduler: in /etc/dlbatch/worker.yaml "
        "(or the file of --config)");
  }
  auto endpoint = dlbatch::ParseEndpoint(scheduler);
  if (!endpoint.ok()) return Fail(std::string(endpoint.status().message()));
  dlbatch::worker::WorkerOptions options;
  options.channel.endpoint = *endpoint;
  if (!token_file.empty()) {
    auto token = dlbatch::ReadTokenFile(token_file);
    if (!token.ok()) return Fail(std::string(token.status().message()));
    options.channel.token = *token;
  } else if (const char* env = std::getenv("DLBATCH_TOKEN")) {
    options.channel.token = env;
  }
  if (!endpoint->is_unix && options.channel.token.empty()) {
    return Fail(absl::StrCat(
        "a TCP scheduler (", scheduler,
        ") needs its token: pass --token-file STATE_DIR/token or set "
        "DLBATCH_TOKEN"));
  }
  // TCP is always TLS. A scheduler that is reached but not trusted is
  // reported now; one not reachable yet is waited for as always.
  if (slurm && !slurm->ca_pem.empty()) {
    options.channel.ca_pem = slurm->ca_pem;  // from the batch script
  } else if (auto s = dlbatch::ResolveCa(&options.channel, ca_file, token_file);
             !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // A Slurm job's worker has the scheduler's own CA from the batch script:
  // no probe (a TCP connection and a TLS handshake) before its first call.
  if (!slurm || slurm->ca_pem.empty()) {
    if (auto s = dlbatch::ProbeTls(options.channel, 5000);
        absl::IsFailedPrecondition(s)) {
      return Fail(std::string(s.message()));
    }
  }
  if (auto s = dlbatch::MakeDirs(work_dir + "/jobs", 0700); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  work_dir = std::filesystem::absolute(work_dir).lexically_normal().string();
  int lock_fd = ::open((work_dir + "/worker.lock").c_str(),
                       O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return Fail(absl::StrCat("another worker uses ", work_dir,
                             "; give each its own --work-dir"));
  }
  // Every process of a job is found by a mark in its environment (this work
  // folder's, then this run's) and, where the worker can make cgroups, by
  // its job's cgroup.
  const std::string folder_mark = dlbatch::Sha256Hex(work_dir).substr(0, 12);
  dlbatch::worker::GuardConfig guard;
  guard.mark_prefix = absl::StrCat(folder_mark, "-", ::getpid(), ":");
  std::string cgroup_base;
  if (!no_cgroups) {
    auto base = dlbatch::worker::MakeCgroupRoot("dlbatch-" + folder_mark);
    if (base.ok()) {
      cgroup_base = *base;
    } else {
      spdlog::warn("{}; running jobs without cgroups",
                   std::string(base.status().message()));
    }
  }
  // Jobs a previous run of this worker left behind are stale now: their
  // attempts were requeued when it was lost. A Slurm job's worker folder
  // is its own (SlurmWorkDir): no earlier run had it, so the scans of
  // every process on the node are skipped.
  int stale = 0;
  if (!slurm) {
    stale += dlbatch::worker::KillProcessesUnder(work_dir + "/jobs");
    if (!cgroup_base.empty())
      stale += dlbatch::worker::KillCgroupsUnder(cgroup_base);
    stale += dlbatch::worker::KillWorkerJobs({"", folder_mark + "-"}, 2000);
  }
  if (stale > 0) {
    spdlog::warn("killed {} process(es) of jobs a previous worker left behind",
                 stale);
  }
  if (!cgroup_base.empty()) {
    guard.cgroup_root = absl::StrCat(cgroup_base, "/w", ::getpid());
    // A previous run killed just now leaves a guard that removes the work
    // folder's cgroup once empty: it may do so between MakeCgroupRoot and
    // this mkdir, so a missing parent is made again.
    for (int tries = 0;; ++tries) {
      if (::mkdir(guard.cgroup_root.c_str(), 0755) == 0 || errno == EEXIST) {
        break;
      }
      const int err = errno;
      if (err == ENOENT && tries < 5 &&
          dlbatch::worker::MakeCgroupRoot("dlbatch-" + folder_mark).ok()) {
        continue;
      }
      return Fail(absl::StrCat("cannot make cgroup ", guard.cgroup_root, ": ",
                               std::strerror(err)));
    }
    spdlog::info("keeping each job in a cgroup under {}", guard.cgroup_root);
  } else {
    spdlog::info(
        "running jobs without cgroups: a job's processes are found by their "
        "process group, descent and environment");
  }
  // Before any thread exists (the guard is a plain fork).
  auto job_guard = dlbatch::worker::StartJobGuard(guard);
  if (!job_guard.ok()) return Fail(std::string(job_guard.status().message()));
  (void)dlbatch::RemoveTree(work_dir + "/jobs");
  (void)dlbatch::MakeDirs(work_dir + "/jobs", 0700);

  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  options.host = host_address.empty() ? std::string(host) : host_address;
  if (trainer.empty()) {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    trainer = (ec ? std::filesystem::path("dlbatch-train")
                  : self.parent_path() / "dlbatch-train")
                  .string();
  }
  if (::access(trainer.c_str(), X_OK) != 0) {
    spdlog::warn(
        "{} is not an executable; train: jobs will fail until it is "
        "(--trainer)",
        trainer);
  }
  options.trainer = trainer;
  options.job_env = job_env;
  options.name =
      name.empty()
          ? absl::StrCat(host, "-", dlbatch::Sha256Hex(work_dir).substr(0, 8))
          : name;
  options.profile = profile;
  options.work_dir = work_dir;
  options.keep_job_dirs = keep;
  options.version =
      report_version.empty() ? std::string(dlbatch::Version()) : report_version;
  std::string note;
  // Where Slurm names the GPUs it gave, they are offered as Slurm gave them
  // (ApplySlurmJob) without the CUDA runtime's probe, which initialises
  // the driver: a large part of an ephemeral worker's start on GPU nodes.
  const bool slurm_names_gpus = slurm && slurm->gpus > 0;
  if (!slurm_names_gpus) {
    if (!no_gpus && cpu_slots == 0)
      options.devices = dlbatch::worker::DiscoverGpus(&note);
    if (options.devices.empty()) {
      int slots = cpu_slots > 0 ? cpu_slots : dlbatch::worker::UsableCores();
      options.devices = dlbatch::worker::CpuSlots(slots);
      spdlog::info("offering {} CPU slots{}", slots,
                   note.empty() ? "" : " (" + note + ")");
    } else {
      spdlog::info("offering {} GPUs{}", options.devices.size(),
                   note.empty() ? "" : " (" + note + ")");
    }
  }
  if (slurm) {
    // Without GPUs, the CPUs Slurm gave the node are its slots (unless
    // --cpu-slots says otherwise).
    dlbatch::worker::ApplySlurmJob(
        *slurm, options.devices,
        cpu_slots > 0 ? cpu_slots
                      : dlbatch::worker::SlurmCpuSlots(
                            *slurm, dlbatch::worker::UsableCores()),
        &options);
    spdlog::info(
        "Slurm job {}, node {} of {}: serving dlbatch job {} attempt {} only "
        "as '{}' with {} slots",
        slurm->job.slurm_job_id(), slurm->job.node_index() + 1,
        slurm->job.nodes(), slurm->job.job_id(), slurm->job.attempt(),
        options.name, options.devices.size());
  }

  const dlbatch::Clock* clock = dlbatch::SystemClock::Get();
  std::shared_ptr<grpc::Channel> channel =
      dlbatch::MakeChannel(options.channel);
  std::unique_ptr<dlbatch::worker::LinkTransport> transport =
      dlbatch::worker::MakeGrpcLinkTransport(channel, options.channel);
  std::unique_ptr<dlbatch::worker::BlobTransfers> transfers =
      dlbatch::worker::MakeGrpcBlobTransfers(channel, options.channel.token);
  dlbatch::worker::SubprocessRunner runner(
      clock,
      dlbatch::worker::JobContainment{guard.cgroup_root, guard.mark_prefix});
  dlbatch::worker::Worker worker(options, clock, &runner, transfers.get(),
                                 transport.get());
  std::unique_ptr<dlbatch::MetricsServer> metrics;
  if (!metrics_listen.empty()) {
    auto started = dlbatch::MetricsServer::Start(
        metrics_listen,
        {dlbatch::worker::MakeWorkerMetrics(
            options.name, options.profile, options.devices.front().kind(),
            static_cast<int>(options.devices.size()),
            [&worker] { return worker.busy_slots(); })},
        [&worker] {
          return worker.connected() ? "" : "not connected to the scheduler";
        });
    if (!started.ok()) return Fail(std::string(started.status().message()));
    metrics = *std::move(started);
    spdlog::info("metrics on http://{}/metrics", metrics->address());
  }
  std::thread([&worker] {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    int sig = 0;
    sigwait(&s, &sig);
    spdlog::info("signal {}: stopping the jobs and leaving", sig);
    // Stopping kills the jobs and cancels calls, none of which may take
    // long; should anything wedge, the worker still leaves (its jobs die
    // with it: parent-death signal and cgroup).
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(kStopDeadlineS));
      spdlog::error("not stopped {} s after the signal: leaving now",
                    kStopDeadlineS);
      spdlog::shutdown();
      _exit(1);
    }).detach();
    worker.Shutdown();
  }).detach();
  absl::Status s = worker.Run();
  // The jobs are stopped: the guard's last sweep finds nothing, and the
  // worker leaves only once it has ended (a service manager would otherwise
  // SIGKILL it as a leftover of the unit).
  if (!dlbatch::worker::EndJobGuard(&*job_guard, 2000))
    spdlog::warn(
        "the job guard (pid {}) had not ended 2 s after the worker "
        "closed its pipe",
        job_guard->pid);
  if (!s.ok()) return Fail(std::string(s.message()));
  return 0;
}
