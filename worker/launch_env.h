// What each process of a launched command job (`launch: per-node` or
// `launch: per-slot`) is told: torchrun's variables, computed from where
// the job's parts run. A pure function, so every case is a unit test.
//
// per-slot: one process per slot of the part (GPU or CPU slot), as torchrun
//   starts them: RANK is the slot's global rank (the part's first rank plus
//   LOCAL_RANK), WORLD_SIZE the job's pool, LOCAL_WORLD_SIZE the part's
//   slots; on CPU slots OMP_NUM_THREADS=1 (a slot is a core).
// per-node: one process per part, which is rank NODE_RANK of the parts (a
//   launcher such as torchrun inside starts NPROC_PER_NODE ranks of its
//   own): RANK=GROUP_RANK=NODE_RANK=part, WORLD_SIZE=NNODES=parts,
//   LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, NPROC_PER_NODE the part's slots; on
//   CPU slots OMP_NUM_THREADS is the part's slots.
// Both: MASTER_ADDR is part 0's address, MASTER_PORT the port part 0's
//   worker found free there, GROUP_RANK=NODE_RANK the part,
//   GROUP_WORLD_SIZE the parts, ROLE_RANK=RANK, ROLE_WORLD_SIZE=WORLD_SIZE,
//   ROLE_NAME=default (torchrun's role), DLBATCH_HOSTS every part's address
//   in part order, comma-separated. torchrun's TORCHELASTIC_* variables are
//   not set: no elastic agent runs, and TORCHELASTIC_USE_AGENT_STORE would
//   make init_process_group wait for one.
#ifndef DLBATCH_WORKER_LAUNCH_ENV_H_
#define DLBATCH_WORKER_LAUNCH_ENV_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dlbatch::worker {

inline constexpr char kLaunchPerNode[] = "per-node";
inline constexpr char kLaunchPerSlot[] = "per-slot";

struct LaunchLayout {
  std::string mode;    // kLaunchPerNode or kLaunchPerSlot
  int part = 0;        // this part, 0-based
  int parts = 1;       // parts of the job (workers it spans)
  int pool = 1;        // slots of the whole job
  int first_rank = 0;  // global rank of this part's first slot
  int slots = 1;       // this part's slots
  bool gpus = false;   // the slots are GPUs (else CPU slots)
  // Every part's address, in part order (size `parts`); part 0's is
  // MASTER_ADDR.
  std::vector<std::string> hosts;
  int master_port = 0;  // free on part 0's machine
};

// One process to start: its global rank (which labels its output) and the
// variables it gets on top of the part's.
struct RankEnv {
  int rank = 0;
  std::vector<std::pair<std::string, std::string>> env;
};

// The processes of this part, in rank order. An inconsistent layout (part
// out of range, hosts not one per part, no slots, a port out of range) is
// an error naming the field.
absl::StatusOr<std::vector<RankEnv>> LaunchRanks(const LaunchLayout& layout);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_LAUNCH_ENV_H_
