#include "trainer/command.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "common/usage_exit.h"
#include "common/version.h"
#include "proto/jobspec_yaml.h"
#include "trainer/backend_select.h"
#include "trainer/comm/net_interface.h"
#include "trainer/options.h"
#include "trainer/output/progress.h"
#include "trainer/stop_request.h"
#include "trainer/thread_ranks.h"
#include "trainer/training.h"

namespace dlbatch::trainer {
namespace {

// A YAML job file, or with `binary` a serialised JobSpec (a worker's).
absl::StatusOr<ParsedJobFile> ReadJobFileAs(const std::string& path,
                                            bool binary) {
  if (!binary) return ReadJobFile(path);
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  ParsedJobFile job;
  if (!job.spec.ParseFromString(*bytes)) {
    return absl::DataLossError(
        absl::StrCat(path, " is not a serialised JobSpec"));
  }
  return job;
}

// --list-devices: the visible GPUs, or why training would run on the CPU.
int ListDevices() {
  const auto devices = ListGpus();
  if (devices.empty()) {
    std::printf(
        "No CUDA device visible; training runs on the CPU (%u cores).\n",
        std::max(1u, std::thread::hardware_concurrency()));
    if (const absl::Status gpu = GpuBackendStatus(); !gpu.ok()) {
      std::printf("GPU backend: %s\n", std::string(gpu.message()).c_str());
    }
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

unsigned Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Parses argv into `cl`; returns the exit code where there is nothing more
// to do (--help, a bad option).
std::optional<int> ParseCommandLine(int argc, char** argv, CommandLine* cl) {
  CLI::App app{
      "dlbatch-train: train the `train:` section of a job file with the "
      "embedded\n"
      "trainer, as `caffe train` does. Writes the model (ONNX and checkpoint), "
      "the\n"
      "training history, metrics and a progress plot to the output folder."};
  app.add_option("job_file", cl->job_file, "The job file (job.yaml)");
  app.add_flag(
      "--list-devices", cl->list_devices,
      "List the GPUs this process can train on (as gpuDevice) and exit");
  app.add_option(
         "-o,--output-dir", cl->output_dir,
         "Where outputs and checkpoints go (default: <job name>-output)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--ranks", cl->ranks,
                 "Data-parallel processes to start on this machine "
                 "(default: the job's pool, else 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--threads", cl->threads,
                 "Threads per rank (default: this machine's cores / ranks)")
      ->check(CLI::Range(1, 4096))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag(
      "--resume", cl->resume,
      "Continue from the output folder's checkpoint.dlbc if there is one");
  app.add_flag("--stop-on-term", cl->stop_on_term,
               "SIGTERM stops the run as SIGUSR1 does: the ranks agree on a "
               "step, write a checkpoint at its end and exit 75 (without "
               "it SIGTERM stops at once; a dlbatch worker in a Slurm job "
               "passes it, as Slurm's preemption sends SIGTERM)");
  app.add_option("--progress", cl->progress,
                 "Structured progress (v1.TrainProgress as JSON lines): fd:N "
                 "or a file path");
  app.add_option("--max-epochs", cl->max_epochs,
                 "Override train.options.max_epochs")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-iterations", cl->max_iterations,
                 "Override train.options.max_iterations")
      ->check(CLI::PositiveNumber);
  app.add_option("--mini-batch-size", cl->mini_batch_size,
                 "Override train.options.mini_batch_size (global)")
      ->check(CLI::PositiveNumber);
  app.add_option("--execution-environment", cl->execution_environment,
                 "Override train.options.execution_environment: auto, cpu, "
                 "gpu or multi-gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu", "multi-gpu"}));
  auto* rank_opt = app.add_option("--rank", cl->rank,
                                  "This process's rank (set by the launcher)")
                       ->group("One rank of a launched run");
  auto* world_opt = app.add_option("--world", cl->world, "Ranks in all")
                        ->group("One rank of a launched run");
  app.add_option("--rendezvous", cl->rendezvous,
                 "Rendezvous folder shared by the ranks")
      ->group("One rank of a launched run");
  app.add_option("--host", cl->host,
                 "Address this rank listens on for its peers")
      ->group("One rank of a launched run");
  app.add_option("--first-rank", cl->first_rank,
                 "With --ranks and --world: the global rank of this machine's "
                 "first rank (a run spread over machines)")
      ->check(CLI::NonNegativeNumber)
      ->group("A run spread over machines");
  app.add_flag("--thread-ranks", cl->thread_ranks,
               "Train this machine's --ranks as threads of this one process "
               "(on the CPU), not as processes; with --first-rank and "
               "--world, one such process per machine meets the others "
               "over Gloo (a dlbatch worker starts CPU jobs so)")
      ->group("A run spread over machines");
  app.add_flag("--spec-binary", cl->spec_binary,
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
      "DLBATCH_CONV_LOWERED=1 (the product) or 0 (cuDNN) forces one.\n"
      "One rank on the CPU splits each mini-batch over its threads (a\n"
      "replica each, 16 samples at least; batch norms take the whole\n"
      "mini-batch's statistics); DLBATCH_SPLIT_BATCH=0 keeps one replica\n"
      "over all threads, =1 splits down to a sample a thread.\n"
      "--thread-ranks runs --ranks as threads of one process instead of\n"
      "processes (each its own rank, as a process would be: the same\n"
      "weights), reading the data once; a dlbatch worker starts a CPU job\n"
      "so, one process per worker, the workers' processes meeting over Gloo.");
  // Lazily: it loads the GPU backend to say what it runs on.
  app.set_version_flag("--version", [] { return TrainerVersionText(); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ExitForParseError(app, e);
  }
  cl->rank_given = rank_opt->count() > 0;
  cl->world_given = world_opt->count() > 0;
  return std::nullopt;
}

// Starts the machine's ranks as processes of this same program and waits
// for them.
int Launch(const CommandLine& cl, const RankPlan& plan, int argc, char** argv,
           bool scheduler_rendezvous) {
  const std::vector<std::string> args = RankArguments(
      std::vector<std::string>(argv + 1, argv + argc),
      cl.threads > 0 ? cl.threads
                     : std::max<int>(1, Cores() / plan.range.count),
      cl.output_dir);
  std::error_code ec;
  std::filesystem::create_directories(cl.output_dir, ec);
  const std::string dir =
      scheduler_rendezvous
          ? std::string()
          : absl::StrCat(cl.output_dir, "/.rendezvous-", getpid());
  absl::StatusOr<int> code =
      LaunchRanks("/proc/self/exe", args, plan.range, dir, cl.stop_on_term);
  if (!code.ok()) return Fail(0, 1, code.status());
  return *code;
}

// The ranks' collectives, and the backend every rank agreed on.
struct Connection {
  BackendChoice choice;
  std::unique_ptr<Rendezvous> rendezvous;
  // The rank's communicator; for --thread-ranks over several processes,
  // the processes' (one rank per process), with each one's first rank.
  std::unique_ptr<Communicator> communicator;
  std::vector<int> first_ranks;
};

// --thread-ranks: the ranks share this process's CPU, so auto means the
// CPU here, and gpu or multi-gpu is refused (a GPU needs a process of its
// own). Over several processes, they meet through the rendezvous and
// connect over Gloo, one rank per process.
absl::StatusOr<Connection> ConnectThreadRanks(
    const CommandLine& cl, const RankPlan& plan, const std::string& environment,
    const std::optional<SchedulerRendezvousConfig>& scheduler_rdv) {
  const bool automatic = environment.empty() || environment == "auto";
  Connection c;
  // Auto asks for no GPU (so loads no GPU backend); gpu or multi-gpu is
  // told what this machine has, and refused below.
  ASSIGN_OR_RETURN(
      c.choice,
      ChooseBackend(environment, plan.world, plan.thread_ranks, 0,
                    automatic ? GpuSupport{} : GpuSupportHere(environment)));
  if (c.choice.gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--thread-ranks trains on the CPU, but "
        "train.options.execution_environment: ",
        environment,
        " asks for GPUs; drop --thread-ranks (a process per GPU) or use "
        "execution_environment: cpu"));
  }
  if (plan.thread_ranks == plan.world) {
    c.communicator = MakeSoloCommunicator();
    return c;
  }
  if (cl.rendezvous.empty() && !scheduler_rdv.has_value()) {
    return absl::InvalidArgumentError(
        "--thread-ranks with --world beyond this machine's --ranks needs "
        "--rendezvous DIR (or DLBATCH_RENDEZVOUS and its companions)");
  }
  ASSIGN_OR_RETURN(c.rendezvous, cl.rendezvous.empty()
                                     ? OpenSchedulerRendezvous(*scheduler_rdv)
                                     : OpenFileRendezvous(cl.rendezvous));
  ASSIGN_OR_RETURN(c.first_ranks, MeetProcesses(c.rendezvous.get(), plan.rank,
                                                plan.thread_ranks, plan.world,
                                                absl::Minutes(5)));
  const int index = static_cast<int>(
      std::find(c.first_ranks.begin(), c.first_ranks.end(), plan.rank) -
      c.first_ranks.begin());
  ASSIGN_OR_RETURN(c.communicator,
                   MakeGlooCommunicator(c.rendezvous.get(), index,
                                        static_cast<int>(c.first_ranks.size()),
                                        cl.host, absl::Minutes(5)));
  return c;
}

// The device decides the collectives too (GPUs meet over NCCL, CPUs over
// Gloo): chosen here from what this machine has, then agreed on by every
// rank through the rendezvous (AgreeOnBackend) before the communicator.
absl::StatusOr<Connection> Connect(
    const CommandLine& cl, const RankPlan& plan, const std::string& environment,
    const std::optional<SchedulerRendezvousConfig>& scheduler_rdv) {
  if (plan.thread_ranks > 0) {
    return ConnectThreadRanks(cl, plan, environment, scheduler_rdv);
  }
  int local_rank = 0;
  if (const char* local = std::getenv("DLBATCH_LOCAL_RANK"); local != nullptr) {
    (void)absl::SimpleAtoi(local, &local_rank);
  }
  int local_ranks = plan.local_ranks;
  if (const char* count = std::getenv("DLBATCH_LOCAL_RANKS");
      local_ranks == 0 && count != nullptr) {
    (void)absl::SimpleAtoi(count, &local_ranks);
  }
  if (local_ranks <= 0) local_ranks = plan.world;
  Connection c;
  ASSIGN_OR_RETURN(
      c.choice, ChooseBackend(environment, plan.world, local_ranks, local_rank,
                              GpuSupportHere(environment)));
  if (plan.world > 1 && c.choice.gpu) {
    // Ranks on several machines: NCCL's sockets on the interface of the
    // address the worker gave (--host), as Gloo's, not NCCL's own pick.
    // Set before the rendezvous starts threads (setenv is not safe
    // beside another thread's getenv). An address on no interface here
    // leaves NCCL's pick, as before, with a word why.
    absl::StatusOr<std::optional<std::string>> ifname =
        NcclSocketInterface(cl.host, std::getenv("NCCL_SOCKET_IFNAME"));
    if (!ifname.ok()) {
      std::fprintf(stderr,
                   "dlbatch-train: rank %d: NCCL chooses its own network "
                   "interface: %s\n",
                   plan.rank, std::string(ifname.status().message()).c_str());
    } else if (ifname->has_value()) {
      setenv("NCCL_SOCKET_IFNAME", (*ifname)->c_str(), 1);
    }
  }
  if (plan.world == 1) {
    c.communicator = MakeSoloCommunicator();
    return c;
  }
  if (cl.rendezvous.empty() && !scheduler_rdv.has_value()) {
    return absl::InvalidArgumentError(
        "--world > 1 needs --rendezvous DIR (or DLBATCH_RENDEZVOUS and its "
        "companions)");
  }
  ASSIGN_OR_RETURN(c.rendezvous, cl.rendezvous.empty()
                                     ? OpenSchedulerRendezvous(*scheduler_rdv)
                                     : OpenFileRendezvous(cl.rendezvous));
  ASSIGN_OR_RETURN(c.choice,
                   AgreeOnBackend(environment, c.rendezvous.get(), plan.rank,
                                  plan.world, c.choice, absl::Minutes(5)));
  ASSIGN_OR_RETURN(
      c.communicator,
      c.choice.gpu
          ? MakeGpuCommunicator(c.rendezvous.get(), plan.rank, plan.world,
                                c.choice.device, absl::Minutes(5))
          : MakeGlooCommunicator(c.rendezvous.get(), plan.rank, plan.world,
                                 cl.host, absl::Minutes(5)));
  return c;
}

// The run's request, but for what connects it (communicator, device,
// rendezvous, channel, diary).
// `here`: the ranks on this machine the default threads are shared by.
absl::StatusOr<TrainRequest> MakeRequest(const CommandLine& cl,
                                         const ParsedJobFile& job,
                                         const std::string& name, int here) {
  TrainRequest req;
  req.spec = job.spec.train();
  req.name = name;
  req.base_dir = std::filesystem::path(cl.job_file).parent_path().string();
  if (req.base_dir.empty()) req.base_dir = ".";
  req.output_dir = cl.output_dir;
  req.resume = cl.resume;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    req.tuning_cache = absl::StrCat(xdg, "/dlbatch");
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    req.tuning_cache = absl::StrCat(home, "/.cache/dlbatch");
  }
  req.threads = cl.threads > 0 ? cl.threads
                               : std::max(1, static_cast<int>(Cores()) / here);
  if (cl.max_epochs > 0) req.max_epochs = cl.max_epochs;
  if (cl.max_iterations > 0) req.max_iterations = cl.max_iterations;
  if (cl.mini_batch_size > 0) req.mini_batch_size = cl.mini_batch_size;
  // Recorded steps are the default on a GPU: one launch a step instead of
  // forty-odd (bench/gpu/NOTES.md).
  ASSIGN_OR_RETURN(
      std::optional<bool> graphs,
      EnvironmentSwitch("DLBATCH_CUDA_GRAPHS",
                        "record a GPU step and replay it, the default",
                        "launch each kernel of every step"));
  req.record_steps = graphs.value_or(true);
  ASSIGN_OR_RETURN(
      req.batches_as_bytes,
      EnvironmentSwitch("DLBATCH_BYTES_BATCHES",
                        "batches as bytes, made into images on the device",
                        "the host's floats"));
  ASSIGN_OR_RETURN(req.loss_scaling,
                   EnvironmentSwitch("DLBATCH_LOSS_SCALING",
                                     "dynamic loss scaling in any precision",
                                     "no loss scaling, even in fp16"));
  // Test-only: a step whose gradient overflows, as fp16's may.
  if (const char* at = std::getenv("DLBATCH_TEST_INF_AT_ITERATION");
      at != nullptr && *at != '\0') {
    if (!absl::SimpleAtoi(at, &req.inject_inf_at_iteration) ||
        req.inject_inf_at_iteration < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DLBATCH_TEST_INF_AT_ITERATION is \"", at,
          "\"; set it to an iteration (1 or more) whose gradient becomes "
          "infinite, or unset it"));
    }
  }
  // The GPU backend reads it; checked here so that a CPU run refuses a
  // typo too.
  RETURN_IF_ERROR(ConvLoweredSwitch().status());
  RETURN_IF_ERROR(FoldReluSwitch().status());
  RETURN_IF_ERROR(SplitBatchSwitch().status());
  return req;
}

}  // namespace

absl::StatusOr<RankPlan> PlanRanks(const CommandLine& cl, int pool) {
  RankPlan plan;
  if (cl.thread_ranks) {
    if (cl.rank_given) {
      return absl::InvalidArgumentError(
          "--thread-ranks trains this machine's --ranks on threads and "
          "takes no --rank; give --first-rank and --world for a run over "
          "machines");
    }
    plan.thread_ranks = cl.ranks > 0 ? cl.ranks : std::max(1, pool);
    plan.rank = cl.first_rank;
    plan.world = cl.world_given ? cl.world : plan.thread_ranks;
    plan.local_ranks = plan.thread_ranks;
    if (plan.rank + plan.thread_ranks > plan.world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks ", plan.rank, "..", plan.rank + plan.thread_ranks - 1,
          " do not fit in --world ", plan.world));
    }
    return plan;
  }
  if (cl.rank_given) {
    // A launched rank (or one started by hand): all ranks taken to be here
    // unless the launcher says how many are (DLBATCH_LOCAL_RANKS).
    plan.rank = cl.rank;
    plan.world = cl.world;
  } else {
    RankRange range;
    range.count = cl.ranks > 0 ? cl.ranks : std::max(1, pool);
    range.first = cl.first_rank;
    range.world = cl.world_given ? cl.world : range.count;
    if (range.first + range.count > range.world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks ", range.first, "..", range.first + range.count - 1,
          " do not fit in --world ", range.world));
    }
    if (range.world > 1 && range.count == 1) {
      // One rank of a run spread over machines: be it.
      plan.rank = range.first;
      plan.world = range.world;
      plan.local_ranks = 1;
    } else if (range.count > 1) {
      plan.launch = true;
      plan.range = range;
    } else {
      plan.local_ranks = 1;
    }
  }
  if (!plan.launch &&
      (plan.world < 1 || plan.rank < 0 || plan.rank >= plan.world)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank ", plan.rank, " is not in [0, --world ", plan.world, ")"));
  }
  return plan;
}

std::vector<std::string> RankArguments(const std::vector<std::string>& args,
                                       int threads,
                                       const std::string& output_dir) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "--world" || a == "--first-rank") && i + 1 < args.size()) {
      ++i;
      continue;
    }
    if (a.rfind("--world=", 0) == 0 || a.rfind("--first-rank=", 0) == 0) {
      continue;
    }
    out.push_back(a);
  }
  out.push_back("--threads");
  out.push_back(std::to_string(threads));
  out.push_back("--output-dir");
  out.push_back(output_dir);
  return out;
}

absl::StatusOr<std::optional<SchedulerRendezvousConfig>>
SchedulerRendezvousFromEnvironment() {
  const char* address = std::getenv("DLBATCH_RENDEZVOUS");
  if (address == nullptr || *address == '\0') return std::nullopt;
  SchedulerRendezvousConfig c;
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

int TrainCommand(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  // Until this process knows whether it launches ranks (which forward the
  // request) or is one (which obeys it): a stop asked meanwhile waits.
  HoldStopRequests();
  CommandLine cl;
  if (std::optional<int> code = ParseCommandLine(argc, argv, &cl)) {
    return *code;
  }
  // From here a SIGTERM waits too (a launcher forwards it, a rank takes
  // it); one sent before the command line was read still stops at once.
  if (cl.stop_on_term) HoldStopRequests(/*sigterm_too=*/true);
  if (cl.list_devices) return ListDevices();
  if (cl.job_file.empty()) {
    std::fprintf(stderr,
                 "dlbatch-train: a job file is required (see --help)\n");
    return kExitUsage;
  }

  absl::StatusOr<ParsedJobFile> job =
      ReadJobFileAs(cl.job_file, cl.spec_binary);
  if (!job.ok()) return Fail(0, 1, job.status());
  if (!cl.execution_environment.empty() && job->spec.has_train()) {
    // Before anything reads it: the communicator's choice below too.
    job->spec.mutable_train()->mutable_options()->set_execution_environment(
        cl.execution_environment);
  }
  absl::StatusOr<std::optional<SchedulerRendezvousConfig>> scheduler_rdv =
      SchedulerRendezvousFromEnvironment();
  if (!scheduler_rdv.ok()) return Fail(0, 1, scheduler_rdv.status());
  if (!job->spec.has_train()) {
    return Fail(0, 1,
                absl::InvalidArgumentError(
                    absl::StrCat(cl.job_file,
                                 " has no train: section; dlbatch-train runs "
                                 "the embedded trainer (submit command: jobs "
                                 "with dlbatch submit)")));
  }
  const std::string name =
      job->spec.name().empty() ? "model" : job->spec.name();
  if (cl.output_dir.empty()) cl.output_dir = name + "-output";

  absl::StatusOr<RankPlan> plan = PlanRanks(cl, job->spec.pool());
  if (!plan.ok()) {
    return cl.rank_given ? Fail(cl.rank, cl.world, plan.status())
                         : Fail(0, 1, plan.status());
  }
  if (plan->launch) {
    return Launch(cl, *plan, argc, argv, scheduler_rdv->has_value());
  }
  const int rank = plan->rank, world = plan->world;
  // Before any thread starts: each inherits the held signal, which only
  // the watcher's thread takes (stop_request.h).
  TakeStopRequests(cl.stop_on_term);
  absl::StatusOr<Connection> connection =
      Connect(cl, *plan, job->spec.train().options().execution_environment(),
              *scheduler_rdv);
  if (!connection.ok()) return Fail(rank, world, connection.status());
  absl::StatusOr<ProgressChannel> channel =
      ProgressChannel::Open(rank == 0 ? cl.progress : "");
  if (!channel.ok()) return Fail(rank, world, channel.status());
  absl::StatusOr<TrainRequest> req = MakeRequest(
      cl, *job, name, plan->thread_ranks > 0 ? plan->thread_ranks : world);
  if (!req.ok()) return Fail(rank, world, req.status());
  req->communicator = connection->communicator.get();
  req->device = connection->choice;
  req->rendezvous = connection->rendezvous.get();
  req->progress = &*channel;
  req->diary = rank == 0 ? stdout : nullptr;
  req->stop_requested = StopRequestFlag();
  // One rank on the CPU: its mini-batch split over its threads
  // (thread_ranks.h). Ranks of a pool on threads: each its own rank.
  ThreadRanks threads;
  threads.count = 1;
  if (world == 1 && !connection->choice.gpu) {
    absl::StatusOr<std::optional<bool>> forced = SplitBatchSwitch();
    if (!forced.ok()) return Fail(rank, world, forced.status());
    threads.count = SplitBatchRanks(
        req->mini_batch_size.value_or(
            ResolveOptions(req->spec.options()).mini_batch_size),
        req->threads, *forced);
    threads.threads = req->threads / threads.count;
  } else if (plan->thread_ranks > 0) {
    threads.count = plan->thread_ranks;
    threads.threads = req->threads;
    threads.split_batch = false;
    if (!connection->first_ranks.empty()) {
      threads.span.between = connection->communicator.get();
      threads.span.first_ranks = connection->first_ranks;
      threads.span.world = world;
      threads.span.store = connection->rendezvous.get();
    }
  }
  absl::StatusOr<TrainResult> result =
      threads.count > 1 || threads.span.between != nullptr
          ? TrainOnThreadRanks(*req, threads)
          : Train(*req);
  if (!result.ok()) return Fail(rank, world, result.status());
  // The checkpoint is written and announced; the run goes on when resumed.
  if (result->stopped_on_request) return kTrainerStoppedExitCode;
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
          cl.output_dir.c_str());
    }
  }
  return 0;
}

}  // namespace dlbatch::trainer
