// dlbatch-scheduler: the daemon that owns all state.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config_cli.h"
#include "common/duration.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/log_format.h"
#include "common/malloc_tuning.h"
#include "common/metrics_server.h"
#include "common/sd_notify.h"
#include "common/status.h"
#include "common/usage_exit.h"
#include "common/version.h"
#include "grpcpp/resource_quota.h"
#include "scheduler/profile_config.h"
#include "scheduler/rpc/acceptor.h"
#include "scheduler/rpc/service.h"
#include "scheduler/rpc/tls_certs.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

struct Flags {
  std::string state_dir;
  std::string listen = "127.0.0.1:7070";
  std::vector<std::string> profiles;
  std::string heartbeat_interval = "1s";
  std::string heartbeat_timeout = "10s";
  std::string cancel_grace = "10s";
  int max_attempts = 3;
  bool sync_full = false;
  int64_t min_free_mb = 64;
  std::string ready_file;
  std::string max_diary_bytes = "64MiB";
  std::string max_output_bytes = "0";
  std::string keep_ended = "30d";
  std::string fair_share_half_life = "7d";
  std::string restart_grace;
  std::string forget_offline_after = "1h";  // issue 21 (slice control)
  int max_unauthenticated = 256;
  std::string socket_mode = "0600";
  bool shared_visibility = false;
  std::string auth_deadline = "10s";
  std::vector<std::string> tls_names;
  std::string tls_cert;
  std::string tls_key;
  std::string metrics_listen;  // issue 21 "Watch it"
  std::string log_format = "text";
};

constexpr int64_t kDiskReserveBytes = int64_t{2} << 20;

int Fail(const std::string& message) {
  std::cerr << "dlbatch-scheduler: " << message << "\n";
  return 1;
}

absl::StatusOr<int64_t> DurationMs(const std::string& text, const char* flag) {
  // Sub-second values are allowed here for tests: "500ms".
  if (text.size() > 2 && text.substr(text.size() - 2) == "ms") {
    int64_t ms;
    if (absl::SimpleAtoi(text.substr(0, text.size() - 2), &ms) && ms > 0)
      return ms;
  }
  auto s = ParseDurationSeconds(text);
  if (!s.ok()) return Annotate(s.status(), flag);
  return *s * 1000;
}

// "1048576", "64MiB", "2G" (powers of 1024; a trailing B or iB is
// optional).
absl::StatusOr<int64_t> ParseBytes(const std::string& text, const char* flag) {
  std::string digits = text;
  int64_t unit = 1;
  for (const char* suffix : {"iB", "B"}) {
    if (absl::EndsWith(digits, suffix) && digits.size() > strlen(suffix)) {
      digits.resize(digits.size() - strlen(suffix));
      break;
    }
  }
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k':
        unit = int64_t{1} << 10;
        break;
      case 'M':
      case 'm':
        unit = int64_t{1} << 20;
        break;
      case 'G':
      case 'g':
        unit = int64_t{1} << 30;
        break;
      case 'T':
      case 't':
        unit = int64_t{1} << 40;
        break;
      default:
        break;
    }
    if (unit > 1) digits.pop_back();
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(digits, &n) || n < 0 || n > INT64_MAX / unit) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", text, ": write a size in bytes, e.g. 1048576, 64MiB or 2G"));
  }
  return n * unit;
}

// The state folder 0700, its database files 0600.
absl::Status NarrowModes(const std::string& dir) {
  if (::chmod(dir.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, "chmod 0700 (the state folder must be private)",
                       dir);
  }
  for (const char* name :
       {"/dlbatch.db", "/dlbatch.db-wal", "/dlbatch.db-shm", "/token",
        "/scheduler.lock", "/scheduler.pid", "/ca.key", "/server.key"}) {
    std::string path = dir + name;
    if (::chmod(path.c_str(), 0600) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "chmod 0600", path);
    }
  }
  return absl::OkStatus();
}

// Fills `table` from the store's credentials. With a TCP listener and
// none stored yet, STATE_DIR/token (made now if missing) becomes the first
// admin's token, named after the scheduler's user: set-ups from before
// per-user tokens keep working, and that file stays the way in for a new
// cluster's first `dlbatch admin user add`.
absl::Status LoadCredentials(Scheduler* scheduler, const std::string& state_dir,
                             bool tcp, CredentialTable* table) {
  absl::StatusOr<std::vector<CredentialRecord>> stored =
      scheduler->users().Credentials();
  if (!stored.ok()) return stored.status();
  if (stored->empty() && tcp) {
    absl::StatusOr<std::string> token = LoadOrCreateToken(state_dir);
    if (!token.ok()) return token.status();
    CredentialRecord first;
    first.name = UserName(::geteuid());
    first.admin = true;
    first.token_sha256 = TokenSha256(*token);
    first.created_ms = absl::ToUnixMillis(absl::Now());
    if (absl::Status s = scheduler->users().PutCredential(first); !s.ok())
      return s;
    spdlog::info("{}/token is the token of admin '{}'", state_dir, first.name);
    stored->push_back(std::move(first));
  }
  table->Reset(*std::move(stored));
  // The one-job credentials of jobs submitted to Slurm: their workers
  // reconnect under them after a restart. (Added after the reset, so one
  // the scheduler adds meanwhile is never dropped.)
  absl::StatusOr<std::vector<CredentialRecord>> jobs =
      scheduler->JobCredentials();
  if (!jobs.ok()) return jobs.status();
  for (CredentialRecord& job : *jobs) table->Put(std::move(job));
  return absl::OkStatus();
}

// Each connection takes a descriptor: the soft limit (often 1024) would let
// a burst of idle connections exhaust it, so it goes up to the hard limit.
void RaiseOpenFileLimit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      spdlog::info("open-file limit raised from {} to {}", before,
                   limit.rlim_cur);
    }
  }
}

// The profiles of --profile and of the file's `profiles:` section.
absl::StatusOr<std::vector<ProfileDeclaration>> DeclaredProfiles(
    const Flags& flags, const ConfigBinding& config) {
  std::vector<ProfileDeclaration> all;
  for (const std::string& p : flags.profiles) {
    ASSIGN_OR_RETURN(ProfileDeclaration d, ProfileFromFlag(p));
    all.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(
      std::vector<ProfileDeclaration> from_file,
      ProfilesFromConfig(config.Section("profiles"), config.path()));
  for (ProfileDeclaration& d : from_file) {
    spdlog::info("profile '{}' of type {} ({}){}", d.name,
                 ProfileTypeName(d.type), d.origin,
                 d.type == ProfileType::kSlurm
                     ? absl::StrCat(": partition ", d.slurm.partition)
                     : "");
    all.push_back(std::move(d));
  }
  RETURN_IF_ERROR(CheckDeclarations(all));
  return all;
}

int Run(const Flags& flags, const std::vector<ProfileDeclaration>& profiles) {
  auto endpoint = ParseEndpoint(flags.listen);
  if (!endpoint.ok()) return Fail(std::string(endpoint.status().message()));
  // Everything the scheduler creates is its own alone (the database holds
  // jobs' env: values), whatever umask it was started under; so the Unix
  // socket too is never wider than its final mode, not even while bound.
  ::umask(077);
  if (auto s = MakeDirs(flags.state_dir, 0700); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // A folder made earlier (or by someone else) may be wider: narrowed, with
  // the database files an older scheduler left readable.
  if (auto s = NarrowModes(flags.state_dir); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  RaiseOpenFileLimit();
  // A Slurm job's workers present its one-job token, which only TCP (TLS)
  // carries: on a Unix socket the kernel's uid would name them instead.
  for (const ProfileDeclaration& p : profiles) {
    if (p.type == ProfileType::kSlurm && endpoint->is_unix) {
      return Fail(absl::StrCat(
          "profile '", p.name, "' (", p.origin,
          ") is of type slurm: its jobs' workers reach the scheduler over TCP "
          "with a token of their own; listen on TCP (--listen HOST:PORT)"));
    }
  }
  // One scheduler per state folder.
  std::string lock_path = flags.state_dir + "/scheduler.lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return Fail(
        absl::StrCat("another scheduler is using ", flags.state_dir,
                     "; stop it first (dlbatch local stop, or kill the pid in ",
                     flags.state_dir, "/scheduler.pid)"));
  }
  (void)WriteFileAtomic(flags.state_dir + "/scheduler.pid",
                        absl::StrCat(::getpid(), "\n"));

  SchedulerOptions options;
  auto interval = DurationMs(flags.heartbeat_interval, "--heartbeat-interval");
  auto timeout = DurationMs(flags.heartbeat_timeout, "--heartbeat-timeout");
  auto grace = DurationMs(flags.cancel_grace, "--cancel-grace");
  for (const auto* d : {&interval, &timeout, &grace}) {
    if (!d->ok()) return Fail(std::string(d->status().message()));
  }
  options.heartbeat_interval_ms = *interval;
  options.heartbeat_timeout_ms = *timeout;
  options.cancel_grace_ms = *grace;
  options.max_attempts = flags.max_attempts;
  auto diary_cap = ParseBytes(flags.max_diary_bytes, "--max-diary-bytes");
  auto output_cap = ParseBytes(flags.max_output_bytes, "--max-output-bytes");
  for (const auto* b : {&diary_cap, &output_cap}) {
    if (!b->ok()) return Fail(std::string(b->status().message()));
  }
  options.max_diary_bytes = *diary_cap;
  options.max_output_bytes = *output_cap;
  if (flags.keep_ended == "0" || flags.keep_ended == "never") {
    options.keep_ended_ms = 0;
  } else {
    auto keep = DurationMs(flags.keep_ended, "--keep-ended");
    if (!keep.ok()) return Fail(std::string(keep.status().message()));
    options.keep_ended_ms = *keep;
    // Looked at often enough that a job outlives its time by at most a
    // tenth of it (and at most a minute).
    options.retention_interval_ms = std::clamp<int64_t>(*keep / 10, 200, 60000);
  }
  if (flags.forget_offline_after == "0" ||
      flags.forget_offline_after == "never") {
    options.forget_offline_ms = 0;
  } else {
    auto forget =
        DurationMs(flags.forget_offline_after, "--forget-offline-after");
    if (!forget.ok()) return Fail(std::string(forget.status().message()));
    options.forget_offline_ms = *forget;
  }
  if (flags.fair_share_half_life == "0") {
    options.fair_share_half_life_ms = 0;
  } else {
    auto half_life =
        DurationMs(flags.fair_share_half_life, "--fair-share-half-life");
    if (!half_life.ok()) return Fail(std::string(half_life.status().message()));
    options.fair_share_half_life_ms = *half_life;
  }
  if (!flags.restart_grace.empty()) {
    auto grace = DurationMs(flags.restart_grace, "--restart-grace");
    if (!grace.ok()) return Fail(std::string(grace.status().message()));
    options.restart_grace_ms = *grace;
  }
  for (const ProfileDeclaration& p : profiles) {
    options.profiles.emplace_back(p.name, p.max_pool);
    if (p.type == ProfileType::kSlurm)
      options.slurm_profiles.push_back(p.slurm);
  }

  std::string db_path = flags.state_dir + "/dlbatch.db";
  auto store = Store::Open(db_path, flags.sync_full);
  if (!store.ok()) return Fail(std::string(store.status().message()));
  StoreReader reader(db_path);
  auto blobs =
      BlobStore::Open(flags.state_dir + "/blobs", flags.min_free_mb << 20);
  if (!blobs.ok()) return Fail(std::string(blobs.status().message()));

  // The reserve: room for the scheduler's own state changes once the disk
  // is full (see disk_guard.h).
  DiskGuard disk(flags.state_dir, kDiskReserveBytes);
  Scheduler scheduler(store->get(), &reader, blobs->get(), SystemClock::Get(),
                      options, &disk);
  // Filled once the store is loaded (LoadCredentials); the scheduler adds
  // and removes the one-job credentials of its Slurm jobs.
  CredentialTable credentials;
  scheduler.set_credential_table(&credentials);
  // Metrics (--metrics-listen): up before the store loads, ready once
  // serving.
  std::atomic<bool> serving{false};
  Metrics metrics(db_path, blobs->get());
  std::unique_ptr<MetricsServer> metrics_server;
  if (!flags.metrics_listen.empty()) {
    scheduler.set_metrics(&metrics);
    auto started = MetricsServer::Start(
        flags.metrics_listen, metrics.Collectables(), [&serving] {
          return serving ? "" : "not serving yet (loading the store)";
        });
    if (!started.ok()) return Fail(std::string(started.status().message()));
    metrics_server = *std::move(started);
    spdlog::info("metrics on http://{}/metrics", metrics_server->address());
  }
  if (auto s = scheduler.Start(); !s.ok())
    return Fail(std::string(s.message()));

  if (auto loaded = LoadCredentials(&scheduler, flags.state_dir,
                                    !endpoint->is_unix, &credentials);
      !loaded.ok()) {
    return Fail(std::string(loaded.message()));
  }
  PeerTable peers;
  OpenCalls open_calls;
  Identities identities(&peers, &credentials, ::geteuid());
  SchedulerService service(&scheduler, blobs->get(), &identities, &credentials,
                           &open_calls, flags.shared_visibility);
  WorkerLinkService link(&scheduler, &identities, &open_calls);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  // Connections cost a descriptor and memory before any token is checked:
  // one that has not finished its HTTP/2 handshake within 10 s is closed,
  // one without a call for 5 minutes is closed (the CLI reconnects; worker
  // and watch streams always have a call), and silent peers are found by
  // keepalive pings.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 * 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  // Memory for all connections together is bounded.
  grpc::ResourceQuota quota("dlbatch-scheduler");
  quota.Resize(int64_t{1} << 30);
  builder.SetResourceQuota(quota);
  // Connections come through the scheduler's own acceptor (acceptor.h).
  std::unique_ptr<Acceptor> acceptor;
  std::string slurm_ca_pem;  // the CA a Slurm job's workers trust
  auto auth_deadline = DurationMs(flags.auth_deadline, "--auth-deadline");
  if (!auth_deadline.ok())
    return Fail(std::string(auth_deadline.status().message()));
  if (flags.max_unauthenticated < 1) {
    return Fail("--max-unauthenticated must be at least 1");
  }
  ConnectionGate gate(flags.max_unauthenticated, *auth_deadline,
                      SystemClock::Get());
  if (endpoint->is_unix) {
    const std::string& m = flags.socket_mode;
    if (m.empty() || m.size() > 4 ||
        m.find_first_not_of("01234567") != std::string::npos) {
      return Fail(absl::StrCat("--socket-mode ", m,
                               ": write permissions in octal, e.g. 0600 or "
                               "0666"));
    }
    const mode_t socket_mode =
        static_cast<mode_t>(std::stoul(m, nullptr, 8)) & 0777;
    auto listening = Acceptor::ListenUnix(endpoint->path, socket_mode, &peers);
    if (!listening.ok()) return Fail(std::string(listening.status().message()));
    acceptor = std::move(*listening);
  } else {
    // TCP is always TLS: the operator's certificate, or one of the
    // scheduler's own CA (made on first start).
    if (flags.tls_cert.empty() != flags.tls_key.empty()) {
      return Fail("--tls-cert and --tls-key go together; pass both");
    }
    absl::StatusOr<TlsFiles> tls;
    if (!flags.tls_cert.empty()) {
      tls = LoadOperatorTls(flags.tls_cert, flags.tls_key);
    } else {
      for (const std::string& name : flags.tls_names) {
        if (auto s = CheckTlsName(name); !s.ok()) {
          return Fail(std::string(s.message()));
        }
      }
      tls = LoadOrCreateTls(flags.state_dir,
                            ServerNames(endpoint->host, flags.tls_names));
    }
    if (!tls.ok()) return Fail(std::string(tls.status().message()));
    if (!tls->ca_file.empty()) {
      auto pem = ReadFile(tls->ca_file);
      if (!pem.ok()) return Fail(std::string(pem.status().message()));
      slurm_ca_pem = *pem;
    }
    if (tls->ca_file.empty()) {
      spdlog::info(
          "TLS with certificate {}: clients and workers pass the CA that "
          "signed it as --ca-file (or DLBATCH_CA)",
          tls->cert_file);
    } else {
      spdlog::info(
          "TLS with certificate {}{}: clients and workers pass --ca-file {} "
          "(or set DLBATCH_CA){}",
          tls->cert_file, tls->made_server ? " (made now)" : "", tls->ca_file,
          tls->made_ca ? "; this CA was made now" : "");
    }
    // A handshake is bounded by the gate (in number and in time, with the
    // authentication after it); gRPC's own deadline says the same.
    builder.AddChannelArgument(
        GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
        static_cast<int>(std::min<int64_t>(*auth_deadline, INT32_MAX)));
    auto listening = Acceptor::ListenTcp(endpoint->host, endpoint->port, &gate,
                                         *tls, &builder);
    if (!listening.ok()) {
      return Fail(absl::StrCat(
          listening.status().message(),
          " (in use, or not an address of this machine); choose another "
          "with --listen"));
    }
    acceptor = std::move(*listening);
    service.set_connection_gate(&gate);
    link.set_connection_gate(&gate);
  }
  builder.RegisterService(&service);
  builder.RegisterService(&link);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    return Fail(absl::StrCat(
        "cannot listen on ", flags.listen,
        " (in use, or not an address of this machine); choose another "
        "with --listen"));
  }
  std::string address = flags.listen;
  acceptor->Start(server.get());
  if (!endpoint->is_unix) {
    address = absl::StrCat(endpoint->host.find(':') != std::string::npos
                               ? absl::StrCat("[", endpoint->host, "]")
                               : endpoint->host,
                           ":", acceptor->port());
  }
  spdlog::info("listening on {} (state in {})", address, flags.state_dir);
  // Profiles of Slurm: sbatch, squeue, sinfo and scancel from PATH, with
  // the scheduler's environment (SLURM_CONF and the like).
  slurm::ProcessSlurmTool slurm_tool;
  {
    std::map<std::string, slurm::WorkerLaunch> launch;
    for (const ProfileDeclaration& p : profiles) {
      if (p.type != ProfileType::kSlurm) continue;
      slurm::WorkerLaunch& l = launch[p.name];
      l.scheduler = p.scheduler_address.empty() ? address : p.scheduler_address;
      l.ca_pem = slurm_ca_pem;
      spdlog::info("profile '{}': Slurm partition {}, its workers dial {}",
                   p.name, p.slurm.partition, l.scheduler);
    }
    if (absl::Status s = scheduler.StartSlurm(&slurm_tool, std::move(launch));
        !s.ok()) {
      spdlog::error("profiles of Slurm not started: {}", s.ToString());
    }
  }
  serving = true;
  if (!flags.ready_file.empty())
    (void)WriteFileAtomic(flags.ready_file, address + "\n");
  // systemd's Type=notify: ready once serving (and STOPPING=1 below).
  if (auto s = Notify(ReadyState("listening on " + address)); !s.ok())
    spdlog::warn("{}", std::string(s.message()));

  // Signals are taken by one thread with sigwait; every other thread has
  // them blocked (the mask is inherited from here).
  std::thread([&server, &acceptor] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info(
        "signal {}: shutting down; running jobs keep running on their workers",
        sig);
    (void)Notify("STOPPING=1");
    // No connection is handed to a server that is shutting down (gRPC
    // would refuse it with an error line and keep its descriptor): new ones
    // wait in the listen queue until the process ends.
    acceptor->Stop();
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  }).detach();
  server->Wait();
  serving = false;
  if (acceptor) {
    acceptor->Stop();
    acceptor->RemoveSocketFile();
  }
  scheduler.Stop();
  return 0;
}

}  // namespace
}  // namespace dlbatch::scheduler

int main(int argc, char** argv) {
  dlbatch::KeepChunkBuffersInProcess();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Lock-order checking costs a graph lookup on every lock; the scheduler's
  // locks are few and documented.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  dlbatch::scheduler::Flags flags;
  CLI::App app{
      "dlbatch-scheduler: queues dlbatch jobs and places them on workers"};
  app.add_option(
         "--state-dir", flags.state_dir,
         "Folder for the database, blobs and token (created, mode 0700)")
      ->required();
  app.add_option("--listen", flags.listen,
                 "unix:PATH or HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--profile", flags.profiles,
                 "Declare a profile of workers: NAME or NAME=MAX_POOL "
                 "(repeatable; 'local' always exists). Profiles of Slurm: "
                 "the configuration file's profiles:");
  app.add_option("--heartbeat-interval", flags.heartbeat_interval,
                 "How often workers report in")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", flags.heartbeat_timeout,
                 "Silence after which a worker is lost and its jobs requeued")
      ->capture_default_str();
  app.add_option("--cancel-grace", flags.cancel_grace,
                 "SIGTERM to SIGKILL on cancel")
      ->capture_default_str();
  app.add_option("--max-attempts", flags.max_attempts,
                 "Starts of a job (after lost workers) before it fails")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--sync-full", flags.sync_full,
      "fsync every commit (survives power loss; slower). Default survives any "
      "crash of the process");
  app.add_option(
         "--min-free-mb", flags.min_free_mb,
         "Refuse uploads that would leave less free disk in the state folder")
      ->capture_default_str();
  app.add_option("--ready-file", flags.ready_file,
                 "Write the listening address here once serving");
  app.add_option("--max-diary-bytes", flags.max_diary_bytes,
                 "A job's diary keeps at most this much (its first and last "
                 "lines, and how much was dropped between); 0: no cap")
      ->capture_default_str();
  app.add_option("--max-output-bytes", flags.max_output_bytes,
                 "A job's outputs may hold at most this much in all (e.g. "
                 "10GiB); 0: no limit")
      ->capture_default_str();
  app.add_option("--keep-ended", flags.keep_ended,
                 "Jobs ended longer ago than this are deleted with their "
                 "diary and outputs (e.g. 30d, 12h); 0: kept forever")
      ->capture_default_str();
  app.add_option("--fair-share-half-life", flags.fair_share_half_life,
                 "Among jobs of equal priority, the user with the least "
                 "usage (slot-time, halving over this long) starts first "
                 "(e.g. 7d, 12h); 0: usage never decays")
      ->capture_default_str();
  app.add_option("--forget-offline-after", flags.forget_offline_after,
                 "A lost worker is removed (its slots leave its profile, "
                 "and queued jobs that can then never run fail) this long "
                 "after it was last seen (e.g. 1h, 30m); 0: never")
      ->capture_default_str();
  app.add_option("--restart-grace", flags.restart_grace,
                 "After a start, workers known from before are lost only "
                 "after this long (default: twice --heartbeat-timeout)");
  app.add_option("--socket-mode", flags.socket_mode,
                 "Permissions of the Unix socket (octal). Callers on it are "
                 "known by their uid, so a shared cluster's may be 0666: "
                 "each user then reaches only their own jobs")
      ->capture_default_str();
  app.add_flag("--shared-visibility", flags.shared_visibility,
               "Let every user read every job's diary, progress and outputs "
               "(never another's env:, never cancel another's job)");
  app.add_option("--max-unauthenticated", flags.max_unauthenticated,
                 "TCP connections that may wait at once for their first "
                 "authenticated call; past it the oldest is closed")
      ->capture_default_str();
  app.add_option("--auth-deadline", flags.auth_deadline,
                 "A TCP connection with no authenticated call this long "
                 "after it opened is closed")
      ->capture_default_str();
  app.add_option("--tls-name", flags.tls_names,
                 "A DNS name or IP address clients reach a TCP scheduler by, "
                 "for its certificate (repeatable; the --listen address, "
                 "localhost, 127.0.0.1, ::1 and the host name are always "
                 "in it)");
  app.add_option("--tls-cert", flags.tls_cert,
                 "PEM certificate (and chain) for TCP instead of one of the "
                 "scheduler's own CA (STATE_DIR/ca.pem); with --tls-key");
  app.add_option("--tls-key", flags.tls_key, "PEM private key of --tls-cert");
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "Serve Prometheus metrics, /healthz and /readyz on HOST:PORT "
                 "(e.g. 127.0.0.1:9464; keep it on loopback or a private "
                 "network); off unless set");
  app.add_option("--log-format", flags.log_format,
                 "Log lines to stderr as text or json (one object per line)")
      ->capture_default_str();
  // Versions and the configuration file (keys: the flags above, '_' for '-').
  app.set_version_flag("--version", dlbatch::VersionText("dlbatch-scheduler"));
  dlbatch::ConfigBinding config(&app, "/etc/dlbatch/scheduler.yaml");
  // Beside the flags' keys: `profiles:`, which may declare Slurm profiles.
  config.AddSection(dlbatch::scheduler::ProfilesSection());
  if (absl::Status s = config.Load(argc, argv); !s.ok()) {
    std::cerr << "dlbatch-scheduler: " << s.message() << "\n";
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dlbatch::ExitForParseError(app, e);
  }
  if (auto s = dlbatch::SetUpLogging(flags.log_format, "dlbatch-scheduler");
      !s.ok()) {
    std::cerr << "dlbatch-scheduler: " << s.message() << "\n";
    return dlbatch::kExitUsage;
  }
  spdlog::info("dlbatch-scheduler {}{}; settings: {}", dlbatch::Version(),
               config.path().empty() ? "" : "; configuration " + config.path(),
               dlbatch::NonDefaultSettings(config.Settings()));
  auto profiles = dlbatch::scheduler::DeclaredProfiles(flags, config);
  if (!profiles.ok()) {
    std::cerr << "dlbatch-scheduler: " << profiles.status().message() << "\n";
    return 1;
  }
  return dlbatch::scheduler::Run(flags, *profiles);
}
