// dlbatch-scheduler's command line: its flags, which scheduler.yaml may set
// too (keys: the long flags with '_' for '-', and `profiles:`; see
// common/config_cli.h, whose precedence is flag > file > default: the
// scheduler reads no environment variable), and the pure step from what
// they say to the options the daemon runs with.
#ifndef DLBATCH_SCHEDULER_DAEMON_OPTIONS_H_
#define DLBATCH_SCHEDULER_DAEMON_OPTIONS_H_

#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config_cli.h"
#include "common/endpoint.h"
#include "scheduler/profile_config.h"
#include "scheduler/scheduler.h"

namespace dlbatch::scheduler {

// The flags as typed (durations and sizes are text until checked).
struct DaemonFlags {
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
  std::string forget_offline_after = "1h";  // a lost worker's removal; 0: never
  int max_unauthenticated = 256;
  std::string socket_mode = "0600";
  bool shared_visibility = false;
  std::string auth_deadline = "10s";
  std::vector<std::string> tls_names;
  std::string tls_cert;
  std::string tls_key;
  std::string metrics_listen;  // /metrics, /healthz, /readyz; off if empty
  std::string web_listen;      // the web face's HOST:PORT; off if empty
  std::string web_assets;      // the dashboard's files; "": beside the binary
  int web_session_hours = 12;
  std::string log_format = "text";
};

// The scheduler's configuration file when --config names none.
inline constexpr char kDefaultConfigPath[] = "/etc/dlbatch/scheduler.yaml";

// Declares every flag on `app`, bound to *flags, then --version and
// --config (read from `default_config_path` when not given) with the
// file's `profiles:` section. Call Load(argc, argv) on the result before
// app.parse. `app` and `flags` must outlive the result.
std::unique_ptr<ConfigBinding> AddDaemonFlags(CLI::App& app, DaemonFlags* flags,
                                              std::string default_config_path);

// What the daemon runs with, every value checked.
struct DaemonOptions {
  std::string state_dir;
  std::string listen;  // as given, for messages
  Endpoint endpoint;   // of `listen`
  SchedulerOptions scheduler;
  std::vector<ProfileDeclaration> profiles;
  bool sync_full = false;
  int64_t min_free_bytes = 0;
  std::string ready_file;  // "": none
  bool shared_visibility = false;
  // TCP: connections waiting for their first authenticated call, and how
  // long one may wait.
  int max_unauthenticated = 0;
  int64_t auth_deadline_ms = 0;
  mode_t socket_mode = 0600;  // a Unix listener's; unused on TCP
  // TCP: the operator's certificate and key (both or neither), else the
  // extra names of the scheduler's own certificate.
  std::string tls_cert;
  std::string tls_key;
  std::vector<std::string> tls_names;
  std::string metrics_listen;  // "": no metrics
  // The web face (--web-listen): its address (port 0: any free one), the
  // dashboard's folder ("": SHARE/web beside the binary) and how long a
  // login lasts.
  bool web = false;
  std::string web_host;
  int web_port = 0;
  std::string web_assets;
  int64_t web_session_ms = 0;
};

// --web-listen's HOST:PORT: a bare PORT or ":PORT" is loopback
// (127.0.0.1), "[::1]:PORT" an IPv6 address. The host must be an IP
// address; the port 0 (any free one) to 65535.
absl::Status ParseWebListen(const std::string& text, std::string* host,
                            int* port);

// Pure: checks `flags` and the declared `profiles` (profile_config.h's, in
// their order) and makes the daemon's options. A duration takes "500ms"
// too; --keep-ended and --forget-offline-after take 0 or never,
// --fair-share-half-life 0. An error names the flag and says what to
// write (the daemon prints it after "dlbatch-scheduler: "). The first
// wrong value is the one reported, in this order: --listen, a Slurm
// profile on a Unix socket, the durations and sizes, --auth-deadline,
// --max-unauthenticated, then --socket-mode (a Unix socket) or --tls-cert
// with --tls-key and each --tls-name (TCP), then --web-listen and
// --web-session-hours.
absl::StatusOr<DaemonOptions> DaemonOptionsFromFlags(
    const DaemonFlags& flags, std::vector<ProfileDeclaration> profiles);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_DAEMON_OPTIONS_H_
