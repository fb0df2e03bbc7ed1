// Which backend a rank trains on, from train.options.execution_environment
// (MATLAB's names) and what this process can see.
#ifndef DLBATCH_TRAINER_BACKEND_SELECT_H_
#define DLBATCH_TRAINER_BACKEND_SELECT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/cuda/backend_cuda.h"

namespace dlbatch::trainer {

struct BackendChoice {
  bool gpu = false;
  int device = 0;    // among the visible CUDA devices, when gpu
  std::string note;  // why auto chose the CPU where GPUs are visible; or ""
};

// What this process may train on besides the CPU (GpuSupportHere()).
struct GpuSupport {
  // OK where the GPU backend (the module, gpu_module.h) is loaded; else
  // why not, saying what to install.
  absl::Status backend =
      absl::UnavailableError("the GPU backend is not loaded");
  // The module has NCCL: ranks on GPUs can train together.
  bool nccl = false;
  // CUDA devices visible to this process (the driver's count where the
  // module is not loaded).
  int visible_gpus = 0;
};

// `environment`: auto | cpu | gpu | multi-gpu ("" is auto). `world`: ranks
// in all; `local_ranks`: the ranks on this machine (this one included);
// `local_rank`: this rank among them.
// - cpu: the CPU.
// - gpu / multi-gpu: a GPU, this rank's (local_rank); an error that says
//   what to change (or install) where none is visible or the GPU backend
//   is not there (gpus.backend's reason).
// - auto: the GPUs where the GPU backend is loaded and this machine has at
//   least as many visible as it has ranks, else the CPU (with a note where
//   GPUs are visible but the backend is not usable). Machines may differ:
//   with several ranks, AgreeOnBackend makes them agree.
// Ranks on GPUs average gradients through NCCL (MakeGpuCommunicator): where
// the module has none (gpus.nccl false), more than one GPU rank is an
// error and auto chooses the CPU. With it, each rank takes GPU `local_rank`.
absl::StatusOr<BackendChoice> ChooseBackend(const std::string& environment,
                                            int world, int local_ranks,
                                            int local_rank,
                                            const GpuSupport& gpus);

// This process's GpuSupport for `environment`. cpu never loads the GPU
// module; auto loads it only where the NVIDIA driver sees a GPU
// (DriverDeviceCount), so that a CPU run on a machine without GPUs loads
// none of CUDA's libraries; gpu and multi-gpu always load it.
GpuSupport GpuSupportHere(const std::string& environment);

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
// saying what to use instead. CUDA's comes from the GPU module
// (GpuBackendStatus() where it is not there).
absl::StatusOr<std::unique_ptr<Backend>> MakeChosenBackend(
    const BackendChoice& choice, int threads, const std::string& precision);

// Whether the GPU backend is there and loads: the module (gpu_module.h)
// and the CUDA libraries it needs. Loads it.
bool GpuBackendBuilt();
// OK where it does; else why not, saying what to install.
absl::Status GpuBackendStatus();

// The visible CUDA devices, through the GPU backend; none without it.
std::vector<CudaDeviceInfo> ListGpus();

// NCCL between ranks on GPUs (communicator_nccl.h's MakeNcclCommunicator),
// through the GPU backend; its GpuBackendStatus() where it is not there.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGpuCommunicator(
    Rendezvous* rendezvous, int rank, int size, int device,
    absl::Duration timeout);

// What dlbatch-train --version prints: the build (BuildText), then the
// GPU backend: the module it loaded and the libraries it runs on, or why
// there is none.
std::string TrainerVersionText();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_BACKEND_SELECT_H_
