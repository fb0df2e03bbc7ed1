#include "worker/launch_env.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlbatch::worker {

absl::StatusOr<std::vector<RankEnv>> LaunchRanks(const LaunchLayout& l) {
  const bool per_node = l.mode == kLaunchPerNode;
  if (!per_node && l.mode != kLaunchPerSlot) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch mode '", l.mode, "' is not per-node or per-slot"));
  }
  if (l.parts < 1 || l.part < 0 || l.part >= l.parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("part ", l.part, " of ", l.parts, " parts"));
  }
  if (static_cast<int>(l.hosts.size()) != l.parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        l.hosts.size(), " part addresses for ", l.parts, " parts"));
  }
  if (l.slots < 1 || l.first_rank < 0 || l.first_rank + l.slots > l.pool) {
    return absl::InvalidArgumentError(absl::StrCat("slots ", l.first_rank, "..",
                                                   l.first_rank + l.slots - 1,
                                                   " of a pool of ", l.pool));
  }
  if (l.master_port < 1 || l.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("master port ", l.master_port));
  }
  const int world = per_node ? l.parts : l.pool;
  const int local_world = per_node ? 1 : l.slots;
  std::vector<RankEnv> out;
  for (int local = 0; local < local_world; ++local) {
    RankEnv r;
    r.rank = per_node ? l.part : l.first_rank + local;
    r.env = {
        {"MASTER_ADDR", l.hosts[0]},
        {"MASTER_PORT", absl::StrCat(l.master_port)},
        {"WORLD_SIZE", absl::StrCat(world)},
        {"RANK", absl::StrCat(r.rank)},
        {"LOCAL_RANK", absl::StrCat(local)},
        {"LOCAL_WORLD_SIZE", absl::StrCat(local_world)},
        {"GROUP_RANK", absl::StrCat(l.part)},
        {"GROUP_WORLD_SIZE", absl::StrCat(l.parts)},
        {"NODE_RANK", absl::StrCat(l.part)},
        {"ROLE_RANK", absl::StrCat(r.rank)},
        {"ROLE_WORLD_SIZE", absl::StrCat(world)},
        {"ROLE_NAME", "default"},
        {"DLBATCH_HOSTS", absl::StrJoin(l.hosts, ",")},
    };
    if (per_node) {
      r.env.emplace_back("NNODES", absl::StrCat(l.parts));
      r.env.emplace_back("NPROC_PER_NODE", absl::StrCat(l.slots));
    }
    // A CPU slot is a core: each process's threads are its slots.
    if (!l.gpus) {
      r.env.emplace_back("OMP_NUM_THREADS",
                         absl::StrCat(per_node ? l.slots : 1));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace dlbatch::worker
