// Which backend a rank trains on, from train.options.execution_environment
// (MATLAB's names) and what this process can see.
#ifndef DLBATCH_TRAINER_BACKEND_SELECT_H_
#define DLBATCH_TRAINER_BACKEND_SELECT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/backend.h"

namespace dlbatch::trainer {

struct BackendChoice {
  bool gpu = false;
  int device = 0;    // among the visible CUDA devices, when gpu
  std::string note;  // why auto chose the CPU where GPUs are visible; or ""
};

// `environment`: auto | cpu | gpu | multi-gpu ("" is auto). `world`: ranks
// in all; `local_rank`: this rank among the ranks of this machine.
// - cpu: the CPU.
// - gpu / multi-gpu: a GPU, this rank's (local_rank); an error that says
//   what to change where none is visible or this build has no GPU backend.
// - auto: the GPUs where this build has the GPU backend and there are at
//   least as many visible as ranks in all (every rank decides alike), else
//   the CPU.
// Ranks on GPUs average gradients through NCCL (MakeNcclCommunicator): in a
// build without it (NcclBuilt() false), more than one GPU rank is an error
// and auto chooses the CPU. With it, each rank takes GPU `local_rank`.
absl::StatusOr<BackendChoice> ChooseBackend(const std::string& environment, int world,
                                            int local_rank, int visible_gpus,
                                            bool gpu_backend_built);

// The backend of `choice`: oneDNN on `threads` threads, or CUDA.
absl::StatusOr<std::unique_ptr<Backend>> MakeChosenBackend(const BackendChoice& choice,
                                                           int threads, bool tf32);

// Whether this build has the CUDA backend.
bool GpuBackendBuilt();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_BACKEND_SELECT_H_
