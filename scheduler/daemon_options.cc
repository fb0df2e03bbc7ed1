#include "scheduler/daemon_options.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/duration.h"
#include "common/status.h"
#include "common/version.h"
#include "scheduler/rpc/tls_certs.h"

namespace dlbatch::scheduler {
namespace {

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

// The durations and sizes of SchedulerOptions, and its profiles.
absl::Status FillSchedulerOptions(
    const DaemonFlags& flags, const std::vector<ProfileDeclaration>& profiles,
    SchedulerOptions* options) {
  ASSIGN_OR_RETURN(
      options->heartbeat_interval_ms,
      DurationMs(flags.heartbeat_interval, "--heartbeat-interval"));
  ASSIGN_OR_RETURN(options->heartbeat_timeout_ms,
                   DurationMs(flags.heartbeat_timeout, "--heartbeat-timeout"));
  ASSIGN_OR_RETURN(options->cancel_grace_ms,
                   DurationMs(flags.cancel_grace, "--cancel-grace"));
  options->max_attempts = flags.max_attempts;
  ASSIGN_OR_RETURN(options->max_diary_bytes,
                   ParseBytes(flags.max_diary_bytes, "--max-diary-bytes"));
  ASSIGN_OR_RETURN(options->max_output_bytes,
                   ParseBytes(flags.max_output_bytes, "--max-output-bytes"));
  if (flags.keep_ended == "0" || flags.keep_ended == "never") {
    options->keep_ended_ms = 0;
  } else {
    ASSIGN_OR_RETURN(options->keep_ended_ms,
                     DurationMs(flags.keep_ended, "--keep-ended"));
    // Looked at often enough that a job outlives its time by at most a
    // tenth of it (and at most a minute).
    options->retention_interval_ms =
        std::clamp<int64_t>(options->keep_ended_ms / 10, 200, 60000);
  }
  if (flags.forget_offline_after == "0" ||
      flags.forget_offline_after == "never") {
    options->forget_offline_ms = 0;
  } else {
    ASSIGN_OR_RETURN(
        options->forget_offline_ms,
        DurationMs(flags.forget_offline_after, "--forget-offline-after"));
  }
  if (flags.fair_share_half_life == "0") {
    options->fair_share_half_life_ms = 0;
  } else {
    ASSIGN_OR_RETURN(
        options->fair_share_half_life_ms,
        DurationMs(flags.fair_share_half_life, "--fair-share-half-life"));
  }
  if (!flags.restart_grace.empty()) {
    ASSIGN_OR_RETURN(options->restart_grace_ms,
                     DurationMs(flags.restart_grace, "--restart-grace"));
  }
  for (const ProfileDeclaration& p : profiles) {
    options->profiles.emplace_back(p.name, p.max_pool);
    if (p.preemption.mode != PreemptionMode::kOff)
      options->preemption[p.name] = p.preemption;
    if (p.type == ProfileType::kSlurm)
      options->slurm_profiles.push_back(p.slurm);
  }
  return absl::OkStatus();
}

// The listener's own flags: the socket's mode on a Unix socket, the
// certificate's on TCP.
absl::Status CheckListenerFlags(const DaemonFlags& flags,
                                DaemonOptions* options) {
  if (options->endpoint.is_unix) {
    const std::string& m = flags.socket_mode;
    if (m.empty() || m.size() > 4 ||
        m.find_first_not_of("01234567") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket-mode ", m,
                       ": write permissions in octal, e.g. 0600 or 0666"));
    }
    options->socket_mode =
        static_cast<mode_t>(std::stoul(m, nullptr, 8)) & 0777;
    return absl::OkStatus();
  }
  // TCP is always TLS: the operator's certificate, or one of the
  // scheduler's own CA.
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together; pass both");
  }
  if (flags.tls_cert.empty()) {
    for (const std::string& name : flags.tls_names) {
      RETURN_IF_ERROR(CheckTlsName(name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseWebListen(const std::string& text, std::string* host,
                            int* port) {
  auto bad = [&text](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--web-listen ", text, ": ", why,
        "; write HOST:PORT with an IP address, e.g. 127.0.0.1:8443 (a bare "
        "port is loopback)"));
  };
  std::string h;
  std::string p;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find("]:");
    if (close == std::string::npos) return bad("no port after the ]");
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else if (size_t colon = text.rfind(':'); colon != std::string::npos) {
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
    if (h.find(':') != std::string::npos)
      return bad("an IPv6 address goes in brackets, [::1]:8443");
  } else {
    p = text;
  }
  if (h.empty()) h = "127.0.0.1";
  int n = -1;
  if (p.empty() || !absl::SimpleAtoi(p, &n) || n < 0 || n > 65535)
    return bad("the port must be a number from 0 to 65535");
  unsigned char addr[16];
  if (::inet_pton(AF_INET, h.c_str(), addr) != 1 &&
      ::inet_pton(AF_INET6, h.c_str(), addr) != 1) {
    return bad("the host must be an IP address, not a name");
  }
  *host = h;
  *port = n;
  return absl::OkStatus();
}

std::unique_ptr<ConfigBinding> AddDaemonFlags(CLI::App& app, DaemonFlags* flags,
                                              std::string default_config_path) {
  app.add_option(
         "--state-dir", flags->state_dir,
         "Folder for the database, blobs and token (created, mode 0700)")
      ->required();
  app.add_option("--listen", flags->listen,
                 "unix:PATH or HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--profile", flags->profiles,
                 "Declare a profile of workers: NAME or NAME=MAX_POOL "
                 "(repeatable; 'local' always exists). Profiles of Slurm: "
                 "the configuration file's profiles:");
  app.add_option("--heartbeat-interval", flags->heartbeat_interval,
                 "How often workers report in")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", flags->heartbeat_timeout,
                 "Silence after which a worker is lost and its jobs requeued")
      ->capture_default_str();
  app.add_option("--cancel-grace", flags->cancel_grace,
                 "SIGTERM to SIGKILL on cancel")
      ->capture_default_str();
  app.add_option("--max-attempts", flags->max_attempts,
                 "Starts of a job (after lost workers) before it fails")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--sync-full", flags->sync_full,
      "fsync every commit (survives power loss; slower). Default survives any "
      "crash of the process");
  app.add_option(
         "--min-free-mb", flags->min_free_mb,
         "Refuse uploads that would leave less free disk in the state folder")
      ->capture_default_str();
  app.add_option("--ready-file", flags->ready_file,
                 "Write the listening address here once serving");
  app.add_option("--max-diary-bytes", flags->max_diary_bytes,
                 "A job's diary keeps at most this much (its first and last "
                 "lines, and how much was dropped between); 0: no cap")
      ->capture_default_str();
  app.add_option("--max-output-bytes", flags->max_output_bytes,
                 "A job's outputs may hold at most this much in all (e.g. "
                 "10GiB); 0: no limit")
      ->capture_default_str();
  app.add_option("--keep-ended", flags->keep_ended,
                 "Jobs ended longer ago than this are deleted with their "
                 "diary and outputs (e.g. 30d, 12h); 0: kept forever")
      ->capture_default_str();
  app.add_option("--fair-share-half-life", flags->fair_share_half_life,
                 "Among jobs of equal priority, the user with the least "
                 "usage (slot-time, halving over this long) starts first "
                 "(e.g. 7d, 12h); 0: usage never decays")
      ->capture_default_str();
  app.add_option("--forget-offline-after", flags->forget_offline_after,
                 "A lost worker is removed (its slots leave its profile, "
                 "and queued jobs that can then never run fail) this long "
                 "after it was last seen (e.g. 1h, 30m); 0: never")
      ->capture_default_str();
  app.add_option("--restart-grace", flags->restart_grace,
                 "After a start, workers known from before are lost only "
                 "after this long (default: twice --heartbeat-timeout)");
  app.add_option("--socket-mode", flags->socket_mode,
                 "Permissions of the Unix socket (octal). Callers on it are "
                 "known by their uid, so a shared cluster's may be 0666: "
                 "each user then reaches only their own jobs")
      ->capture_default_str();
  app.add_flag("--shared-visibility", flags->shared_visibility,
               "Let every user read every job's diary, progress and outputs "
               "(never another's env:, never cancel another's job)");
  app.add_option("--max-unauthenticated", flags->max_unauthenticated,
                 "TCP connections that may wait at once for their first "
                 "authenticated call; past it the oldest is closed")
      ->capture_default_str();
  app.add_option("--auth-deadline", flags->auth_deadline,
                 "A TCP connection with no authenticated call this long "
                 "after it opened is closed")
      ->capture_default_str();
  app.add_option("--tls-name", flags->tls_names,
                 "A DNS name or IP address clients reach a TCP scheduler by, "
                 "for its certificate (repeatable; the --listen address, "
                 "localhost, 127.0.0.1, ::1 and the host name are always "
                 "in it)");
  app.add_option("--tls-cert", flags->tls_cert,
                 "PEM certificate (and chain) for TCP instead of one of the "
                 "scheduler's own CA (STATE_DIR/ca.pem); with --tls-key");
  app.add_option("--tls-key", flags->tls_key, "PEM private key of --tls-cert");
  app.add_option("--metrics-listen", flags->metrics_listen,
                 "Serve Prometheus metrics, /healthz and /readyz on HOST:PORT "
                 "(e.g. 127.0.0.1:9464; keep it on loopback or a private "
                 "network); off unless set");
  app.add_option("--web-listen", flags->web_listen,
                 "Serve the web dashboard over HTTPS on HOST:PORT (e.g. "
                 "127.0.0.1:8443; a bare PORT is loopback; port 0: any free "
                 "port); users log in with their token or `dlbatch web`. Off "
                 "unless set");
  app.add_option("--web-assets", flags->web_assets,
                 "Folder of the dashboard's built files (default: "
                 "../share/dlbatch/web beside this program)");
  app.add_option("--web-session-hours", flags->web_session_hours,
                 "A web login lasts this many hours")
      ->capture_default_str();
  app.add_option("--log-format", flags->log_format,
                 "Log lines to stderr as text or json (one object per line)")
      ->capture_default_str();
  app.set_version_flag("--version", VersionText("dlbatch-scheduler"));
  auto config =
      std::make_unique<ConfigBinding>(&app, std::move(default_config_path));
  // Beside the flags' keys: `profiles:`, which may declare Slurm profiles.
  config->AddSection(ProfilesSection());
  return config;
}

absl::StatusOr<DaemonOptions> DaemonOptionsFromFlags(
    const DaemonFlags& flags, std::vector<ProfileDeclaration> profiles) {
  DaemonOptions options;
  ASSIGN_OR_RETURN(options.endpoint, ParseEndpoint(flags.listen));
  // A Slurm job's workers present its one-job token, which only TCP (TLS)
  // carries: on a Unix socket the kernel's uid would name them instead.
  for (const ProfileDeclaration& p : profiles) {
    if (p.type == ProfileType::kSlurm && options.endpoint.is_unix) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile '", p.name, "' (", p.origin,
          ") is of type slurm: its jobs' workers reach the scheduler over TCP "
          "with a token of their own; listen on TCP (--listen HOST:PORT)"));
    }
  }
  RETURN_IF_ERROR(FillSchedulerOptions(flags, profiles, &options.scheduler));
  ASSIGN_OR_RETURN(options.auth_deadline_ms,
                   DurationMs(flags.auth_deadline, "--auth-deadline"));
  if (flags.max_unauthenticated < 1) {
    return absl::InvalidArgumentError(
        "--max-unauthenticated must be at least 1");
  }
  options.max_unauthenticated = flags.max_unauthenticated;
  RETURN_IF_ERROR(CheckListenerFlags(flags, &options));
  options.state_dir = flags.state_dir;
  options.listen = flags.listen;
  options.profiles = std::move(profiles);
  options.sync_full = flags.sync_full;
  options.min_free_bytes = flags.min_free_mb << 20;
  options.ready_file = flags.ready_file;
  options.shared_visibility = flags.shared_visibility;
  options.tls_cert = flags.tls_cert;
  options.tls_key = flags.tls_key;
  options.tls_names = flags.tls_names;
  options.metrics_listen = flags.metrics_listen;
  if (!flags.web_listen.empty()) {
    RETURN_IF_ERROR(
        ParseWebListen(flags.web_listen, &options.web_host, &options.web_port));
    options.web = true;
  }
  if (flags.web_session_hours < 1 || flags.web_session_hours > 24 * 366) {
    return absl::InvalidArgumentError(
        absl::StrCat("--web-session-hours ", flags.web_session_hours,
                     ": write a number of hours from 1 to 8784, e.g. 12"));
  }
  options.web_assets = flags.web_assets;
  options.web_session_ms = int64_t{flags.web_session_hours} * 3600 * 1000;
  return options;
}

}  // namespace dlbatch::scheduler
