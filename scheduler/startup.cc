#include "scheduler/startup.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/sd_notify.h"
#include "common/signals.h"
#include "common/status.h"
#include "scheduler/rpc/identity.h"
#include "scheduler/rpc/tls_certs.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

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

// The soft limit (often 1024) would let a burst of idle connections
// exhaust the descriptors.
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

// The names the scheduler's own certificate carries: those of each TCP
// address it listens on (gRPC's, the web face's), so that neither
// listener's start makes the other's certificate again.
std::vector<std::string> CertificateNames(const DaemonOptions& options) {
  std::vector<std::string> names;
  auto add = [&names](const std::vector<std::string>& more) {
    for (const std::string& n : more)
      if (std::find(names.begin(), names.end(), n) == names.end())
        names.push_back(n);
  };
  if (!options.endpoint.is_unix)
    add(ServerNames(options.endpoint.host, options.tls_names));
  if (options.web) add(ServerNames(options.web_host, options.tls_names));
  return names;
}

// TCP is always TLS: the operator's certificate, or one of the scheduler's
// own CA (made on first start).
absl::StatusOr<Listener> ListenTcp(const DaemonOptions& options,
                                   ConnectionGate* gate,
                                   grpc::ServerBuilder* builder) {
  Listener listener;
  absl::StatusOr<TlsFiles> tls = ServerTls(options);
  if (!tls.ok()) return tls.status();
  if (!tls->ca_file.empty()) {
    ASSIGN_OR_RETURN(listener.slurm_ca_pem, ReadFile(tls->ca_file));
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
  builder->AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(std::min<int64_t>(options.auth_deadline_ms, INT32_MAX)));
  auto listening = Acceptor::ListenTcp(
      options.endpoint.host, options.endpoint.port, gate, *tls, builder);
  if (!listening.ok()) {
    return absl::UnavailableError(absl::StrCat(
        listening.status().message(),
        " (in use, or not an address of this machine); choose another "
        "with --listen"));
  }
  listener.acceptor = *std::move(listening);
  return listener;
}

}  // namespace

absl::StatusOr<TlsFiles> ServerTls(const DaemonOptions& options) {
  if (!options.tls_cert.empty())
    return LoadOperatorTls(options.tls_cert, options.tls_key);
  return LoadOrCreateTls(options.state_dir, CertificateNames(options));
}

absl::StatusOr<std::unique_ptr<web::WebFace>> StartWebFace(
    const DaemonOptions& options, web::ApiHandler* api,
    const CredentialTable* credentials, OpenCalls* open_calls) {
  if (!options.web) return nullptr;
  ASSIGN_OR_RETURN(TlsFiles tls, ServerTls(options));
  web::WebFaceOptions web;
  web.host = options.web_host;
  web.port = options.web_port;
  web.cert_file = tls.cert_file;
  web.key_file = tls.key_file;
  web.ca_file = tls.ca_file;
  web.assets_dir =
      options.web_assets.empty() ? web::DefaultAssetsDir() : options.web_assets;
  web.session_ms = options.web_session_ms;
  return web::WebFace::Start(web, api, credentials, open_calls,
                             SystemClock::Get());
}

void ConnectWebLogins(web::WebFace* face, SchedulerService* service) {
  if (face == nullptr) return;
  service->set_web_login(
      [face](const Caller& caller) -> absl::StatusOr<v1::CreateWebLoginReply> {
        ASSIGN_OR_RETURN(std::string url, face->LoginUrl(caller));
        v1::CreateWebLoginReply reply;
        reply.set_url(url);
        reply.set_ca_file(face->ca_file());
        return reply;
      });
}

void ShutDownOnStopSignal(grpc::Server* server, Acceptor* acceptor) {
  OnStopSignal([server, acceptor](int sig) {
    spdlog::info(
        "signal {}: shutting down; running jobs keep running on their workers",
        sig);
    (void)Notify("STOPPING=1");
    acceptor->Stop();
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  });
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    const std::string& listen, const Metrics& metrics,
    const std::atomic<bool>* serving) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<MetricsServer> server,
      MetricsServer::Start(listen, metrics.Collectables(), [serving] {
        return *serving ? "" : "not serving yet (loading the store)";
      }));
  spdlog::info("metrics on http://{}/metrics", server->address());
  return server;
}

absl::StatusOr<std::vector<ProfileDeclaration>> DeclaredProfiles(
    const DaemonFlags& flags, const ConfigBinding& config) {
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
    if (d.preemption.mode != PreemptionMode::kOff) {
      spdlog::info(
          "profile '{}': preemption {} (grace {}, min_run {}; jobs {}"
          "preemptible unless they say)",
          d.name,
          d.preemption.mode == PreemptionMode::kPriority ? "by priority"
                                                         : "by priority and "
                                                           "fair share",
          DurationText(d.preemption.grace_ms),
          DurationText(d.preemption.min_run_ms),
          d.preemption.jobs_preemptible ? "" : "not ");
    }
    all.push_back(std::move(d));
  }
  RETURN_IF_ERROR(CheckDeclarations(all));
  return all;
}

absl::Status TakeStateDir(const std::string& state_dir) {
  // So the Unix socket too is never wider than its final mode, not even
  // while bound.
  ::umask(077);
  RETURN_IF_ERROR(MakeDirs(state_dir, 0700));
  // A folder made earlier (or by someone else) may be wider: narrowed, with
  // the database files an older scheduler left readable.
  RETURN_IF_ERROR(NarrowModes(state_dir));
  RaiseOpenFileLimit();
  // One scheduler per state folder.
  std::string lock_path = state_dir + "/scheduler.lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("another scheduler is using ", state_dir,
                     "; stop it first (dlbatch local stop, or kill the pid in ",
                     state_dir, "/scheduler.pid)"));
  }
  (void)WriteFileAtomic(state_dir + "/scheduler.pid",
                        absl::StrCat(::getpid(), "\n"));
  return absl::OkStatus();
}

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
      scheduler->slurm().JobCredentials();
  if (!jobs.ok()) return jobs.status();
  for (CredentialRecord& job : *jobs) table->Put(std::move(job));
  return absl::OkStatus();
}

void ConfigureServer(grpc::ServerBuilder* builder, grpc::ResourceQuota* quota) {
  builder->SetMaxReceiveMessageSize(64 << 20);
  builder->SetMaxSendMessageSize(64 << 20);
  // Connections cost a descriptor and memory before any token is checked:
  // one that has not finished its HTTP/2 handshake within 10 s is closed,
  // one without a call for 5 minutes is closed (the CLI reconnects; worker
  // and watch streams always have a call), and silent peers are found by
  // keepalive pings.
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 * 60 * 1000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  // Memory for all connections together is bounded.
  quota->Resize(int64_t{1} << 30);
  builder->SetResourceQuota(*quota);
}

absl::StatusOr<Listener> Listen(const DaemonOptions& options, PeerTable* peers,
                                ConnectionGate* gate,
                                grpc::ServerBuilder* builder) {
  if (!options.endpoint.is_unix) return ListenTcp(options, gate, builder);
  Listener listener;
  ASSIGN_OR_RETURN(
      listener.acceptor,
      Acceptor::ListenUnix(options.endpoint.path, options.socket_mode, peers));
  return listener;
}

std::string ListeningAddress(const DaemonOptions& options, int bound_port) {
  if (options.endpoint.is_unix) return options.listen;
  const std::string& host = options.endpoint.host;
  return absl::StrCat(
      host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host,
      ":", bound_port);
}

std::map<std::string, slurm::WorkerLaunch> SlurmLaunches(
    const std::vector<ProfileDeclaration>& profiles, const std::string& address,
    const std::string& ca_pem) {
  std::map<std::string, slurm::WorkerLaunch> launch;
  for (const ProfileDeclaration& p : profiles) {
    if (p.type != ProfileType::kSlurm) continue;
    slurm::WorkerLaunch& l = launch[p.name];
    l.scheduler = p.scheduler_address.empty() ? address : p.scheduler_address;
    l.ca_pem = ca_pem;
    spdlog::info("profile '{}': Slurm partition {}, its workers dial {}",
                 p.name, p.slurm.partition, l.scheduler);
  }
  return launch;
}

}  // namespace dlbatch::scheduler
