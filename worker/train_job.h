// What a worker does for a `train:` job beyond what it does for any job:
// the trainer's command line and environment, and reading the trainer's
// structured progress (v1.TrainProgress as JSON lines on descriptor 3).
#ifndef DLBATCH_WORKER_TRAIN_JOB_H_
#define DLBATCH_WORKER_TRAIN_JOB_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "worker/subprocess.h"

namespace dlbatch::worker {

// Files in a job's working folder that the worker, not the job, writes.
inline constexpr char kTrainSpecFile[] = ".dlbatch-job.pb";
inline constexpr char kCheckpointSnapshotDir[] = ".dlbatch-checkpoint";
// The trainer's files that make a checkpoint: the weights and state, and
// the history up to them (so a resumed run's history has no gap).
inline constexpr const char* kCheckpointFiles[] = {"checkpoint.dlbc",
                                                   "training_history.csv"};

struct TrainLaunch {
  std::string trainer;     // the dlbatch-train executable
  std::string job_dir;     // the job's working folder (attachments there)
  std::string output_dir;  // job_dir/output
  std::string rendezvous;  // the scheduler's address, absolute for unix:
  std::string host;        // address this worker's ranks listen on
  bool resume = false;     // a stored checkpoint was laid out in output_dir
  // The worker's slots are GPUs: a process per GPU. CPU slots: one process
  // whose threads are the part's ranks, a slot each (--thread-ranks).
  bool gpus = false;
  // TCP: the CA (PEM) of the scheduler's TLS, for the ranks' rendezvous.
  std::string rendezvous_ca;
  // SIGTERM asks the trainer for a checkpoint-and-stop (--stop-on-term):
  // a worker inside a Slurm allocation, whose trainers Slurm's preemption
  // (or scancel, or the time limit) signals as well as the worker.
  bool stop_on_term = false;
};

// Writes the spec where the trainer reads it and fills `sp` (argv, cwd,
// env, the progress channel) to run the part's ranks: one per device, as
// a process per GPU or as one process of a thread per CPU slot.
absl::Status PrepareTrainCommand(const v1::StartJob& start,
                                 const TrainLaunch& launch,
                                 SubprocessOptions* sp);

// What one line of the trainer's progress channel says.
struct ChannelEvent {
  enum Kind { kIgnored, kProgress, kCheckpoint } kind = kIgnored;
  int64_t iteration = 0;  // kCheckpoint: the iteration it holds
};
// Reads a line of the channel, protobuf's JSON form of v1.TrainProgress
// (trainer/output/progress.h: each line the run's whole progress), into
// `progress` (the job's latest), stamped `now_ms`. A line whose
// checkpoint_iteration differs from the one `progress` had announces a
// checkpoint (kCheckpoint). Lines that are not a TrainProgress (not JSON,
// unknown fields, wrong types) are ignored and change nothing: the channel
// is the trainer's and the worker must survive anything on it.
ChannelEvent ApplyChannelLine(const std::string& line, int64_t now_ms,
                              v1::TrainProgress* progress);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_TRAIN_JOB_H_
