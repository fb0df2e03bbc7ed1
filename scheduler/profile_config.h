// The profiles a scheduler declares: `--profile NAME[=MAX_POOL]` (or the
// file's `profile:` list) for profiles of dlbatch's own workers, and the
// `profiles:` section of scheduler.yaml, where a profile may also be of
// `type: slurm` (its machines belong to a Slurm cluster):
//
//   profiles:
//     gpu:                          # dlbatch's own workers (type: workers)
//       max_pool: 8
//       preemption: {mode: priority, grace: 2m, min_run: 10m}
//     cluster:
//       type: slurm
//       partition: gpu              # required
//       account: ml                 # sbatch --account
//       qos: normal                 # sbatch --qos
//       gpus_per_node: 4            # 0: CPU-only nodes
//       gres: gpu                   # --gres=<gres>:<count>
//       sbatch_args: [--constraint=a100]
//       bin_dir: /opt/dlbatch/bin   # dlbatch-worker on the nodes
//       node_dir: /scratch/dlbatch  # on every node, the jobs' folders
//       scheduler_address: head:7070  # how the nodes reach the scheduler
//       preemption:                 # any type; also block style
//         mode: fair_share          # off (the default), priority, fair_share
//         preemptible: false        # a job's default (true unless set)
//
// preemption's grace (> 0) and min_run (0: none) are durations (90s, 2m,
// 1h30m), defaulting to PreemptionPolicy's (scheduler/core/preemption.h).
//
// Pure: checks what the file says means something, with messages naming
// the file, line, profile and key.
#ifndef DLBATCH_SCHEDULER_PROFILE_CONFIG_H_
#define DLBATCH_SCHEDULER_PROFILE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config_file.h"
#include "scheduler/core/preemption.h"
#include "scheduler/slurm/commands.h"

namespace dlbatch::scheduler {

enum class ProfileType { kWorkers, kSlurm };

// "workers" or "slurm", as the file and `dlbatch profiles` write it.
std::string ProfileTypeName(ProfileType type);

struct ProfileDeclaration {
  std::string name;
  ProfileType type = ProfileType::kWorkers;
  int max_pool = 0;  // 0: what its machines have
  // For kSlurm: the profile's Slurm options (slurm.name is `name`).
  slurm::SlurmProfile slurm;
  // For kSlurm: the address the ephemeral workers dial, when it is not the
  // scheduler's --listen address (e.g. a wildcard listener's host name).
  std::string scheduler_address;
  // Whom its queued jobs may preempt; off for a --profile flag.
  PreemptionPolicy preemption;
  // Where it was declared: "flag --profile", "file PATH:LINE".
  std::string origin;
};

// The `profiles:` section's keys, for ConfigBinding::AddSection.
ConfigSection ProfilesSection();

// The file's `profiles:` items as declarations. Errors name PATH:LINE, the
// profile and the key and say what to write: an unknown type, a Slurm
// profile without a partition, a Slurm key on a profile of workers,
// sbatch_args that set what dlbatch sets itself, a relative folder, an
// unknown preemption mode, a preemption duration that is not one (or a grace
// of 0, a negative one).
absl::StatusOr<std::vector<ProfileDeclaration>> ProfilesFromConfig(
    const std::vector<ConfigItem>& items, const std::string& path);

// `--profile NAME` or `NAME=MAX_POOL`.
absl::StatusOr<ProfileDeclaration> ProfileFromFlag(const std::string& text);

// Every declaration together: a name declared by both the flags and the
// file, or twice by the file, is an error naming both places. The flags
// may repeat a name (`--profile a=4 --profile a=8`: the last max_pool
// counts, as before the file had profiles; a flag's preemption is always
// off, so nothing else can differ). `local` is always the profile of
// dlbatch's own workers.
absl::Status CheckDeclarations(const std::vector<ProfileDeclaration>& all);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_PROFILE_CONFIG_H_
