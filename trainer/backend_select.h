// Which backend a rank trains on, from train.options.execution_environment
// (MATLAB's names) and what this process can see.
#ifndef DLBATCH_TRAINER_BACKEND_SELECT_H_
#define DLBATCH_TRAINER_BACKEND_SELECT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {

struct BackendChoice {
  bool gpu = false;
  int device = 0;    // among the visible CUDA devices, when gpu
  std::string note;  // why auto chose the CPU where GPUs are visible; or ""
};

// `environment`: auto | cpu | gpu | multi-gpu ("" is auto). `world`: ranks
// in all; `local_ranks`: the ranks on this machine (this one included);
// `local_rank`: this rank among them.
// - cpu: the CPU.
// - gpu / multi-gpu: a GPU, this rank's (local_rank); an error that says
//   what to change where none is visible or this build has no GPU backend.
// - auto: the GPUs where this build has the GPU backend and this machine
//   has at least as many visible as it has ranks, else the CPU. Machines
//   may differ: with several ranks, AgreeOnBackend makes them agree.
// Ranks on GPUs average gradients through NCCL (MakeNcclCommunicator): in a
// build without it (NcclBuilt() false), more than one GPU rank is an error
// and auto chooses the CPU. With it, each rank takes GPU `local_rank`.
absl::StatusOr<BackendChoice> ChooseBackend(const std::string& environment,
                                            int world, int local_ranks,
                                            int local_rank, int visible_gpus,
                                            bool gpu_backend_built);

// Under auto with several ranks, after each rank's ChooseBackend (`mine`):
// the GPUs where every rank chose its GPU, else the CPU for every rank
// (GPUs meet over NCCL and CPUs over Gloo, so all must choose alike), with a
// note naming a rank that had no GPU. Each rank publishes its choice in
// `rendezvous`; rank 0 decides and publishes the decision. Other
// environments, and one rank, return `mine` without a word exchanged.
// DeadlineExceeded, naming the key, where a rank does not come in `timeout`.
absl::StatusOr<BackendChoice> AgreeOnBackend(const std::string& environment,
                                             Rendezvous* rendezvous, int rank,
                                             int world, BackendChoice mine,
                                             absl::Duration timeout);

// The backend of `choice`: oneDNN on `threads` threads, or CUDA, computing
// in `precision` (train.options.precision: "" or fp32, tf32, bf16, fp16).
// tf32 is the GPU's (the CPU computes fp32); bf16 on the CPU needs AVX-512
// BF16 or AMX (CpuBf16Support), on a GPU compute capability 8.0
// (GpuLowPrecisionSupport); fp16 is the GPU's alone (7.0 on), with dynamic
// loss scaling. A precision this device cannot run is FailedPrecondition
// saying what to use instead.
absl::StatusOr<std::unique_ptr<Backend>> MakeChosenBackend(
    const BackendChoice& choice, int threads, const std::string& precision);

// Whether this build has the CUDA backend.
bool GpuBackendBuilt();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_BACKEND_SELECT_H_
