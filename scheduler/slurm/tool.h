// Running Slurm's command-line tools: sbatch, squeue, sinfo, scancel. The
// interface lets the Slurm launcher's core be driven by a fake in unit tests;
// the real one runs the programs (no shell) with a deadline.
#ifndef DLBATCH_SCHEDULER_SLURM_TOOL_H_
#define DLBATCH_SCHEDULER_SLURM_TOOL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/slurm/commands.h"

namespace dlbatch::scheduler::slurm {

struct ToolResult {
  int exit_code = 0;  // 128 + signal when killed
  std::string out;
  std::string err;
};

class SlurmTool {
 public:
  virtual ~SlurmTool() = default;
  // Runs argv (argv[0] looked up on PATH) with `input` on its standard
  // input. An error only when it could not be run or ran past the deadline
  // (then it is killed); a non-zero exit is a result.
  virtual absl::StatusOr<ToolResult> Run(const std::vector<std::string>& argv,
                                         const std::string& input) = 0;
};

// The real tools. `env` is added to the scheduler's environment for them
// (e.g. SLURM_CONF); each call may take at most `deadline_ms`.
class ProcessSlurmTool final : public SlurmTool {
 public:
  explicit ProcessSlurmTool(std::map<std::string, std::string> env = {},
                            int64_t deadline_ms = 30000);
  absl::StatusOr<ToolResult> Run(const std::vector<std::string>& argv,
                                 const std::string& input) override;

 private:
  const std::map<std::string, std::string> env_;
  const int64_t deadline_ms_;
};

// The conversations with Slurm, each one tool call.
// sbatch: the Slurm job id, or why Slurm refused (its own words).
absl::StatusOr<int64_t> SubmitBatch(SlurmTool& tool,
                                    const SlurmProfile& profile,
                                    const BatchRequest& request,
                                    const WorkerLaunch& launch);
// squeue: every job of these partitions, dlbatch's or not.
absl::StatusOr<std::vector<SqueueRow>> ReadQueue(
    SlurmTool& tool, const std::vector<std::string>& partitions);
// sinfo: the partition's limits.
absl::StatusOr<PartitionLimits> ReadPartition(SlurmTool& tool,
                                              const SlurmProfile& profile);
// sinfo -N: the partition's nodes, idle, busy or unavailable, and GPUs.
absl::StatusOr<PartitionView> ReadPartitionView(SlurmTool& tool,
                                                const SlurmProfile& profile);
// scancel: OK once the job is gone or going.
absl::Status CancelBatch(SlurmTool& tool, int64_t slurm_id);
// scancel --batch --signal (ScancelSignalArgv): OK once sent, or where the
// job is gone already.
absl::Status SignalBatch(SlurmTool& tool, int64_t slurm_id,
                         const std::string& signal);
// sinfo -N -O: each node of the profile's partition (NodeRow).
absl::StatusOr<std::vector<NodeRow>> ReadNodeRows(SlurmTool& tool,
                                                  const SlurmProfile& profile);

}  // namespace dlbatch::scheduler::slurm

#endif  // DLBATCH_SCHEDULER_SLURM_TOOL_H_
