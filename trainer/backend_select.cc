#include "trainer/backend_select.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "trainer/gpu_module.h"

namespace dlbatch::trainer {

absl::Status GpuBackendStatus() {
  absl::StatusOr<const LoadedGpuModule*> m = LoadGpuModule();
  return m.ok() ? absl::OkStatus() : m.status();
}

bool GpuBackendBuilt() { return GpuBackendStatus().ok(); }

GpuSupport GpuSupportHere(const std::string& environment) {
  GpuSupport s;
  if (environment == "cpu") return s;
  const bool automatic = environment.empty() || environment == "auto";
  if (automatic) {
    s.visible_gpus = DriverDeviceCount();
    if (s.visible_gpus == 0) return s;
  }
  absl::StatusOr<const LoadedGpuModule*> m = LoadGpuModule();
  if (!m.ok()) {
    s.backend = m.status();
    return s;
  }
  s.backend = absl::OkStatus();
  s.nccl = (*m)->table->nccl_built();
  s.visible_gpus = (*m)->table->device_count();
  return s;
}

std::vector<CudaDeviceInfo> ListGpus() {
  absl::StatusOr<const LoadedGpuModule*> m = LoadGpuModule();
  if (!m.ok()) return {};
  return (*m)->table->list_devices();
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeGpuCommunicator(
    Rendezvous* rendezvous, int rank, int size, int device,
    absl::Duration timeout) {
  absl::StatusOr<const LoadedGpuModule*> m = LoadGpuModule();
  if (!m.ok()) return m.status();
  return (*m)->table->make_nccl_communicator(rendezvous, rank, size, device,
                                             timeout);
}

std::string TrainerVersionText() {
  absl::StatusOr<const LoadedGpuModule*> m = LoadGpuModule();
  const std::string build = BuildText("dlbatch-train");
  if (m.ok()) {
    return absl::StrCat(build, "\nGPU backend: loaded from ", (*m)->path, "\n",
                        (*m)->table->libraries());
  }
  // A CPU-only build (common/version.h's GpuBackendBuilt) has no module
  // to look for.
  if (!dlbatch::GpuBackendBuilt() && absl::IsNotFound(m.status()) &&
      std::getenv("DLBATCH_GPU_MODULE") == nullptr) {
    return absl::StrCat(build, "\nGPU backend: not built (CPU only)");
  }
  return absl::StrCat(
      build, "\nGPU backend: not usable (CPU only): ", m.status().message());
}

absl::StatusOr<BackendChoice> ChooseBackend(const std::string& environment,
                                            int world, int local_ranks,
                                            int local_rank,
                                            const GpuSupport& gpus) {
  BackendChoice c;
  const std::string env = environment.empty() ? "auto" : environment;
  if (env == "cpu") return c;
  if (env != "auto" && env != "gpu" && env != "multi-gpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("train.options.execution_environment: '", env,
                     "'; use auto, cpu, gpu or multi-gpu"));
  }
  const bool want_gpu = env != "auto";
  if (!gpus.backend.ok() || gpus.visible_gpus <= 0) {
    if (!want_gpu) {
      if (gpus.visible_gpus > 0) {
        c.note = absl::StrCat(gpus.visible_gpus, " GPU(s) visible, but ",
                              gpus.backend.message(), "; training on the CPU");
      }
      return c;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "train.options.execution_environment: ", env, " asks for a GPU, but ",
        gpus.backend.ok() ? "no CUDA device is visible to this process"
                          : gpus.backend.message(),
        "; use cpu or auto, or run the job on a worker with GPUs"));
  }
  if (world > 1 && !gpus.nccl) {
    if (!want_gpu) {
      c.note =
          "GPUs are visible, but ranks on GPUs need NCCL, which the GPU "
          "backend was built without: training on the CPU";
      return c;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "train.options.execution_environment: ", env, " with ", world,
        " ranks needs NCCL between the GPUs, which the GPU backend was "
        "built without; "
        "use a pool of 1 for one GPU, or cpu for data parallelism on CPUs"));
  }
  if (!want_gpu && local_ranks > gpus.visible_gpus) {
    // More ranks on this machine than GPUs: its ranks train on CPUs (and
    // AgreeOnBackend takes the other machines' ranks along).
    c.note = absl::StrCat(
        local_ranks, " rank(s) on this machine and ", gpus.visible_gpus,
        " visible GPU(s): training on the CPU (one rank per GPU "
        "trains on the GPUs)");
    return c;
  }
  if (local_rank >= gpus.visible_gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", local_rank, " of this machine has no GPU: ", gpus.visible_gpus,
        " visible",
        world > 1 ? "; run at most one rank per GPU on each machine, or use "
                    "execution_environment: cpu"
                  : ""));
  }
  c.gpu = true;
  c.device = local_rank;
  return c;
}

absl::StatusOr<BackendChoice> AgreeOnBackend(const std::string& environment,
                                             Rendezvous* rendezvous, int rank,
                                             int world, BackendChoice mine,
                                             absl::Duration timeout) {
  const bool automatic = environment.empty() || environment == "auto";
  if (!automatic || world <= 1) return mine;
  // Votes and the decision: "gpu"; or "cpu", with ":" and why where there
  // is something to say.
  constexpr char kCpuBecause[] = "cpu:";
  auto vote = [&](const BackendChoice& c) {
    return c.gpu            ? std::string("gpu")
           : c.note.empty() ? "cpu"
                            : absl::StrCat(kCpuBecause, c.note);
  };
  auto because = [&](const std::string& v) {
    return absl::StartsWith(v, kCpuBecause) ? v.substr(sizeof(kCpuBecause) - 1)
                                            : std::string();
  };
  constexpr char kDecision[] = "backend-decision";
  if (absl::Status s =
          rendezvous->Set(absl::StrCat("backend-rank", rank), vote(mine));
      !s.ok()) {
    return s;
  }
  // Rank 0: "gpu" where every rank chose its GPU; else "cpu", with the
  // first CPU rank's reason where it gave one or other ranks had GPUs
  // (which the job then leaves idle).
  std::string decision;
  if (rank == 0) {
    bool any_gpu = false;
    int first_cpu = -1;
    std::string why;
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<std::string> v =
          rendezvous->Get(absl::StrCat("backend-rank", r), timeout);
      if (!v.ok()) return v.status();
      if (*v == "gpu") {
        any_gpu = true;
      } else if (first_cpu < 0) {
        first_cpu = r;
        why = because(*v);
      }
    }
    if (first_cpu < 0) {
      decision = "gpu";
    } else if (why.empty() && !any_gpu) {
      decision = "cpu";
    } else {
      decision = absl::StrCat(kCpuBecause, "rank ", first_cpu, ": ",
                              why.empty() ? "no GPU usable" : why);
    }
    if (absl::Status s = rendezvous->Set(kDecision, decision); !s.ok())
      return s;
  } else {
    absl::StatusOr<std::string> d = rendezvous->Get(kDecision, timeout);
    if (!d.ok()) return d.status();
    decision = *d;
  }
  if (decision == "gpu") return mine;
  BackendChoice cpu;
  if (const std::string why = because(decision); !why.empty()) {
    cpu.note =
        absl::StrCat(why,
                     "; every rank trains on the CPU (ranks on GPUs need a GPU "
                     "each on every machine)");
  }
  return cpu;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeChosenBackend(
    const BackendChoice& choice, int threads, const std::string& precision) {
  if (!choice.gpu) {
    if (precision == "fp16") {
      return absl::FailedPreconditionError(
          "precision: fp16 runs on GPUs only (with dynamic loss scaling); "
          "on the CPU use bf16 (a CPU with AVX-512 BF16 or AMX) or fp32");
    }
    return MakeCpuBackend(threads, precision == "bf16");
  }
  CudaBackendOptions options;
  options.tf32 = precision == "tf32";
  using LowPrecision = CudaBackendOptions::LowPrecision;
  options.low_precision = precision == "bf16"   ? LowPrecision::kBf16
                          : precision == "fp16" ? LowPrecision::kFp16
                                                : LowPrecision::kNone;
  absl::StatusOr<const LoadedGpuModule*> m = LoadGpuModule();
  if (!m.ok()) return m.status();
  return (*m)->table->make_backend(choice.device, options);
}

}  // namespace dlbatch::trainer
