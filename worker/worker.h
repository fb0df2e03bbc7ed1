// The worker daemon's core: one stream to the scheduler, kept open across
// scheduler restarts, and the jobs it runs.
//
// Threads: Run() connects, registers and reads the scheduler's messages; a
// sender thread writes diary lines, job reports and heartbeats; the jobs
// thread owns the SubprocessSet; two transfer threads fetch attachments and
// upload outputs. Diary lines and job reports are kept until the scheduler
// acknowledges them and are sent again after a reconnect, so a scheduler
// killed at any moment loses none of them.
#ifndef DLBATCH_WORKER_WORKER_H_
#define DLBATCH_WORKER_WORKER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/blob_transfer.h"
#include "common/clock.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "worker/subprocess.h"

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
};

class Worker {
 public:
  Worker(WorkerOptions options, const Clock* clock);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until Shutdown(). Returns an error only for what reconnecting
  // cannot mend: a wrong token or a refused registration.
  absl::Status Run();
  // Stops every job (SIGTERM, then SIGKILL) and makes Run() return.
  // Thread-safe.
  void Shutdown();

 private:
  struct Job {
    int64_t key = 0;
    v1::StartJob start;
    std::string dir;
    enum Phase { kPreparing, kRunning, kFinishing, kEnded } phase = kPreparing;
    int64_t next_seq = 0;               // last diary seq assigned
    int64_t sent_seq = 0;               // last seq written on this stream
    std::deque<v1::DiaryLine> unacked;  // seq order
    std::optional<v1::JobEnded> ended;  // report, kept until acknowledged
    bool ended_sent = false;
    bool cancel_requested = false;
    std::string cancel_reason;
    bool time_limit_hit = false;
    int64_t deadline_mono = 0;  // 0: no time limit
    // Train jobs: the latest progress and stored checkpoint, each sent when
    // it changes and again after a reconnect.
    v1::TrainProgress progress;
    bool progress_unsent = false;
    std::optional<v1::CheckpointStored> checkpoint;
    bool checkpoint_unsent = false;
    bool checkpoint_busy = false;    // a transfer thread uploads one
    int64_t checkpoint_wanted = -1;  // iteration of a newer one to upload
    std::string trainer_error;       // the trainer's first error line
  };
  using Stream =
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>;

  // Connection (Run's thread).
  absl::Status Session();
  void Handle(const v1::SchedulerMessage& message);
  void HandleStart(const v1::StartJob& start);
  void HandleCancel(int64_t job_id, int attempt, int part, int64_t grace_ms,
                    const std::string& reason);
  // Sender thread.
  void SendLoop();
  bool Write(const v1::WorkerMessage& message);

  // Jobs thread.
  void JobsLoop();
  void RunOnJobsThread(std::function<void()> fn);
  void OnLine(int64_t key, const OutputLine& line);
  // REQUIRES mu_. A line of a train job's progress channel.
  void OnChannelLineLocked(Job& job, const OutputLine& line);
  void OnExit(int64_t key, const ExitInfo& info);
  void CheckDeadlines();

  // Transfer threads.
  void TransferLoop();
  void PostTransfer(std::function<void()> fn);
  void Prepare(int64_t key);
  // Uploads the checkpoint the trainer announced (newest first wins).
  void StoreCheckpoint(int64_t key);
  // Downloads a blob to `dest`, retrying while the scheduler is unreachable.
  absl::Status Fetch(const std::string& sha256, int64_t size,
                     const std::string& dest, uint32_t mode);
  absl::StatusOr<v1::OutputFile> Upload(const std::string& path,
                                        const std::string& rel);
  // Uploads an output open at `fd`, read once; retried while the
  // scheduler is unreachable.
  absl::StatusOr<LocalBlob> UploadOutput(int fd, int64_t size,
                                         const std::string& what);
  // The scheduler's address as a job's processes can use it.
  std::string RendezvousAddress() const;
  void Finish(int64_t key, ExitInfo info);
  void EndWithoutRunning(int64_t key, v1::JobState state,
                         const std::string& reason);

  // REQUIRES mu_.
  Job* FindLocked(int64_t job_id, int attempt, int part);
  void AddDiaryLocked(Job& job, int stream, const std::string& text);

  const WorkerOptions options_;
  const Clock* const clock_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerLink::Stub> link_;
  std::unique_ptr<v1::Scheduler::Stub> blobs_;

  std::mutex mu_;
  std::condition_variable cv_;              // sender and shutdown wake-ups
  std::map<int64_t, Job> jobs_;             // guarded by mu_, by key
  int64_t next_key_ = 1;                    // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  bool connected_ = false;                  // guarded by mu_
  bool dirty_ = false;                      // guarded by mu_: something to send
  int64_t heartbeat_ms_ = 1000;             // guarded by mu_
  grpc::ClientContext* context_ = nullptr;  // guarded by mu_

  std::mutex write_mu_;       // serialises writes; held across Write
  Stream* stream_ = nullptr;  // guarded by write_mu_

  std::mutex jobs_mu_;
  std::deque<std::function<void()>> jobs_commands_;  // guarded by jobs_mu_
  std::unique_ptr<SubprocessSet> subprocesses_;      // jobs thread only

  std::mutex transfer_mu_;
  std::condition_variable transfer_cv_;
  std::deque<std::function<void()>> transfers_;  // guarded by transfer_mu_

  std::vector<std::thread> threads_;
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_WORKER_H_
