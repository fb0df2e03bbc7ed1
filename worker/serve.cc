#include "worker/serve.h"

#include <unistd.h>

#include <chrono>
#include <memory>
#include <thread>

#include "common/clock.h"
#include "common/endpoint.h"
#include "common/metrics_server.h"
#include "common/signals.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/blob_transfers.h"
#include "worker/metrics.h"
#include "worker/process_runner.h"
#include "worker/scheduler_link.h"
#include "worker/startup.h"
#include "worker/worker.h"

namespace dlbatch::worker {
namespace {

// How long a signalled worker may take to stop before it just exits.
constexpr int kStopDeadlineS = 60;

// --metrics-listen: the slots and GPUs, and ready while connected.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetrics(
    const std::string& listen, const WorkerOptions& options, Worker* worker) {
  return MetricsServer::Start(
      listen,
      {MakeWorkerMetrics(options.name, options.profile,
                         options.devices.front().kind(),
                         static_cast<int>(options.devices.size()),
                         [worker] { return worker->busy_slots(); })},
      [worker] {
        return worker->connected() ? "" : "not connected to the scheduler";
      });
}

// How long a Slurm job's worker gives its jobs to checkpoint and stop when
// Slurm signals it: Slurm kills them at its own GraceTime or KillWait
// anyway; within kStopDeadlineS, so the end is reported before it leaves.
constexpr int64_t kSlurmStopGraceMs = 30000;

void StopOnSignal(Worker* worker, bool slurm_job) {
  OnStopSignal([worker, slurm_job](int sig) {
    spdlog::info("signal {}: stopping the jobs and leaving", sig);
    // Stopping kills the jobs and cancels calls, none of which may take
    // long; should anything wedge, the worker still leaves (its jobs die
    // with it: parent-death signal and cgroup).
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(kStopDeadlineS));
      spdlog::error("not stopped {} s after the signal: leaving now",
                    kStopDeadlineS);
      spdlog::shutdown();
      _exit(1);
    }).detach();
    if (slurm_job) {
      // Slurm's preemption or scancel: the jobs checkpoint where they can,
      // their ends go to the scheduler, which asks Slurm why.
      worker->StopForSlurm(sig, kSlurmStopGraceMs);
    } else {
      worker->Shutdown();
    }
  });
}

}  // namespace

absl::Status Serve(const DaemonOptions& settings) {
  RETURN_IF_ERROR(CheckSchedulerTls(settings));
  ASSIGN_OR_RETURN(HostSetup host, PrepareHost(settings));
  WorkerOptions options = MakeWorkerOptions(settings, host);
  options.read_gpus = ReadGpus;

  const Clock* clock = SystemClock::Get();
  std::shared_ptr<grpc::Channel> channel = MakeChannel(options.channel);
  std::unique_ptr<LinkTransport> transport =
      MakeGrpcLinkTransport(channel, options.channel);
  std::unique_ptr<BlobTransfers> transfers =
      MakeGrpcBlobTransfers(channel, options.channel.token);
  SubprocessRunner runner(
      clock, JobContainment{host.guard.cgroup_root, host.guard.mark_prefix});
  Worker worker(options, clock, &runner, transfers.get(), transport.get());
  std::unique_ptr<MetricsServer> metrics;
  if (!settings.flags.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(
        metrics, StartMetrics(settings.flags.metrics_listen, options, &worker));
    spdlog::info("metrics on http://{}/metrics", metrics->address());
  }
  StopOnSignal(&worker, options.slurm_job.has_value());
  absl::Status s = worker.Run();
  // The jobs are stopped: the guard's last sweep finds nothing, and the
  // worker leaves only once it has ended (a service manager would otherwise
  // SIGKILL it as a leftover of the unit).
  if (!EndJobGuard(&host.job_guard, 2000)) {
    spdlog::warn(
        "the job guard (pid {}) had not ended 2 s after the worker "
        "closed its pipe",
        host.job_guard.pid);
  }
  return s;
}

}  // namespace dlbatch::worker
