// The embedded trainer against PyTorch on the CPU, or with --gpu on one GPU:
// LeNet (Caffe's lenet_solver) and the convolutional-block network trained on
// Fashion-MNIST, dlbatch-train and PyTorch run side by side, alternating,
// with the same model, solver, batch, seed and thread count. Prints a
// markdown table of training images/s and test accuracy against each case's
// goals (Case below); the figures are not asserted.
//
//   trainer_bench [--gpu] [--threads T] [--repeats R] [--only CASE]
//                 [--dlbatch-train PATH] [--python PATH] [--data-dir DIR]
//                 [--jobs-dir DIR] [--baseline PATH] [--timeout SECONDS]
//                 [--vary-seed]
//   trainer_bench --check-jobs     # parse and validate the job files only
//
// Images/s is the median over the repeats (on a GPU over the steps after
// the first, with each side's one-off costs in a second table:
// SteadyImagesPerS); test accuracy is the mean. With
// --vary-seed, repeat r trains with seed r + 1 on both sides (initial
// weights and shuffle order), so the accuracy columns compare means over
// seeds: one seed's accuracy after one epoch moves by about a point from seed
// to seed, more than the 0.5-point goal.
//
// CASE: lenet64 | lenet256 | blocks | lenet2ep | lenet2ep-cosine | resnet9 |
// resnet | resnet9-bf16 | resnet-bf16 (resnet9: 4 steps at batch 512 on a
// synthetic CIFAR-10-format set the benchmark writes, images/s after the
// first step; resnet: the small ResNet on Fashion-MNIST, one epoch; -bf16:
// precision bf16 against torch.autocast); with --gpu
// lenet64gpu | lenet1024gpu | blocks256gpu (2 epochs each; dlbatch-train
// --execution-environment gpu against pytorch_baseline.py --device cuda,
// float32 on both sides), and the lower precisions on the GPU:
// resnet9gpu | resnet9gpu-tf32 | resnet9gpu-bf16 | resnet9gpu-fp16 (30 steps
// on the synthetic set) | resnetgpu-bf16 | resnetgpu-fp16 (one epoch) |
// lenet1024gpu-bf16 | lenet1024gpu-fp16, each against PyTorch eager in the
// same precision: tf32 allowed, or AMP (torch.autocast("cuda"), fp16 with a
// GradScaler) with channels_last; resnet9gpu-compiled |
// resnet9gpu-tf32-compiled | resnet9gpu-bf16-compiled |
// resnetgpu-bf16-compiled against the same, torch.compile'd (mode default,
// compiled before PyTorch's clock; its compile time is in the one-off
// table), skipped where that PyTorch has no torch.compile. --gpu stops at
// once unless `dlbatch-train
// --list-devices` shows a GPU. PyTorch runs bench/pytorch_baseline.py with
// OPENBLAS_CORETYPE=SkylakeX where the CPU has AVX-512 (OpenBLAS otherwise
// picks a slower kernel set on some CPUs). --python is a path or a name
// looked up in PATH. --data-dir DIR reads the four Fashion-MNIST .gz files
// from DIR instead of /usr/share/datasets/fashion-mnist (on both sides).
// Where dlbatch-train is missing its columns read "-" (not with --gpu).
#include <cpuid.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/jobspec_yaml.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// One benchmark case and the goals it is measured against.
struct Case {
  std::string name;      // --only
  std::string model;     // pytorch_baseline.py --model
  std::string job_file;  // under --jobs-dir
  int batch;
  int epochs;
  double speed_goal;    // dlbatch/PyTorch images/s, at least
  double max_acc_drop;  // dlbatch may trail PyTorch by this many points
  double min_accuracy;  // dlbatch's test accuracy, at least (0: none)
  // Extra pytorch_baseline.py arguments that match the job file's solver.
  std::vector<std::string> baseline_args = {};
  bool gpu = false;  // a --gpu case
  // Steps to run on both sides (0: whole epochs). Such a case compares
  // images/s over the steps after the first (SteadyImagesPerS), as a GPU
  // case does: a few steps are too few to hide the first's set-up.
  int64_t max_iterations = 0;
  // Trains on the synthetic CIFAR-10 binary data set the benchmark writes
  // (WriteSyntheticCifar10); its accuracy means nothing.
  bool synthetic = false;
  // fp32, or bf16: `precision: bf16` on dlbatch's side, torch.autocast("cpu",
  // torch.bfloat16) on PyTorch's; on a GPU also tf32 and fp16, against
  // PyTorch eager's TF32 and AMP (pytorch_baseline.py --precision).
  std::string precision = "fp32";
  // PyTorch's side runs torch.compile'd (pytorch_baseline.py --compile
  // default), where that PyTorch has it (2.0 on).
  bool compiled = false;
};

// pytorch_baseline.py's arguments for lenet.yaml's solver (Caffe's
// lenet_solver): none, its defaults are that solver.
const std::vector<std::string> kLenetArgs = {};
// pytorch_baseline.py's arguments for the ResNet job files' solvers.
const std::vector<std::string> kResNet9Args = {
    "--lr", "0.4",        "--schedule",        "cosine", "--warmup",
    "2",    "--nesterov", "--label-smoothing", "0.2"};
const std::vector<std::string> kResNetArgs = {
    "--lr", "0.05", "--schedule", "cosine", "--warmup", "100"};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"lenet64", "lenet", "lenet.yaml", 64, 1, 1.5, 0.5, 0},
      {"lenet256", "lenet", "lenet.yaml", 256, 1, 1.0, 0.5, 0},
      {"blocks", "blocks", "blocks.yaml", 256, 1, 1.0, 0.5, 0},
      {"lenet2ep", "lenet", "lenet.yaml", 64, 2, 1.5, 0.5, 0},
      // The 2-epoch accuracy goal with a schedule of our choosing: sgdm
      // 0.03, cosine after 200 warm-up iterations (Caffe's `inv` recipe
      // above reaches about 88% on both sides).
      {"lenet2ep-cosine",
       "lenet",
       "lenet-cosine.yaml",
       64,
       2,
       1.5,
       0.5,
       89.0,
       {"--lr", "0.03", "--schedule", "cosine", "--warmup", "200"}},
      // On a GPU: 2 epochs, float32, PyTorch eager on the same GPU as the
      // baseline; goals 2.0x at batch 64, 1.2x at 1024 and for the blocks.
      {"lenet64gpu", "lenet", "lenet.yaml", 64, 2, 2.0, 0.5, 0, {}, true},
      {"lenet1024gpu", "lenet", "lenet.yaml", 1024, 2, 1.2, 0.5, 0, {}, true},
      {"blocks256gpu", "blocks", "blocks.yaml", 256, 2, 1.2, 0.5, 0, {}, true},
      // ResNet-9 (Page's) at batch 512 on 32x32x3, a few steps on the
      // synthetic CIFAR-10 set, and the small ResNet on Fashion-MNIST for
      // one epoch; float32 (goal 1.2x), then bf16 against PyTorch's
      // autocast (goal 1.5x).
      {"resnet9", "resnet9", "resnet9.yaml", 512, 1, 1.2, 100, 0, kResNet9Args,
       false, 4, true},
      {"resnet", "resnet", "resnet.yaml", 128, 1, 1.2, 0.5, 0, kResNetArgs},
      {"resnet9-bf16", "resnet9", "resnet9.yaml", 512, 1, 1.5, 100, 0,
       kResNet9Args, false, 4, true, "bf16"},
      {"resnet-bf16", "resnet", "resnet.yaml", 128, 1, 1.5, 0.5, 0, kResNetArgs,
       false, 0, false, "bf16"},
      // The same on a GPU: ResNet-9 at batch 512 (30 steps, 3 passes over
      // the synthetic set) in each precision, the small ResNet and LeNet at
      // batch 1024 in bf16 and fp16; goals 1.5x PyTorch eager in the same
      // precision.
      {"resnet9gpu", "resnet9", "resnet9.yaml", 512, 3, 1.5, 100, 0,
       kResNet9Args, true, 30, true},
      {"resnet9gpu-tf32", "resnet9", "resnet9.yaml", 512, 3, 1.5, 100, 0,
       kResNet9Args, true, 30, true, "tf32"},
      {"resnet9gpu-bf16", "resnet9", "resnet9.yaml", 512, 3, 1.5, 100, 0,
       kResNet9Args, true, 30, true, "bf16"},
      {"resnet9gpu-fp16", "resnet9", "resnet9.yaml", 512, 3, 1.5, 100, 0,
       kResNet9Args, true, 30, true, "fp16"},
      {"resnetgpu-bf16", "resnet", "resnet.yaml", 128, 1, 1.5, 0.5, 0,
       kResNetArgs, true, 0, false, "bf16"},
      {"resnetgpu-fp16", "resnet", "resnet.yaml", 128, 1, 1.5, 0.5, 0,
       kResNetArgs, true, 0, false, "fp16"},
      {"lenet1024gpu-bf16", "lenet", "lenet.yaml", 1024, 2, 1.5, 0.5, 0,
       kLenetArgs, true, 0, false, "bf16"},
      {"lenet1024gpu-fp16", "lenet", "lenet.yaml", 1024, 2, 1.5, 0.5, 0,
       kLenetArgs, true, 0, false, "fp16"},
      // The same against torch.compile: goal 1.0x.
      {"resnet9gpu-compiled", "resnet9", "resnet9.yaml", 512, 3, 1.0, 100, 0,
       kResNet9Args, true, 30, true, "fp32", true},
      {"resnet9gpu-tf32-compiled", "resnet9", "resnet9.yaml", 512, 3, 1.0, 100,
       0, kResNet9Args, true, 30, true, "tf32", true},
      {"resnet9gpu-bf16-compiled", "resnet9", "resnet9.yaml", 512, 3, 1.0, 100,
       0, kResNet9Args, true, 30, true, "bf16", true},
      {"resnetgpu-bf16-compiled", "resnet", "resnet.yaml", 128, 1, 1.0, 0.5, 0,
       kResNetArgs, true, 0, false, "bf16", true},
  };
  return cases;
}

// What one training run reports.
struct RunResult {
  double images_per_s = 0;   // over every step, as the run reports it
  double test_accuracy = 0;  // percent
  // Where the run reports them (both sides on a GPU):
  int64_t iterations = 0;
  double train_time_s = 0;               // every step, the first included
  std::optional<double> first_step_s;    // the first alone, waited for
  std::optional<double> build_time_s;    // dlbatch: backend and network,
                                         // the algorithm search included;
                                         // PyTorch: torch.compile's
  std::optional<double> backend_time_s;  // dlbatch: of build_time_s, the
                                         // backend (a GPU's start-up)
};

// Images/s over the steps after the first, where the run timed its first
// step apart: what a longer run approaches. The GPU cases compare these:
// each side's one-off costs fall on different sides of its clock (dlbatch
// searches cuDNN's algorithms while building the network, before its first
// step; PyTorch's cudnn.benchmark searches inside its first step), so
// images/s over every step would count PyTorch's search and not dlbatch's.
std::optional<double> SteadyImagesPerS(const RunResult& r, int batch) {
  if (!r.first_step_s || r.iterations < 2) return std::nullopt;
  const double time = r.train_time_s - *r.first_step_s;
  if (!(time > 0)) return std::nullopt;
  return static_cast<double>(r.iterations - 1) * batch / time;
}

// Images/s with the one-off costs in on both sides: the first step, and
// dlbatch's build with its algorithm search (and its CUDA context, which
// PyTorch makes outside its clock: this leans against dlbatch) or PyTorch's
// torch.compile.
std::optional<double> WholeRunImagesPerS(const RunResult& r, int batch) {
  const double time = r.train_time_s + r.build_time_s.value_or(0);
  if (r.iterations < 1 || !(time > 0)) return std::nullopt;
  return static_cast<double>(r.iterations) * batch / time;
}

struct Options {
  int threads = 2;
  int repeats = 1;
  std::string only;
  std::string dlbatch_train;
  std::string python = "/usr/bin/python3";
  std::string jobs_dir = DLBATCH_BENCH_SOURCE_DIR "/jobs";
  std::string baseline = DLBATCH_BENCH_SOURCE_DIR "/pytorch_baseline.py";
  int timeout_s = 3600;
  std::string data_dir;   // "": the job files' own data paths
  std::string cifar_dir;  // the synthetic CIFAR-10 set, once written
  bool check_jobs = false;
  bool vary_seed = false;
  bool gpu = false;
};

// The data folder the job files name; --data-dir replaces it.
constexpr char kJobDataDir[] = "/usr/share/datasets/fashion-mnist";

std::string SelfDir() {
  return fs::read_symlink("/proc/self/exe").parent_path().string();
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last `max_lines` lines of a log, to quote in an error.
std::string Tail(const std::string& text, int max_lines = 15) {
  size_t start = text.size();
  for (int i = 0; i <= max_lines; ++i) {
    if (start == 0) return text;
    const size_t newline = text.rfind('\n', start - 1);
    if (newline == std::string::npos) return text;
    start = newline;
  }
  return text.substr(start + 1);
}

// Runs argv with `extra_env` added to this process's environment, stdout to
// `out_path` and stderr to `err_path`, stdin from /dev/null, and waits for
// it, killing it after `timeout_s`. OK only where it exits with status 0.
absl::Status RunProcess(const std::vector<std::string>& argv,
                        const std::vector<std::string>& extra_env,
                        const std::string& out_path,
                        const std::string& err_path, int timeout_s) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool overridden = false;
    for (const std::string& x : extra_env) {
      if (entry.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0) {
        overridden = true;
      }
    }
    if (!overridden) env.push_back(entry);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> c_argv, c_env;
  std::vector<std::string> argv_store = argv;
  for (std::string& a : argv_store) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  for (std::string& e : env) c_env.push_back(e.data());
  c_env.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // own group: a kill takes its tree
  pid_t pid = 0;
  // spawnp: --python may be a bare name (python3) to find in PATH.
  int rc = posix_spawnp(&pid, c_argv[0], &actions, &attr, c_argv.data(),
                        c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  const Clock::time_point deadline =
      Clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0) {
      return absl::InternalError(
          absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (Clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(
          absl::StrCat(argv[0], " ran past ", timeout_s,
                       " s and was killed; see ", err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(
        absl::StrJoin(argv, " "), " failed (",
        WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                          : absl::StrCat("signal ", WTERMSIG(status)),
        "); its stderr ends:\n", Tail(ReadFile(err_path))));
  }
  return absl::OkStatus();
}

// A finite number under `key` of a JSON object, or an error naming `source`.
absl::StatusOr<double> NumberField(const nlohmann::json& j,
                                   const std::string& key,
                                   const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number() || !std::isfinite(it->get<double>())) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no finite number \"", key, "\""));
  }
  return it->get<double>();
}

absl::StatusOr<RunResult> ParseResult(const std::string& text,
                                      const std::string& source,
                                      const std::string& accuracy_key) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a JSON object: ", Tail(text, 3)));
  }
  RunResult r;
  absl::StatusOr<double> ips = NumberField(j, "images_per_s", source);
  if (!ips.ok()) return ips.status();
  absl::StatusOr<double> acc = NumberField(j, accuracy_key, source);
  if (!acc.ok()) return acc.status();
  r.images_per_s = *ips;
  r.test_accuracy = *acc;
  // The timing parts, where present (PyTorch times its first step apart on
  // a GPU only; older dlbatch-train builds report neither).
  auto field = [&](const char* key) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    absl::StatusOr<double> v = NumberField(j, key, source);
    return v.ok() ? std::optional<double>(*v) : std::nullopt;
  };
  r.iterations = static_cast<int64_t>(field("iterations").value_or(0));
  r.train_time_s = field("train_time_s").value_or(0);
  r.first_step_s = field("first_step_s");
  r.build_time_s = field("build_time_s");
  r.backend_time_s = field("backend_time_s");
  return r;
}

// Whether this CPU has AVX-512 BF16 or AMX-BF16 (CPUID leaf 7), which
// dlbatch's precision: bf16 needs on the CPU. Without them dlbatch refuses
// bf16, and PyTorch's autocast crawls (reference kernels): the bf16 cases
// are skipped with a line saying why.
bool CpuHasBf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool amx_bf16 = (d >> 22) & 1;
  const unsigned max_subleaf = a;
  bool avx512_bf16 = false;
  if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) {
    avx512_bf16 = (a >> 5) & 1;
  }
  return amx_bf16 || avx512_bf16;
}

std::vector<std::string> OpenBlasEnv() {
  std::vector<std::string> env;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    env.push_back("OPENBLAS_CORETYPE=SkylakeX");
  }
  return env;
}

absl::StatusOr<RunResult> RunPyTorch(const Options& o, const Case& c,
                                     uint64_t seed, const std::string& dir) {
  std::vector<std::string> argv = {o.python,    o.baseline,
                                   "--model",   c.model,
                                   "--batch",   absl::StrCat(c.batch),
                                   "--threads", absl::StrCat(o.threads),
                                   "--epochs",  absl::StrCat(c.epochs),
                                   "--seed",    absl::StrCat(seed)};
  argv.insert(argv.end(), c.baseline_args.begin(), c.baseline_args.end());
  if (c.max_iterations > 0) {
    argv.push_back("--max-iterations");
    argv.push_back(absl::StrCat(c.max_iterations));
  }
  if (c.synthetic) {
    argv.push_back("--cifar-dir");
    argv.push_back(o.cifar_dir);
  }
  if (c.precision != "fp32") {
    argv.push_back("--precision");
    argv.push_back(c.precision);
  }
  if (c.compiled) {
    argv.push_back("--compile");
    argv.push_back("default");
  }
  if (c.gpu) {
    argv.push_back("--device");
    argv.push_back("cuda");
    // Eager AMP as NVIDIA recommends it: NHWC, which tensor cores take.
    if (c.precision == "bf16" || c.precision == "fp16") {
      argv.push_back("--channels-last");
    }
  }
  if (!o.data_dir.empty()) {
    argv.push_back("--data-dir");
    argv.push_back(o.data_dir);
  }
  std::vector<std::string> env = OpenBlasEnv();
  env.push_back(absl::StrCat("OMP_NUM_THREADS=", o.threads));
  const std::string out = dir + "/pytorch.json";
  absl::Status s =
      RunProcess(argv, env, out, dir + "/pytorch.log", o.timeout_s);
  if (!s.ok()) return s;
  return ParseResult(ReadFile(out), out, "test_accuracy");
}

// The case's job file with `seed: 1` made `seed: <seed>` and, with
// --data-dir, the data folder replaced, written into `dir` (the data paths
// are absolute, so the copy reads the same files), and checked by parsing it
// back. The job file itself where neither changes.
absl::StatusOr<std::string> JobFileFor(const Options& o, const Case& c,
                                       uint64_t seed, const std::string& dir) {
  const std::string source = o.jobs_dir + "/" + c.job_file;
  if (seed == 1 && o.data_dir.empty() && !c.synthetic &&
      c.precision == "fp32") {
    return source;
  }
  std::string text = ReadFile(source);
  if (c.synthetic) {
    const std::string from = "CIFAR_DIR";
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + o.cifar_dir.size())) {
      text.replace(at, from.size(), o.cifar_dir);
    }
  }
  if (c.precision != "fp32") {
    const std::string from = "\n    execution_environment: cpu\n";
    const size_t at = text.find(from);
    if (at == std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          source, ": no `    execution_environment: cpu` line to add `",
          "precision: ", c.precision, "` after"));
    }
    text.insert(at + from.size(),
                absl::StrCat("    precision: ", c.precision, "\n"));
  }
  if (seed != 1) {
    const std::string from = "\n    seed: 1\n";
    const size_t at = text.find(from);
    if (at == std::string::npos) {
      return absl::FailedPreconditionError(
          absl::StrCat(source, ": no `    seed: 1` line to vary"));
    }
    text.replace(at, from.size(), absl::StrCat("\n    seed: ", seed, "\n"));
  }
  if (!o.data_dir.empty()) {
    const std::string from = kJobDataDir;
    int replaced = 0;
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + o.data_dir.size())) {
      text.replace(at, from.size(), o.data_dir);
      ++replaced;
    }
    if (replaced == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          source, ": names no ", from, "/ file for --data-dir to replace"));
    }
  }
  const std::string path = dir + "/" + c.job_file;
  std::ofstream(path) << text;
  absl::StatusOr<dlbatch::ParsedJobFile> job = dlbatch::ReadJobFile(path);
  if (!job.ok()) return job.status();
  if (job->spec.train().options().precision() !=
      (c.precision == "fp32" ? "" : c.precision)) {
    return absl::InternalError(absl::StrCat(path, ": precision not set"));
  }
  if (job->spec.train().options().seed() != seed) {
    return absl::InternalError(absl::StrCat(path, ": seed did not change"));
  }
  return path;
}

absl::StatusOr<RunResult> RunDlbatch(const Options& o, const Case& c,
                                     uint64_t seed, const std::string& dir) {
  absl::StatusOr<std::string> job = JobFileFor(o, c, seed, dir);
  if (!job.ok()) return job.status();
  const std::string out_dir = dir + "/dlbatch";
  fs::create_directories(out_dir);
  std::vector<std::string> argv = {o.dlbatch_train,
                                   "--output-dir",
                                   out_dir,
                                   "--threads",
                                   absl::StrCat(o.threads),
                                   "--max-epochs",
                                   absl::StrCat(c.epochs),
                                   "--mini-batch-size",
                                   absl::StrCat(c.batch),
                                   "--execution-environment",
                                   c.gpu ? "gpu" : "cpu",
                                   *job};
  if (c.max_iterations > 0) {
    argv.insert(argv.end() - 1,
                {"--max-iterations", absl::StrCat(c.max_iterations)});
  }
  // A tuning cache of its own (empty): every run searches cuDNN's
  // algorithms, as every PyTorch process does with cudnn.benchmark.
  std::vector<std::string> env = {
      absl::StrCat("OMP_NUM_THREADS=", o.threads),
      absl::StrCat("XDG_CACHE_HOME=", dir, "/cache")};
  absl::Status s = RunProcess(argv, env, dir + "/dlbatch.out",
                              dir + "/dlbatch.log", o.timeout_s);
  if (!s.ok()) return s;
  const std::string metrics = out_dir + "/metrics.json";
  if (!fs::exists(metrics)) {
    return absl::NotFoundError(
        absl::StrCat(o.dlbatch_train, " exited 0 but wrote no ", metrics));
  }
  return ParseResult(ReadFile(metrics), metrics, "validation_accuracy");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Over the repeats that succeeded: median images/s (on a GPU over the
// steps after the first, SteadyImagesPerS), mean accuracy (a mean over seeds
// with --vary-seed); nullopt where none did.
struct Summary {
  std::optional<double> images_per_s, accuracy;
  // The one-off costs (medians), and images/s with them (WholeRunImagesPerS).
  std::optional<double> build_time_s, backend_time_s, first_step_s,
      whole_images_per_s;
};

std::optional<double> MedianOf(const std::vector<std::optional<double>>& v) {
  std::vector<double> present;
  for (const std::optional<double>& x : v) {
    if (x) present.push_back(*x);
  }
  if (present.empty()) return std::nullopt;
  return Median(present);
}

Summary Summarize(const Case& c, const std::vector<RunResult>& runs) {
  Summary s;
  if (runs.empty()) return s;
  std::vector<std::optional<double>> ips, build, backend, first, whole;
  double sum = 0;
  for (const RunResult& r : runs) {
    ips.push_back(c.gpu || c.max_iterations > 0
                      ? SteadyImagesPerS(r, c.batch)
                      : std::optional<double>(r.images_per_s));
    build.push_back(r.build_time_s);
    backend.push_back(r.backend_time_s);
    first.push_back(r.first_step_s);
    whole.push_back(WholeRunImagesPerS(r, c.batch));
    sum += r.test_accuracy;
  }
  s.images_per_s = MedianOf(ips);
  s.build_time_s = MedianOf(build);
  s.backend_time_s = MedianOf(backend);
  s.first_step_s = MedianOf(first);
  s.whole_images_per_s = MedianOf(whole);
  s.accuracy = sum / runs.size();
  return s;
}

std::string Num(std::optional<double> v,
                const absl::FormatSpec<double>& format) {
  return v ? absl::StrFormat(format, *v) : "-";
}

std::string Verdict(std::optional<bool> met) {
  return met ? (*met ? "met" : "MISSED") : "-";
}

// One table row of a case, from the medians of its runs.
std::string Row(const Case& c, const Summary& dl, const Summary& pt) {
  std::optional<double> ratio, delta;
  std::optional<bool> speed_met, acc_met;
  if (dl.images_per_s && pt.images_per_s) {
    ratio = *dl.images_per_s / *pt.images_per_s;
    speed_met = *ratio >= c.speed_goal;
  }
  if (dl.accuracy && pt.accuracy) {
    delta = *dl.accuracy - *pt.accuracy;
    acc_met = *delta >= -c.max_acc_drop;
  }
  std::string acc_goal = absl::StrFormat("Δ ≥ %.1f", -c.max_acc_drop);
  if (c.min_accuracy > 0) {
    absl::StrAppend(&acc_goal, absl::StrFormat(", ≥ %.0f%%", c.min_accuracy));
    if (dl.accuracy) {
      acc_met = acc_met.value_or(true) && *dl.accuracy >= c.min_accuracy;
    }
  }
  std::string label =
      c.max_iterations > 0
          ? absl::StrFormat("%s b%d %d steps", c.model, c.batch,
                            c.max_iterations)
          : absl::StrFormat("%s b%d %dep", c.model, c.batch, c.epochs);
  if (c.synthetic) label += " synthetic";
  if (c.precision != "fp32") label += " " + c.precision;
  if (c.model == "lenet" && !c.baseline_args.empty()) label += " cosine";
  if (c.gpu) label += " gpu";
  if (c.compiled) label += " vs compiled";
  return absl::StrFormat(
      "| %s | %s | %s | %s | ≥ %.1f× | %s | %s | %s | %s | %s | %s |", label,
      Num(dl.images_per_s, "%.0f"), Num(pt.images_per_s, "%.0f"),
      Num(ratio, "%.2f×"), c.speed_goal, Verdict(speed_met),
      Num(dl.accuracy, "%.2f"), Num(pt.accuracy, "%.2f"), Num(delta, "%+.2f"),
      acc_goal, Verdict(acc_met));
}

// A GPU case's one-off costs and its images/s with them, from the medians.
std::string OneOffRow(const Case& c, const Summary& dl, const Summary& pt) {
  std::optional<double> ratio;
  if (dl.whole_images_per_s && pt.whole_images_per_s) {
    ratio = *dl.whole_images_per_s / *pt.whole_images_per_s;
  }
  return absl::StrFormat(
      "| %s b%d %dep%s gpu%s | %s | %s | %s | %s | %s | %s | %s | %s |",
      c.model, c.batch, c.epochs,
      c.precision == "fp32" ? "" : " " + c.precision,
      c.compiled ? " vs compiled" : "", Num(dl.build_time_s, "%.2f"),
      Num(dl.backend_time_s, "%.2f"), Num(pt.build_time_s, "%.2f"),
      Num(dl.first_step_s, "%.3f"), Num(pt.first_step_s, "%.3f"),
      Num(dl.whole_images_per_s, "%.0f"), Num(pt.whole_images_per_s, "%.0f"),
      Num(ratio, "%.2f×"));
}

// Writes a synthetic data set in CIFAR-10's binary format into `dir`:
// data_batch_1.bin (`train` records) and test_batch.bin (`test`), each
// record a label byte (i % 10) and 3072 pixel bytes (red, green, blue
// planes of 32x32): noise around a level that depends on the class and the
// channel, so that there is something to learn. The same bytes every time.
absl::Status WriteSyntheticCifar10(const std::string& dir, int train,
                                   int test) {
  fs::create_directories(dir);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {  // xorshift64*
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
  };
  for (const auto& [name, count] :
       {std::pair<std::string, int>{"data_batch_1.bin", train},
        std::pair<std::string, int>{"test_batch.bin", test}}) {
    std::string bytes;
    bytes.reserve(static_cast<size_t>(count) * 3073);
    for (int i = 0; i < count; ++i) {
      const int label = i % 10;
      bytes.push_back(static_cast<char>(label));
      for (int ch = 0; ch < 3; ++ch) {
        const int level = 40 + 60 * ((label + ch) % 4);
        for (int p = 0; p < 1024; ++p) {
          const int v = level + static_cast<int>(next() % 96);
          bytes.push_back(static_cast<char>(std::min(v, 255)));
        }
      }
    }
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", dir, "/", name));
    }
  }
  return absl::OkStatus();
}

// Parses and validates every job file the cases use.
absl::Status CheckJobs(const Options& o) {
  std::vector<std::string> seen;
  for (const Case& c : Cases()) {
    if (std::find(seen.begin(), seen.end(), c.job_file) != seen.end()) {
      continue;
    }
    seen.push_back(c.job_file);
    const std::string path = o.jobs_dir + "/" + c.job_file;
    absl::StatusOr<dlbatch::ParsedJobFile> job = dlbatch::ReadJobFile(path);
    if (!job.ok()) return job.status();
    const auto& options = job->spec.train().options();
    const bool cosine =
        std::find(c.baseline_args.begin(), c.baseline_args.end(), "cosine") !=
        c.baseline_args.end();
    if (c.synthetic) {
      // The data paths name CIFAR_DIR until the benchmark writes the set.
      std::cerr << path << ": " << job->spec.train().network().layers_size()
                << " layers, batch "
                << job->spec.train().options().mini_batch_size()
                << ", ok (data written by the benchmark)\n";
      continue;
    }
    const std::string schedule = cosine ? "cosine" : "inv";
    if (options.learn_rate_schedule().type() != schedule ||
        (options.max_epochs() != 1 && options.max_epochs() != c.epochs)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": the benchmark expects an `", schedule,
                       "` schedule (what its PyTorch side runs) and 1 or ",
                       c.epochs, " epochs"));
    }
    std::cerr << path << ": " << job->spec.train().network().layers_size()
              << " layers, "
              << "batch " << options.mini_batch_size() << ", ok\n";
  }
  return absl::OkStatus();
}

// Before a --gpu run: dlbatch-train and PyTorch must both see a GPU. Returns
// a line naming what they see, for the table's header, and sets
// `has_compile` to whether that PyTorch has torch.compile; an error that
// says what is missing otherwise, found in seconds rather than after the
// cases.
absl::StatusOr<std::string> GpuPreflight(const Options& o,
                                         const std::string& root,
                                         bool* has_compile) {
  if (access(o.dlbatch_train.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(o.dlbatch_train,
                     " not found; --gpu needs dlbatch-train (pass "
                     "--dlbatch-train PATH)"));
  }
  const std::string devices = root + "/list-devices.txt";
  absl::Status s = RunProcess({o.dlbatch_train, "--list-devices"}, {}, devices,
                              root + "/list-devices.log", 60);
  if (!s.ok()) return s;
  std::string listing = ReadFile(devices);
  while (!listing.empty() && listing.back() == '\n') listing.pop_back();
  if (listing.rfind("GPU ", 0) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--gpu needs a GPU, but `", o.dlbatch_train,
        " --list-devices` says: ", Tail(listing, 3),
        "\nRun trainer_bench --gpu on a machine with an NVIDIA GPU, from a "
        "build with the GPU backend (bench/gpu/pack.sh, then "
        "bench/gpu/on-device.sh there)"));
  }
  const std::string probe = root + "/torch-cuda.txt";
  s = RunProcess({o.python, "-c",
                  "import sys, torch\n"
                  "if not torch.cuda.is_available():\n"
                  "  sys.exit('PyTorch %s (CUDA %s) sees no CUDA device' % "
                  "(torch.__version__, torch.version.cuda))\n"
                  "print('PyTorch %s, CUDA %s, cuDNN %s' % (torch.__version__, "
                  "torch.version.cuda, torch.backends.cudnn.version()))\n"
                  "print('compile' if hasattr(torch, 'compile') else "
                  "'no compile')\n"},
                 {}, probe, root + "/torch-cuda.log", 120);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--gpu needs PyTorch with CUDA from --python ", o.python,
                     ": ", s.message()));
  }
  const std::vector<std::string> lines =
      absl::StrSplit(ReadFile(probe), '\n', absl::SkipEmpty());
  *has_compile = lines.size() > 1 && lines[1] == "compile";
  return absl::StrCat(listing.substr(0, listing.find('\n')), "; ",
                      lines.empty() ? "" : lines[0]);
}

bool ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--check-jobs") {
      o->check_jobs = true;
      continue;
    }
    if (flag == "--vary-seed") {
      o->vary_seed = true;
      continue;
    }
    if (flag == "--gpu") {
      o->gpu = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string value = argv[++i];
    if (flag == "--threads") {
      if (!absl::SimpleAtoi(value, &o->threads) || o->threads < 1) return false;
    } else if (flag == "--repeats") {
      if (!absl::SimpleAtoi(value, &o->repeats) || o->repeats < 1) return false;
    } else if (flag == "--timeout") {
      if (!absl::SimpleAtoi(value, &o->timeout_s) || o->timeout_s < 1) {
        return false;
      }
    } else if (flag == "--only") {
      o->only = value;
      if (std::none_of(Cases().begin(), Cases().end(),
                       [&](const Case& c) { return c.name == value; })) {
        return false;
      }
    } else if (flag == "--dlbatch-train") {
      o->dlbatch_train = value;
    } else if (flag == "--python") {
      o->python = value;
    } else if (flag == "--jobs-dir") {
      o->jobs_dir = value;
    } else if (flag == "--baseline") {
      o->baseline = value;
    } else if (flag == "--data-dir") {
      o->data_dir = fs::absolute(value).lexically_normal().string();
      while (o->data_dir.size() > 1 && o->data_dir.back() == '/') {
        o->data_dir.pop_back();
      }
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, &o)) {
    std::cerr << "usage: trainer_bench [--gpu] [--threads T] [--repeats R]"
                 " [--only lenet64|lenet256|blocks|lenet2ep|lenet2ep-cosine|"
                 "resnet9|resnet|resnet9-bf16|resnet-bf16|"
                 "lenet64gpu|lenet1024gpu|blocks256gpu|resnet9gpu|"
                 "resnet9gpu-tf32|resnet9gpu-bf16|resnet9gpu-fp16|"
                 "resnetgpu-bf16|resnetgpu-fp16|lenet1024gpu-bf16|"
                 "lenet1024gpu-fp16|resnet9gpu-compiled|"
                 "resnet9gpu-tf32-compiled|resnet9gpu-bf16-compiled|"
                 "resnetgpu-bf16-compiled]"
                 " [--dlbatch-train PATH] [--python PATH] [--data-dir DIR]"
                 " [--jobs-dir DIR] [--baseline PATH] [--timeout SECONDS]"
                 " [--vary-seed] [--check-jobs]\n";
    return 2;
  }
  if (!o.only.empty()) {
    // A GPU case named alone implies --gpu; a CPU case does not mix with it.
    const bool only_gpu =
        std::find_if(Cases().begin(), Cases().end(), [&](const Case& c) {
          return c.name == o.only;
        })->gpu;
    if (o.gpu && !only_gpu) {
      std::cerr << "trainer_bench: --only " << o.only
                << " is a CPU case; with --gpu use a case whose name has "
                   "gpu in it (lenet64gpu, resnet9gpu-bf16, ...)\n";
      return 2;
    }
    o.gpu = only_gpu;
  }
  if (absl::Status s = CheckJobs(o); !s.ok()) {
    std::cerr << "trainer_bench: " << s.message() << "\n";
    return 1;
  }
  if (o.check_jobs) return 0;
  if (o.dlbatch_train.empty()) o.dlbatch_train = SelfDir() + "/dlbatch-train";
  const bool have_dlbatch = access(o.dlbatch_train.c_str(), X_OK) == 0;
  if (!have_dlbatch && !o.gpu) {
    std::cerr << "trainer_bench: " << o.dlbatch_train
              << " not found; running PyTorch alone\n";
  }

  char tmpl[] = "/tmp/trainer-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string root = tmpl;
  std::string device_line;
  bool has_compile = false;
  if (o.gpu) {
    absl::StatusOr<std::string> gpu = GpuPreflight(o, root, &has_compile);
    if (!gpu.ok()) {
      std::cerr << "trainer_bench: " << gpu.status().message() << "\n";
      return 1;
    }
    device_line = *gpu;
    std::cerr << "trainer_bench: " << device_line << "\n";
  }
  for (const Case& c : Cases()) {
    const bool selected = o.only.empty() ? c.gpu == o.gpu : o.only == c.name;
    if (!selected || !c.synthetic || !o.cifar_dir.empty()) continue;
    // 10 batches of 512 to train on, 1,000 images to validate.
    o.cifar_dir = root + "/cifar10";
    if (absl::Status s = WriteSyntheticCifar10(o.cifar_dir, 5120, 1000);
        !s.ok()) {
      std::cerr << "trainer_bench: " << s.message() << "\n";
      return 1;
    }
  }
  const std::string load_before = LoadAverage();
  std::vector<std::string> rows, one_off_rows;
  int failures = 0;
  for (const Case& c : Cases()) {
    if (!o.only.empty() && o.only != c.name) continue;
    if (c.gpu != o.gpu) continue;
    std::vector<RunResult> dl_runs, pt_runs;
    if (!c.gpu && c.precision == "bf16" && !CpuHasBf16()) {
      std::cerr << "[" << c.name
                << "] skipped: this CPU has neither AVX-512 BF16 nor AMX "
                   "(dlbatch-train refuses precision: bf16 here, and "
                   "PyTorch's autocast runs reference kernels)\n";
      rows.push_back(Row(c, {}, {}) + " skipped: no AVX-512 BF16 or AMX");
      continue;
    }
    if (c.compiled && !has_compile) {
      std::cerr << "[" << c.name << "] skipped: the PyTorch of --python "
                << o.python << " has no torch.compile (it came in 2.0)\n";
      rows.push_back(Row(c, {}, {}) + " skipped: no torch.compile");
      continue;
    }
    for (int r = 0; r < o.repeats; ++r) {
      // Alternate which goes first, so neither always follows the other.
      for (int k = 0; k < 2; ++k) {
        const bool pytorch = (k == 0) == (r % 2 == 0);
        if (!pytorch && !have_dlbatch) continue;
        const std::string who = pytorch ? "pytorch" : "dlbatch";
        const std::string dir =
            absl::StrCat(root, "/", c.name, "-", r, "-", who);
        fs::create_directories(dir);
        std::cerr << absl::StrFormat("[%s #%d seed %d] %s ... ", c.name, r + 1,
                                     o.vary_seed ? r + 1 : 1, who)
                  << std::flush;
        const uint64_t seed = o.vary_seed ? r + 1 : 1;
        absl::StatusOr<RunResult> res =
            pytorch ? RunPyTorch(o, c, seed, dir) : RunDlbatch(o, c, seed, dir);
        if (!res.ok()) {
          std::cerr << "failed: " << res.status().message() << "\n";
          ++failures;
          continue;
        }
        const std::optional<double> steady = SteadyImagesPerS(*res, c.batch);
        std::cerr << absl::StrFormat(
            "%.0f images/s%s, %.2f%% (load %s)\n", res->images_per_s,
            steady ? absl::StrFormat(" (%.0f after the first step)", *steady)
                   : "",
            res->test_accuracy, LoadAverage());
        (pytorch ? pt_runs : dl_runs).push_back(*res);
      }
    }
    const Summary dl = Summarize(c, dl_runs), pt = Summarize(c, pt_runs);
    rows.push_back(Row(c, dl, pt));
    if (c.gpu) one_off_rows.push_back(OneOffRow(c, dl, pt));
  }

  if (o.gpu) {
    std::cout << device_line
              << ", float32 (no TF32) unless a case names its precision "
                 "(then PyTorch eager in it: TF32, or AMP with "
                 "channels_last)\n\n";
  }
  std::cout << absl::StrFormat(
      "%s, %d thread(s), %d repeat(s)%s: median images/s%s, mean "
      "accuracy; load average %s before, %s after\n\n",
      o.cifar_dir.empty()
          ? "Fashion-MNIST"
          : "Fashion-MNIST (resnet9: a synthetic set in CIFAR-10's format; "
            "images/s over the steps after the first)",
      o.threads, o.repeats,
      o.gpu ? " over the steps after the first (each side's first step and "
              "dlbatch's network build, where the one-off costs fall, are "
              "in the second table)"
            : "",
      o.vary_seed ? absl::StrCat(" over seeds 1..", o.repeats) : "",
      load_before, LoadAverage());
  std::cout << "| case | dlbatch images/s | PyTorch images/s | ratio | goal |"
               " | dlbatch test acc % | PyTorch test acc % | Δ points | goal"
               " | |\n";
  std::cout << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const std::string& row : rows) std::cout << row << "\n";
  if (!one_off_rows.empty()) {
    std::cout << "\nOne-off costs (medians): dlbatch's build (backend, "
                 "network and cuDNN algorithm search, with an empty tuning "
                 "cache), of which the GPU's start-up (CUDA context, cuDNN "
                 "and cuBLAS handles; PyTorch makes its context before its "
                 "clock starts), PyTorch's torch.compile (the compiled "
                 "cases: before its clock), each side's first step "
                 "(PyTorch's includes its cudnn.benchmark search and "
                 "handles), and images/s over the whole run with them\n\n";
    std::cout << "| case | dlbatch build s | of which GPU start-up s | "
                 "PyTorch compile s | dlbatch first step s | PyTorch first "
                 "step s | dlbatch whole-run images/s | PyTorch whole-run "
                 "images/s | ratio |\n";
    std::cout << "|---|---|---|---|---|---|---|---|---|\n";
    for (const std::string& row : one_off_rows) std::cout << row << "\n";
  }
  std::cerr << "logs: " << root << "\n";
  return failures == 0 ? 0 : 1;
}
