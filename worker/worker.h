// The worker daemon: its JobTable fed by the scheduler's messages (through
// the SchedulerLink), the job's processes (through a ProcessRunner), the
// transfers (run in a TransferPool over BlobTransfers) and time (a Clock);
// what the table decides is carried out here, and its records go to the
// link, which keeps them until the scheduler acknowledges them.
//
// Threads: Run() is the link's session loop; the link has a sender, the
// runner its own thread, the pool its transfer threads, and a ticker
// enforces time limits. Each calls into the table under mu_; no lock of the
// worker is held across a stream write or a transfer.
#ifndef DLBATCH_WORKER_WORKER_H_
#define DLBATCH_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "worker/blob_transfers.h"
#include "worker/job_launch.h"
#include "worker/job_table.h"
#include "worker/process_runner.h"
#include "worker/scheduler_link.h"
#include "worker/transfer_pool.h"

namespace dlbatch::worker {

struct WorkerOptions {
  ChannelConfig channel;
  std::string name;  // stable identity across restarts
  std::string host;
  std::string profile;
  std::string work_dir;  // jobs run in WORK_DIR/jobs/<id>-<attempt>-<part>
  std::vector<v1::Device> devices;
  bool keep_job_dirs = false;
  std::string trainer;  // dlbatch-train, for `train:` jobs
  // The folder holding the `dlbatch` Python module, put on command jobs'
  // PYTHONPATH ("": none).
  std::string python_dir;
  // How often time limits are checked; 0: never by itself (tests call
  // Tick()).
  int64_t tick_ms = 100;
  // Transfers running at once at most (one per job at a time).
  int max_transfer_threads = 64;
  // The worker's environment variables jobs inherit besides kJobBaseEnv
  // (--job-env).
  std::vector<std::string> job_env;
  // A Slurm profile's ephemeral worker (slurm_job.h): says so at
  // registration, serves that job attempt only, and Run() returns once
  // every part of it it was given has ended and been acknowledged.
  std::optional<v1::SlurmJob> slurm_job;
  // Told to the scheduler at registration (version.h's Version()).
  std::string version;
  // Its GPUs' readings for the scheduler (LinkOptions::read_gpus); null:
  // none sent.
  std::function<std::vector<v1::GpuReading>()> read_gpus;
};

class Worker final : public LinkHandler, public ProcessEvents {
 public:
  // Every collaborator must outlive the worker. Attaches itself to
  // `runner`.
  Worker(WorkerOptions options, const Clock* clock, ProcessRunner* runner,
         BlobTransfers* transfers, LinkTransport* transport);
  ~Worker() override;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until Shutdown(). Returns an error only for what reconnecting
  // cannot mend: a wrong token or a refused registration.
  absl::Status Run();
  // Kills every job and makes Run() return. Thread-safe.
  void Shutdown();
  // A Slurm profile's ephemeral worker got `signal` from Slurm (a
  // preemption or scancel ends its Slurm job): its jobs checkpoint and stop
  // within `grace_ms` (JobTable::SlurmStopping), their ends are reported,
  // and Run() returns once they are acknowledged, as at any job's end. A
  // worker that holds no job yet shuts down. Thread-safe.
  void StopForSlurm(int signal, int64_t grace_ms);
  // Checks time limits now (the ticker does it every tick_ms).
  void Tick();

  // Tests.
  std::optional<JobPhase> Phase(const JobRef& ref) const;
  bool connected() const { return link_.connected(); }
  size_t Unacked(const JobRef& ref) const { return link_.Unacked(ref); }
  // Slots its jobs hold now (the metrics read it without the lock).
  int busy_slots() const { return busy_slots_.load(); }

  // LinkHandler.
  void OnSchedulerMessage(const v1::SchedulerMessage& message) override;
  // ProcessEvents.
  void ProcessStarted(int64_t key, absl::Status status) override;
  void ProcessLine(int64_t key, const OutputLine& line) override;
  void ProcessExited(int64_t key, const ExitInfo& info) override;

 private:
  // Carries out what the table decided: records to the link, actions to
  // the runner and the pool (neither calls back before this returns).
  void Apply(JobEffects effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An ephemeral worker's job has ended and been acknowledged: removes its
  // folder and stops the worker (on a thread of its own: Shutdown() may
  // not be called under mu_ or from the link's or runner's threads).
  void FinishSlurmJob(const std::string& dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PrepareTask(const JobAction& action);
  void UploadOutputsTask(const JobAction& action);
  void CheckpointTask(const JobAction& action);
  void TickLoop();

  const WorkerOptions options_;
  const Clock* const clock_;
  ProcessRunner* const runner_;
  BlobTransfers* const transfers_;
  LaunchContext launch_;

  mutable absl::Mutex mu_;
  JobTable table_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> busy_slots_{0};  // table_.BusySlots() after each Apply
  // Held for the whole of Shutdown(), so that a second caller (the signal
  // thread and Run() both stop the worker) returns only once the first has
  // stopped everything: the runner's thread is then joined exactly once.
  absl::Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  SchedulerLink link_;
  TransferPool pool_;
  std::thread ticker_;
  // An ephemeral worker's job: whether a part of it arrived, and the
  // thread that stops the worker once none is left.
  bool served_ ABSL_GUARDED_BY(mu_) = false;
  std::thread finisher_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_WORKER_H_
