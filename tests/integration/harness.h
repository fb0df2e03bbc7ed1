// A real cluster on loopback for integration tests: the real
// dlbatch-scheduler and dlbatch-worker binaries on a Unix socket (or TCP)
// in a temp folder, driven with the real dlbatch CLI.
#ifndef DLBATCH_TESTS_INTEGRATION_HARNESS_H_
#define DLBATCH_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/fashion_mnist.h"

namespace dlbatch::testing {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// Starts a program in a process group of its own, stdin from /dev/null,
// stdout and stderr appended to `log`; returns its pid.
pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log);

// Runs a program to completion, capturing stdout and stderr.
Result Exec(const std::vector<std::string>& argv,
            const std::map<std::string, std::string>& env = {},
            int timeout_ms = 120000);

std::string BinDir();
// FashionMnistDir(): tests/common/fashion_mnist.h.

// Caffe's LeNet for 28x28x1 images as a job file's `network:` block, indented
// to sit under `train:`.
extern const char kLenetNetworkYaml[];
// A job file training kLenetNetworkYaml on Fashion-MNIST with SGDM, seed 7:
// `header` (name:, pool:, ...) comes first, `extra_options` (lines indented
// by four) follow the options. DATA is the folder of the IDX files,
// relative to the job's folder (attached) or absolute (a shared
// filesystem).
std::string LenetJob(const std::string& data, const std::string& extra_options,
                     const std::string& header);
// A 64-bit integer field of proto3 JSON (written as a string); 0 if absent.
int64_t JsonInt(const nlohmann::json& j, const char* key);
// A time of the CLI's JSON ("2026-12-02T14:02:11.123Z") as ms since the
// epoch; 0 if it is not one.
int64_t JsonTimeMs(const nlohmann::json& time);
std::string ReadAll(const std::string& path);
void WriteAll(const std::string& path, const std::string& text);
bool WaitFor(const std::function<bool()>& ready, int timeout_ms);

// A loopback port free now (bound to port 0, then released).
int FreePort();
struct Http {
  int status = 0;  // 0: no answer
  std::string body;
};
// GET http://127.0.0.1:PORT/PATH (HTTP/1.0, so the body ends at close).
Http Get(int port, const std::string& path);
// The value of the series `series` (name and labels exactly as exposed) in
// a Prometheus scrape; NaN if absent.
double Sample(const std::string& scrape, const std::string& series);

class Cluster {
 public:
  Cluster();   // makes the temp folder
  ~Cluster();  // kills everything it started, removes the folder

  const std::string& dir() const { return dir_; }
  std::string address() const { return address_; }

  // Starts the scheduler; `listen` empty: a Unix socket in dir().
  void StartScheduler(std::vector<std::string> extra = {},
                      const std::string& listen = "");
  // Runs the scheduler (from the next StartScheduler on) through `prefix`,
  // such as setpriv as another user.
  void set_scheduler_prefix(std::vector<std::string> prefix) {
    scheduler_prefix_ = std::move(prefix);
  }
  void KillScheduler(int sig);
  // Waits for the scheduler to exit on its own (a fault it was told to
  // inject); true once it has, and it is reaped.
  bool WaitSchedulerExit(int timeout_ms);
  // The CLI's argv and environment as Cli() runs them, for a test that
  // runs the CLI on a thread of its own while it restarts the scheduler.
  std::vector<std::string> CliArgv(const std::vector<std::string>& args) const;
  std::map<std::string, std::string> CliEnv() const;
  pid_t scheduler_pid() const { return scheduler_.pid; }
  // Starts a worker with `slots` CPU slots; returns its index. `slots` 0:
  // without --cpu-slots, so the worker offers the GPUs it finds (else one
  // slot per core).
  // `prefix`: run it through this (setpriv as another user).
  int StartWorker(const std::string& name, int slots,
                  const std::string& profile = "local",
                  std::vector<std::string> extra = {},
                  std::vector<std::string> prefix = {});
  void KillWorker(int index, int sig);
  // Starts worker `index` again as it was first started (same name, work
  // folder and flags), after KillWorker.
  void RestartWorker(int index);
  pid_t worker_pid(int index) const { return workers_[index].pid; }

  // Runs the dlbatch CLI against this cluster.
  Result Cli(std::vector<std::string> args,
             std::map<std::string, std::string> env = {},
             int timeout_ms = 120000);
  // Writes a job file into dir() and returns its path.
  std::string JobFile(const std::string& name, const std::string& yaml);
  // Submits and returns the job id (fails the test on error).
  int64_t Submit(const std::string& job_file,
                 std::vector<std::string> extra = {});
  nlohmann::json ShowJson(int64_t id);
  std::string State(int64_t id);
  bool WaitState(int64_t id, const std::string& state, int timeout_ms = 30000);
  // Waits until `workers` workers are online.
  bool WaitWorkers(int workers, int timeout_ms = 15000);

  std::string scheduler_state() const { return dir_ + "/state"; }
  // A TCP scheduler's CA (its state folder's ca.pem), which Cli() passes as
  // DLBATCH_CA (unless a test sets it) and StartWorker as --ca-file.
  std::string ca_file() const { return scheduler_state() + "/ca.pem"; }
  bool is_tcp() const {
    return !address_.empty() && address_.rfind("unix:", 0) != 0;
  }
  // Every process log in dir(), each under its file name: for failures.
  std::string Logs() const;

 private:
  struct Proc {
    pid_t pid = 0;
    std::string name;
    std::vector<std::string> argv;  // how it was started
  };
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log);

  std::string dir_;
  std::string address_;
  std::vector<std::string> scheduler_args_;
  std::vector<std::string> scheduler_prefix_;
  Proc scheduler_;
  std::vector<Proc> workers_;
};

}  // namespace dlbatch::testing

#endif  // DLBATCH_TESTS_INTEGRATION_HARNESS_H_
