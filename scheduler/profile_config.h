// The profiles a scheduler declares: `--profile NAME[=MAX_POOL]` (or the
// file's `profile:` list) for profiles of dlbatch's own workers, and the
// `profiles:` section of scheduler.yaml, where a profile may also be of
// `type: slurm` (its machines belong to a Slurm cluster):
//
//   profiles:
//     gpu:                          # dlbatch's own workers (type: workers)
//       max_pool: 8
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
//
// Pure: checks what the file says means something, with messages naming
// the file, line, profile and key.
#ifndef DLBATCH_SCHEDULER_PROFILE_CONFIG_H_
#define DLBATCH_SCHEDULER_PROFILE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config_file.h"
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
  // Where it was declared: "flag --profile", "file PATH:LINE".
  std::string origin;
};

// The `profiles:` section's keys, for ConfigBinding::AddSection.
ConfigSection ProfilesSection();

// The file's `profiles:` items as declarations. Errors name PATH:LINE, the
// profile and the key and say what to write: an unknown type, a Slurm
// profile without a partition, a Slurm key on a profile of workers,
// sbatch_args that set what dlbatch sets itself, a relative folder.
absl::StatusOr<std::vector<ProfileDeclaration>> ProfilesFromConfig(
    const std::vector<ConfigItem>& items, const std::string& path);

// `--profile NAME` or `NAME=MAX_POOL`.
absl::StatusOr<ProfileDeclaration> ProfileFromFlag(const std::string& text);

// Every declaration together: a name declared twice (by the flags and the
// file, or twice by the flags) is an error naming both places; `local` is
// always the profile of dlbatch's own workers.
absl::Status CheckDeclarations(const std::vector<ProfileDeclaration>& all);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_PROFILE_CONFIG_H_
