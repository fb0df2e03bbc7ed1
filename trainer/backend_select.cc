#include "trainer/backend_select.h"

#include "absl/strings/str_cat.h"
#include "trainer/backend_cuda.h"
#include "trainer/communicator_nccl.h"

namespace dlbatch::trainer {

bool GpuBackendBuilt() {
#ifdef DLBATCH_HAVE_CUDA_BACKEND
  return true;
#else
  return false;
#endif
}

absl::StatusOr<BackendChoice> ChooseBackend(const std::string& environment, int world,
                                            int local_rank, int visible_gpus,
                                            bool gpu_backend_built) {
  BackendChoice c;
  const std::string env = environment.empty() ? "auto" : environment;
  if (env == "cpu") return c;
  if (env != "auto" && env != "gpu" && env != "multi-gpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.options.execution_environment: '", env, "'; use auto, cpu, gpu or multi-gpu"));
  }
  const bool want_gpu = env != "auto";
  if (!gpu_backend_built || visible_gpus <= 0) {
    if (!want_gpu) return c;
    return absl::FailedPreconditionError(absl::StrCat(
        "train.options.execution_environment: ", env, " asks for a GPU, but ",
        gpu_backend_built ? "no CUDA device is visible to this process"
                          : "this dlbatch-train was built without the GPU backend (CUDA, "
                            "cuDNN and cuBLAS were not found)",
        "; use cpu or auto, or run the job on a worker with GPUs"));
  }
  if (world > 1 && !NcclBuilt()) {
    if (!want_gpu) {
      c.note = "GPUs are visible, but ranks on GPUs need NCCL, which this dlbatch-train was "
               "built without: training on the CPU";
      return c;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "train.options.execution_environment: ", env, " with ", world,
        " ranks needs NCCL between the GPUs, which this dlbatch-train was built without; "
        "use a pool of 1 for one GPU, or cpu for data parallelism on CPUs"));
  }
  if (!want_gpu && world > visible_gpus) {
    // Every rank must choose alike, and each sees only the world and its
    // machine's GPUs: more ranks than GPUs here train on CPUs.
    c.note = absl::StrCat(world, " ranks and ", visible_gpus,
                          " visible GPU(s): training on the CPU (one rank per GPU "
                          "trains on the GPUs)");
    return c;
  }
  if (local_rank >= visible_gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", local_rank, " of this machine has no GPU: ", visible_gpus, " visible",
        world > 1 ? "; run at most one rank per GPU on each machine, or use "
                    "execution_environment: cpu"
                  : ""));
  }
  c.gpu = true;
  c.device = local_rank;
  return c;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeChosenBackend(const BackendChoice& choice,
                                                           int threads, bool tf32) {
  if (!choice.gpu) return MakeCpuBackend(threads);
  CudaBackendOptions options;
  options.tf32 = tf32;
  return MakeCudaBackend(choice.device, options);
}

}  // namespace dlbatch::trainer
