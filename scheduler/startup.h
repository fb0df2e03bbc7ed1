// dlbatch-scheduler's chores on its host, around the wiring in main.cc: what
// a stop signal does, the state folder (private, one scheduler's at a time),
// the credentials a fresh TCP scheduler starts with, the gRPC server's limits
// and the listener (a Unix socket of its mode, or TCP with TLS: the
// operator's certificate or one of the scheduler's own CA, made on first
// start), and what a Slurm job's workers are told to dial.
#ifndef DLBATCH_SCHEDULER_STARTUP_H_
#define DLBATCH_SCHEDULER_STARTUP_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config_cli.h"
#include "common/metrics_server.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "scheduler/daemon_options.h"
#include "scheduler/metrics.h"
#include "scheduler/profile_config.h"
#include "scheduler/rpc/acceptor.h"
#include "scheduler/rpc/connection_gate.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/rpc/peer_table.h"
#include "scheduler/rpc/service.h"
#include "scheduler/rpc/tls_certs.h"
#include "scheduler/scheduler.h"
#include "scheduler/web/http_message.h"
#include "scheduler/web/web_face.h"

namespace dlbatch::scheduler {

// On the first SIGTERM or SIGINT (common/signals.h's OnStopSignal): logs it,
// tells systemd STOPPING=1, stops `acceptor` handing connections to `server`
// (new ones wait in the listen queue until the process ends: gRPC would refuse
// them with an error line and keep their descriptors) and shuts `server` down
// within 2 s, which ends its Wait(). Both must outlive that Wait().
void ShutDownOnStopSignal(grpc::Server* server, Acceptor* acceptor);

// Serves `metrics` for Prometheus, with /healthz and /readyz, on `listen`
// (--metrics-listen); /readyz says ready once *serving. Logs the address.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    const std::string& listen, const Metrics& metrics,
    const std::atomic<bool>* serving);

// The profiles of --profile and of the configuration file's `profiles:`
// section (each of the file's logged as it is read), checked together.
absl::StatusOr<std::vector<ProfileDeclaration>> DeclaredProfiles(
    const DaemonFlags& flags, const ConfigBinding& config);

// Makes the state folder this process's: umask 077 (everything the
// scheduler creates is its own alone; the database holds jobs' env:
// values), the folder made or narrowed to 0700 and its files to 0600, the
// open-file limit raised to the hard limit (each connection takes a
// descriptor), then STATE_DIR/scheduler.lock locked, its descriptor kept
// open until the process ends, and the pid written to scheduler.pid. An
// error says what to do (another scheduler using the folder: stop it).
absl::Status TakeStateDir(const std::string& state_dir);

// Fills `table` from the store's credentials. With a TCP listener (`tcp`)
// and none stored yet, STATE_DIR/token (made now if missing) becomes the
// first admin's token, named after the scheduler's user: set-ups from
// before per-user tokens keep working, and that file stays the way in for
// a new cluster's first `dlbatch admin user add`.
absl::Status LoadCredentials(Scheduler* scheduler, const std::string& state_dir,
                             bool tcp, CredentialTable* table);

// The server's message sizes, connection time-outs, keepalive and memory
// bound (`quota`, which must outlive the server).
void ConfigureServer(grpc::ServerBuilder* builder, grpc::ResourceQuota* quota);

struct Listener {
  std::unique_ptr<Acceptor> acceptor;
  std::string slurm_ca_pem;  // the CA a Slurm job's workers trust; "": none
};
// Listens on options.endpoint: a Unix socket of options.socket_mode whose
// callers `peers` learns, or TCP through `gate` with TLS (the operator's
// --tls-cert, else the state folder's own CA and a certificate for the
// listen host, --tls-name and this machine's names, made if missing; the
// one in use is logged) set on `builder`. Call after ConfigureServer: on
// TCP the handshake's deadline becomes --auth-deadline.
absl::StatusOr<Listener> Listen(const DaemonOptions& options, PeerTable* peers,
                                ConnectionGate* gate,
                                grpc::ServerBuilder* builder);

// The certificate the scheduler's TLS listeners present (gRPC on TCP, the
// web face): the operator's --tls-cert, else the state folder's own, made
// or renewed for the names of every TCP address listened on.
absl::StatusOr<TlsFiles> ServerTls(const DaemonOptions& options);

// The web face (--web-listen) answering /api/v1/ with `api`, or null when
// it is off. Everything borrowed must outlive it; stop it (or destroy it)
// before the scheduler stops.
absl::StatusOr<std::unique_ptr<web::WebFace>> StartWebFace(
    const DaemonOptions& options, web::ApiHandler* api,
    const CredentialTable* credentials, OpenCalls* open_calls);
// Lets `service` answer CreateWebLogin with `face`'s one-time URLs (a
// null face: it answers that there is none).
void ConnectWebLogins(web::WebFace* face, SchedulerService* service);

// The address clients reach once listening: --listen as given for a Unix
// socket, HOST:PORT with the port bound (port 0: the one chosen) for TCP.
std::string ListeningAddress(const DaemonOptions& options, int bound_port);

// For each Slurm profile, what its jobs' workers dial: the profile's
// scheduler_address, else `address`, trusting `ca_pem`. Each is logged.
std::map<std::string, slurm::WorkerLaunch> SlurmLaunches(
    const std::vector<ProfileDeclaration>& profiles, const std::string& address,
    const std::string& ca_pem);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STARTUP_H_
