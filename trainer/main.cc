// dlbatch-train: trains a job file's `train:` section, as `caffe train`
// does, on CPUs; with --ranks N as N data-parallel processes.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "proto/jobspec_yaml.h"
#include "trainer/backend_select.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/communicator_nccl.h"
#include "trainer/comm/net_interface.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/launcher.h"
#include "trainer/output/progress.h"
#include "trainer/training.h"

namespace {

// A YAML job file, or with `binary` a serialised JobSpec (a worker's).
absl::StatusOr<dlbatch::ParsedJobFile> ReadJobFileAs(const std::string& path,
                                                     bool binary) {
  if (!binary) return dlbatch::ReadJobFile(path);
  absl::StatusOr<std::string> bytes = dlbatch::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  dlbatch::ParsedJobFile job;
  if (!job.spec.ParseFromString(*bytes)) {
    return absl::DataLossError(
        absl::StrCat(path, " is not a serialised JobSpec"));
  }
  return job;
}

// DLBATCH_RENDEZVOUS and its companions, as a dlbatch worker sets them.
absl::StatusOr<std::optional<dlbatch::trainer::SchedulerRendezvousConfig>>
SchedulerRendezvousFromEnvironment() {
  const char* address = std::getenv("DLBATCH_RENDEZVOUS");
  if (address == nullptr || *address == '\0') return std::nullopt;
  dlbatch::trainer::SchedulerRendezvousConfig c;
  c.address = address;
  const char* job = std::getenv("DLBATCH_JOB_ID");
  const char* attempt = std::getenv("DLBATCH_ATTEMPT");
  const char* secret = std::getenv("DLBATCH_RENDEZVOUS_SECRET");
  if (job == nullptr || attempt == nullptr || secret == nullptr ||
      !absl::SimpleAtoi(job, &c.job_id) ||
      !absl::SimpleAtoi(attempt, &c.attempt)) {
    return absl::InvalidArgumentError(
        "DLBATCH_RENDEZVOUS is set without DLBATCH_JOB_ID, DLBATCH_ATTEMPT "
        "and DLBATCH_RENDEZVOUS_SECRET");
  }
  c.secret = secret;
  return c;
}

// --list-devices: the visible GPUs, or why training would run on the CPU.
int ListDevices() {
  const auto devices = dlbatch::trainer::ListCudaDevices();
  if (devices.empty()) {
    std::printf(
        "No CUDA device visible%s; training runs on the CPU (%u cores).\n",
        dlbatch::trainer::GpuBackendBuilt()
            ? ""
            : " (this dlbatch-train was built without the GPU backend)",
        std::max(1u, std::thread::hardware_concurrency()));
    return 0;
  }
  for (const auto& d : devices) {
    std::printf("GPU %d: %s, %.1f GiB, compute capability %s\n", d.index,
                d.name.c_str(),
                static_cast<double>(d.memory_bytes) / (1024.0 * 1024 * 1024),
                d.compute_capability.c_str());
  }
  return 0;
}

int Fail(int rank, int world, const absl::Status& status) {
  if (world > 1) {
    std::fprintf(stderr, "dlbatch-train: rank %d: %s\n", rank,
                 std::string(status.message()).c_str());
  } else {
    std::fprintf(stderr, "dlbatch-train: %s\n",
                 std::string(status.message()).c_str());
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dlbatch;
  using namespace dlbatch::trainer;
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{
      "dlbatch-train: train the `train:` section of a job file with the "
      "embedded\n"
      "trainer, as `caffe train` does. Writes the model (ONNX and checkpoint), "
      "the\n"
      "training history, metrics and a progress plot to the output folder."};
  std::string job_file, output_dir, progress, rendezvous, host = "127.0.0.1";
  int ranks = 0, threads = 0, rank = -1, world = 1, first_rank = 0;
  bool spec_binary = false;
  int64_t max_epochs = 0, max_iterations = 0;
  int mini_batch_size = 0;
  std::string execution_environment;
  bool resume = false;
  bool list_devices = false;
  app.add_option("job_file", job_file, "The job file (job.yaml)");
  app.add_flag(
      "--list-devices", list_devices,
      "List the GPUs this process can train on (as gpuDevice) and exit");
  app.add_option(
         "-o,--output-dir", output_dir,
         "Where outputs and checkpoints go (default: <job name>-output)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--ranks", ranks,
                 "Data-parallel processes to start on this machine "
                 "(default: the job's pool, else 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--threads", threads,
                 "Threads per rank (default: this machine's cores / ranks)")
      ->check(CLI::Range(1, 4096))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag(
      "--resume", resume,
      "Continue from the output folder's checkpoint.dlbc if there is one");
  app.add_option("--progress", progress,
                 "Structured progress (v1.TrainProgress as JSON lines): fd:N "
                 "or a file path");
  app.add_option("--max-epochs", max_epochs,
                 "Override train.options.max_epochs")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-iterations", max_iterations,
                 "Override train.options.max_iterations")
      ->check(CLI::PositiveNumber);
  app.add_option("--mini-batch-size", mini_batch_size,
                 "Override train.options.mini_batch_size (global)")
      ->check(CLI::PositiveNumber);
  app.add_option("--execution-environment", execution_environment,
                 "Override train.options.execution_environment: auto, cpu, "
                 "gpu or multi-gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu", "multi-gpu"}));
  auto* rank_opt = app.add_option("--rank", rank,
                                  "This process's rank (set by the launcher)")
                       ->group("One rank of a launched run");
  app.add_option("--world", world, "Ranks in all")
      ->group("One rank of a launched run");
  app.add_option("--rendezvous", rendezvous,
                 "Rendezvous folder shared by the ranks")
      ->group("One rank of a launched run");
  app.add_option("--host", host, "Address this rank listens on for its peers")
      ->group("One rank of a launched run");
  app.add_option("--first-rank", first_rank,
                 "With --ranks and --world: the global rank of this machine's "
                 "first rank (a run spread over machines)")
      ->check(CLI::NonNegativeNumber)
      ->group("A run spread over machines");
  app.add_flag("--spec-binary", spec_binary,
               "job_file is a serialised JobSpec (as a dlbatch worker writes "
               "it), not YAML")
      ->group("A run spread over machines");
  app.footer(
      "Ranks meet through a folder the launcher makes or, when\n"
      "DLBATCH_RENDEZVOUS (a scheduler address) is set with DLBATCH_JOB_ID,\n"
      "DLBATCH_ATTEMPT and DLBATCH_RENDEZVOUS_SECRET, through the scheduler's\n"
      "rendezvous (as a dlbatch worker starts them).\n"
      "On a GPU, DLBATCH_CUDNN_DETERMINISTIC=1 takes deterministic cuDNN\n"
      "algorithms only (the same bits every run). With one rank on a GPU a\n"
      "training step is recorded once as a CUDA graph and replayed;\n"
      "DLBATCH_CUDA_GRAPHS=0 launches every kernel of every step instead.\n"
      "Batches reach a GPU as the data set's bytes, made into\n"
      "images there; DLBATCH_BYTES_BATCHES=0 sends the host's floats instead\n"
      "(=1 sends bytes on the CPU too). The images are the same either way.\n"
      "Each GPU convolution pass runs by cuDNN or as a matrix product over\n"
      "unfolded patches, whichever times faster when the network is built;\n"
      "DLBATCH_CONV_LOWERED=1 (the product) or 0 (cuDNN) forces one.");
  auto* world_opt = app.get_option("--world");
  CLI11_PARSE(app, argc, argv);
  if (list_devices) return ListDevices();
  if (job_file.empty()) {
    std::fprintf(stderr,
                 "dlbatch-train: a job file is required (see --help)\n");
    return 2;
  }

  absl::StatusOr<ParsedJobFile> job = ReadJobFileAs(job_file, spec_binary);
  if (!job.ok()) return Fail(0, 1, job.status());
  if (!execution_environment.empty() && job->spec.has_train()) {
    // Before anything reads it: the communicator's choice below too.
    job->spec.mutable_train()->mutable_options()->set_execution_environment(
        execution_environment);
  }
  absl::StatusOr<std::optional<SchedulerRendezvousConfig>> scheduler_rdv =
      SchedulerRendezvousFromEnvironment();
  if (!scheduler_rdv.ok()) return Fail(0, 1, scheduler_rdv.status());
  if (!job->spec.has_train()) {
    return Fail(0, 1,
                absl::InvalidArgumentError(
                    absl::StrCat(job_file,
                                 " has no train: section; dlbatch-train runs "
                                 "the embedded trainer (submit command: jobs "
                                 "with dlbatch submit)")));
  }
  const std::string name =
      job->spec.name().empty() ? "model" : job->spec.name();
  if (output_dir.empty()) output_dir = name + "-output";
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  // The ranks on this machine: the launcher's count (it tells each rank),
  // 1 for a lone rank of a run over machines; unknown where --rank was
  // given by hand, where all of them are taken to be here.
  int local_ranks = 0;
  if (rank_opt->count() == 0) {
    if (ranks == 0) ranks = std::max(1, job->spec.pool());
    RankRange range;
    range.count = ranks;
    range.first = first_rank;
    range.world = world_opt->count() > 0 ? world : ranks;
    if (range.first + range.count > range.world) {
      return Fail(
          0, 1,
          absl::InvalidArgumentError(absl::StrCat(
              "ranks ", range.first, "..", range.first + range.count - 1,
              " do not fit in --world ", range.world)));
    }
    if (range.world > 1 && range.count == 1) {
      // One rank of a run spread over machines: be it.
      rank = range.first;
      world = range.world;
      local_ranks = 1;
    } else if (range.count > 1) {
      // The launcher: start the ranks as processes of this same program.
      std::vector<std::string> args;
      for (int i = 1; i < argc; ++i) {
        // --world and --first-rank are the launcher's; each rank gets its own.
        const std::string a = argv[i];
        if ((a == "--world" || a == "--first-rank") && i + 1 < argc) {
          ++i;
          continue;
        }
        if (a.rfind("--world=", 0) == 0 || a.rfind("--first-rank=", 0) == 0) {
          continue;
        }
        args.push_back(a);
      }
      args.push_back("--threads");
      args.push_back(std::to_string(
          threads > 0 ? threads : std::max<int>(1, cores / ranks)));
      args.push_back("--output-dir");
      args.push_back(output_dir);
      std::error_code ec;
      std::filesystem::create_directories(output_dir, ec);
      const std::string dir =
          scheduler_rdv->has_value()
              ? std::string()
              : absl::StrCat(output_dir, "/.rendezvous-", getpid());
      absl::StatusOr<int> code =
          LaunchRanks("/proc/self/exe", args, range, dir);
      if (!code.ok()) return Fail(0, 1, code.status());
      return *code;
    } else {
      rank = 0;
      world = 1;
      local_ranks = 1;
    }
  }
  if (world < 1 || rank < 0 || rank >= world) {
    return Fail(rank, world,
                absl::InvalidArgumentError(absl::StrCat(
                    "--rank ", rank, " is not in [0, --world ", world, ")")));
  }

  int local_rank = 0;
  if (const char* local = std::getenv("DLBATCH_LOCAL_RANK"); local != nullptr) {
    (void)absl::SimpleAtoi(local, &local_rank);
  }
  if (const char* count = std::getenv("DLBATCH_LOCAL_RANKS");
      local_ranks == 0 && count != nullptr) {
    (void)absl::SimpleAtoi(count, &local_ranks);
  }
  if (local_ranks <= 0) local_ranks = world;
  // The device decides the collectives too (GPUs meet over NCCL, CPUs over
  // Gloo): chosen here from what this machine has, then agreed on by every
  // rank through the rendezvous (AgreeOnBackend) before the communicator.
  const std::string& environment =
      job->spec.train().options().execution_environment();
  absl::StatusOr<BackendChoice> choice =
      ChooseBackend(environment, world, local_ranks, local_rank,
                    CudaDeviceCount(), GpuBackendBuilt());
  if (!choice.ok()) return Fail(rank, world, choice.status());
  if (world > 1 && choice->gpu) {
    // Ranks on several machines: NCCL's sockets on the interface of the
    // address the worker gave (--host), as Gloo's, not NCCL's own pick.
    // Set before the rendezvous starts threads (setenv is not safe
    // beside another thread's getenv). An address on no interface here
    // leaves NCCL's pick, as before, with a word why.
    absl::StatusOr<std::optional<std::string>> ifname =
        NcclSocketInterface(host, std::getenv("NCCL_SOCKET_IFNAME"));
    if (!ifname.ok()) {
      std::fprintf(stderr,
                   "dlbatch-train: rank %d: NCCL chooses its own network "
                   "interface: %s\n",
                   rank, std::string(ifname.status().message()).c_str());
    } else if (ifname->has_value()) {
      setenv("NCCL_SOCKET_IFNAME", (*ifname)->c_str(), 1);
    }
  }
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Rendezvous> rdv;
  if (world == 1) {
    comm = MakeSoloCommunicator();
  } else {
    if (rendezvous.empty() && !scheduler_rdv->has_value()) {
      return Fail(
          rank, world,
          absl::InvalidArgumentError("--world > 1 needs --rendezvous DIR (or "
                                     "DLBATCH_RENDEZVOUS and its companions)"));
    }
    auto r = rendezvous.empty() ? OpenSchedulerRendezvous(**scheduler_rdv)
                                : OpenFileRendezvous(rendezvous);
    if (!r.ok()) return Fail(rank, world, r.status());
    rdv = std::move(r).value();
    choice = AgreeOnBackend(environment, rdv.get(), rank, world, *choice,
                            absl::Minutes(5));
    if (!choice.ok()) return Fail(rank, world, choice.status());
    auto c = choice->gpu
                 ? MakeNcclCommunicator(rdv.get(), rank, world, choice->device,
                                        absl::Minutes(5))
                 : MakeGlooCommunicator(rdv.get(), rank, world, host,
                                        absl::Minutes(5));
    if (!c.ok()) return Fail(rank, world, c.status());
    comm = std::move(c).value();
  }

  absl::StatusOr<ProgressChannel> channel =
      rank == 0 ? ProgressChannel::Open(progress) : ProgressChannel::Open("");
  if (!channel.ok()) return Fail(rank, world, channel.status());

  TrainRequest req;
  req.spec = job->spec.train();
  req.name = name;
  req.base_dir = std::filesystem::path(job_file).parent_path().string();
  if (req.base_dir.empty()) req.base_dir = ".";
  req.output_dir = output_dir;
  req.resume = resume;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    req.tuning_cache = absl::StrCat(xdg, "/dlbatch");
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    req.tuning_cache = absl::StrCat(home, "/.cache/dlbatch");
  }
  req.threads = threads > 0 ? threads : static_cast<int>(cores / world);
  if (max_epochs > 0) req.max_epochs = max_epochs;
  if (max_iterations > 0) req.max_iterations = max_iterations;
  if (mini_batch_size > 0) req.mini_batch_size = mini_batch_size;
  // Recorded steps are the default on a GPU: one launch a step instead of
  // forty-odd (bench/gpu/NOTES.md).
  absl::StatusOr<std::optional<bool>> graphs = EnvironmentSwitch(
      "DLBATCH_CUDA_GRAPHS", "record a GPU step and replay it, the default",
      "launch each kernel of every step");
  if (!graphs.ok()) return Fail(rank, world, graphs.status());
  req.record_steps = graphs->value_or(true);
  absl::StatusOr<std::optional<bool>> bytes = EnvironmentSwitch(
      "DLBATCH_BYTES_BATCHES",
      "batches as bytes, made into images on the device", "the host's floats");
  if (!bytes.ok()) return Fail(rank, world, bytes.status());
  req.batches_as_bytes = *bytes;
  // The GPU backend reads it; checked here so that a CPU run refuses a
  // typo too.
  absl::StatusOr<std::optional<bool>> lowered = ConvLoweredSwitch();
  if (!lowered.ok()) return Fail(rank, world, lowered.status());
  req.communicator = comm.get();
  req.device = *choice;
  req.rendezvous = rdv.get();
  req.progress = &*channel;
  req.diary = rank == 0 ? stdout : nullptr;
  absl::StatusOr<TrainResult> result = Train(req);
  if (!result.ok()) return Fail(rank, world, result.status());
  if (rank == 0) {
    const char* job_id = std::getenv("DLBATCH_JOB_ID");
    if (job_id != nullptr && *job_id != '\0') {
      // A dlbatch worker uploads the folder as the job's outputs.
      std::printf(
          "Outputs: model.onnx, checkpoint.dlbc, training_history.csv, "
          "metrics.json, training_progress.svg (dlbatch fetch-outputs %s).\n",
          job_id);
    } else {
      std::printf(
          "Outputs are in %s/ (model.onnx, checkpoint.dlbc, "
          "training_history.csv, metrics.json, training_progress.svg).\n",
          output_dir.c_str());
    }
  }
  return 0;
}
