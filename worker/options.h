// dlbatch-worker's command line, configuration file and environment, read
// into plain values before the worker touches the host (startup.h does
// that). Nothing here starts a thread, writes a file or opens a socket: the
// environment comes in as a lookup, and the only files read are those the
// settings name (the configuration file, the token file, the CA).
//
// Two steps, because the daemon sets up its log between them and logs its
// settings: ParseWorkerFlags reads the command line and the configuration
// file (flag > environment > file > default, config_cli.h);
// ResolveWorkerOptions then makes of them what the worker will serve with.
// Each error is the message dlbatch-worker prints (after "dlbatch-worker: ")
// before it exits 1.
#ifndef DLBATCH_WORKER_OPTIONS_H_
#define DLBATCH_WORKER_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config_file.h"
#include "common/endpoint.h"
#include "worker/slurm_job.h"

namespace dlbatch::worker {

// Read when --config is not given (and may be missing).
inline constexpr char kWorkerConfigPath[] = "/etc/dlbatch/worker.yaml";

// The settings as given, each flag's value in effect.
struct WorkerFlags {
  std::string scheduler;  // --scheduler, else DLBATCH_SCHEDULER
  std::string profile = "local";
  std::string work_dir;
  std::string name;
  std::string token_file;
  std::string ca_file;
  int cpu_slots = 0;  // 0: the usable cores
  bool no_gpus = false;
  bool keep_job_dirs = false;
  bool no_cgroups = false;
  std::string trainer;  // "": the dlbatch-train beside the worker
  std::string host;     // --host; "": the host name
  std::vector<std::string> job_env;
  int64_t slurm_job = 0;
  int attempt = 0;
  std::string metrics_listen;
  std::string log_format = "text";
  std::string report_version;  // tests only; hidden from --help

  // The configuration file read ("" if none was) and every setting with
  // where it came from, for the start line.
  std::string config_path;
  std::vector<ConfigSetting> settings;
  // Set when the command line has been answered already: --help or
  // --version (0), or a usage error (kExitUsage), with what CLI11 prints
  // written to `out` or `err`. The process exits with it; nothing above is
  // meant to be used then.
  std::optional<int> exit_code;
};

// Reads argv, the configuration file (`config_path` unless --config names
// another) and the environment through `env`. The help goes to `out`,
// usage errors to `err` (see exit_code); an error is a configuration file
// that cannot be read or holds a bad value, naming its file, line and key.
absl::StatusOr<WorkerFlags> ParseWorkerFlags(int argc, const char* const* argv,
                                             const EnvLookup& env,
                                             const std::string& config_path,
                                             std::ostream& out,
                                             std::ostream& err);

// The flags made into what the worker serves with, before the host is
// looked at.
struct DaemonOptions {
  WorkerFlags flags;
  // --slurm-job: the Slurm job this ephemeral worker serves, read from the
  // environment srun set.
  std::optional<SlurmJobContext> slurm;
  // --work-dir, or the Slurm job's own folder under it (SlurmWorkDir); as
  // given, not yet made absolute.
  std::string work_dir;
  // The scheduler's address, the token (--token-file, else DLBATCH_TOKEN)
  // and, for TCP, the CA: the Slurm batch script's, else ResolveCa's.
  ChannelConfig channel;
};

// Errors: not started by srun as --slurm-job says; no scheduler; a bad
// address; an unreadable token file; a TCP scheduler without a token; no
// usable CA for a TCP scheduler. Each says what to pass or set.
absl::StatusOr<DaemonOptions> ResolveWorkerOptions(WorkerFlags flags,
                                                   const EnvLookup& env);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_OPTIONS_H_
