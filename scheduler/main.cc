// dlbatch-scheduler: the daemon that owns all state. Its flags become
// options in daemon_options.h, its chores on the host are startup.h's, and
// Serve below wires the parts together.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/config_cli.h"
#include "common/files.h"
#include "common/log_format.h"
#include "common/malloc_tuning.h"
#include "common/metrics_server.h"
#include "common/sd_notify.h"
#include "common/signals.h"
#include "common/usage_exit.h"
#include "common/version.h"
#include "grpcpp/resource_quota.h"
#include "scheduler/daemon_options.h"
#include "scheduler/rpc/service.h"
#include "scheduler/startup.h"
#include "scheduler/web/api.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

// The reserve: room for the scheduler's own state changes once the disk
// is full (see disk_guard.h).
constexpr int64_t kDiskReserveBytes = int64_t{2} << 20;

int Fail(absl::string_view message) {
  std::cerr << "dlbatch-scheduler: " << message << "\n";
  return 1;
}

// Opens the state, starts the scheduler and serves until a stop signal;
// the process's exit code.
int Serve(const DaemonOptions& options) {
  const std::string db_path = options.state_dir + "/dlbatch.db";
  auto store = Store::Open(db_path, options.sync_full);
  if (!store.ok()) return Fail(store.status().message());
  StoreReader reader(db_path);
  auto blobs =
      BlobStore::Open(options.state_dir + "/blobs", options.min_free_bytes);
  if (!blobs.ok()) return Fail(blobs.status().message());
  DiskGuard disk(options.state_dir, kDiskReserveBytes);
  Scheduler scheduler(store->get(), &reader, blobs->get(), SystemClock::Get(),
                      options.scheduler, &disk);
  // Filled once the store is loaded (LoadCredentials); the scheduler adds
  // and removes the one-job credentials of its Slurm jobs.
  CredentialTable credentials;
  scheduler.slurm().set_credential_table(&credentials);
  // Metrics (--metrics-listen): up before the store loads, ready once
  // serving.
  std::atomic<bool> serving{false};
  Metrics metrics(db_path, blobs->get());
  std::unique_ptr<MetricsServer> metrics_server;
  if (!options.metrics_listen.empty()) {
    scheduler.set_metrics(&metrics);
    auto started =
        StartMetricsServer(options.metrics_listen, metrics, &serving);
    if (!started.ok()) return Fail(started.status().message());
    metrics_server = *std::move(started);
  }
  if (auto s = scheduler.Start(); !s.ok()) return Fail(s.message());
  if (auto s = LoadCredentials(&scheduler, options.state_dir,
                               !options.endpoint.is_unix, &credentials);
      !s.ok()) {
    return Fail(s.message());
  }
  PeerTable peers;
  OpenCalls open_calls;
  Identities identities(&peers, &credentials, ::geteuid());
  SchedulerService service(&scheduler, blobs->get(), &identities, &credentials,
                           &open_calls, options.shared_visibility);
  WorkerLinkService link(&scheduler, &identities, &open_calls);
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("dlbatch-scheduler");
  ConfigureServer(&builder, &quota);
  // Connections come through the scheduler's own acceptor (acceptor.h).
  ConnectionGate gate(options.max_unauthenticated, options.auth_deadline_ms,
                      SystemClock::Get());
  auto listener = Listen(options, &peers, &gate, &builder);
  if (!listener.ok()) return Fail(listener.status().message());
  if (!options.endpoint.is_unix) {
    service.set_connection_gate(&gate);
    link.set_connection_gate(&gate);
  }
  builder.RegisterService(&service);
  builder.RegisterService(&link);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    return Fail(absl::StrCat(
        "cannot listen on ", options.listen,
        " (in use, or not an address of this machine); choose another "
        "with --listen"));
  }
  // The web face (--web-listen): up once the store is loaded, down before
  // the scheduler stops; its REST API calls the scheduler as the gRPC
  // services do, under the same rules.
  web::RestApi api(&scheduler, &reader, blobs->get(),
                   options.shared_visibility);
  auto web_face = StartWebFace(options, &api, &credentials, &open_calls);
  if (!web_face.ok()) return Fail(web_face.status().message());
  ConnectWebLogins(web_face->get(), &service);
  std::unique_ptr<Acceptor>& acceptor = listener->acceptor;
  acceptor->Start(server.get());
  const std::string address = ListeningAddress(options, acceptor->port());
  spdlog::info("listening on {} (state in {})", address, options.state_dir);
  // Profiles of Slurm: sbatch, squeue, sinfo and scancel from PATH, with
  // the scheduler's environment (SLURM_CONF and the like).
  slurm::ProcessSlurmTool slurm_tool;
  if (absl::Status s = scheduler.slurm().Start(
          &slurm_tool,
          SlurmLaunches(options.profiles, address, listener->slurm_ca_pem));
      !s.ok()) {
    spdlog::error("profiles of Slurm not started: {}", s.ToString());
  }
  serving = true;
  if (!options.ready_file.empty())
    (void)WriteFileAtomic(options.ready_file, address + "\n");
  // systemd's Type=notify: ready once serving (and STOPPING=1 below).
  if (auto s = Notify(ReadyState("listening on " + address)); !s.ok())
    spdlog::warn("{}", std::string(s.message()));
  ShutDownOnStopSignal(server.get(), acceptor.get());
  server->Wait();
  serving = false;
  if (*web_face) (*web_face)->Stop();
  acceptor->Stop();
  acceptor->RemoveSocketFile();
  scheduler.Stop();
  return 0;
}

}  // namespace
}  // namespace dlbatch::scheduler

int main(int argc, char** argv) {
  using namespace dlbatch::scheduler;
  dlbatch::KeepChunkBuffersInProcess();
  // Stop signals are taken by one thread (ShutDownOnStopSignal); every
  // other thread has them blocked.
  dlbatch::BlockStopSignals();
  // Lock-order checking costs a graph lookup on every lock; the scheduler's
  // locks are few and documented.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  DaemonFlags flags;
  CLI::App app{
      "dlbatch-scheduler: queues dlbatch jobs and places them on workers"};
  std::unique_ptr<dlbatch::ConfigBinding> config =
      AddDaemonFlags(app, &flags, kDefaultConfigPath);
  if (absl::Status s = config->Load(argc, argv); !s.ok()) {
    return Fail(s.message());
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dlbatch::ExitForParseError(app, e);
  }
  if (auto s = dlbatch::SetUpLogging(flags.log_format, "dlbatch-scheduler");
      !s.ok()) {
    Fail(s.message());
    return dlbatch::kExitUsage;
  }
  spdlog::info(
      "dlbatch-scheduler {}{}; settings: {}", dlbatch::Version(),
      config->path().empty() ? "" : "; configuration " + config->path(),
      dlbatch::NonDefaultSettings(config->Settings()));
  auto profiles = DeclaredProfiles(flags, *config);
  if (!profiles.ok()) return Fail(profiles.status().message());
  auto options = DaemonOptionsFromFlags(flags, *std::move(profiles));
  if (!options.ok()) return Fail(options.status().message());
  if (absl::Status s = TakeStateDir(options->state_dir); !s.ok()) {
    return Fail(s.message());
  }
  return Serve(*options);
}
