// One rank's training run: the loop that ties data, network, solver,
// communicator, checkpoints and outputs together. dlbatch-train runs it once
// per rank: in the rank's own thread where a process trains several ranks
// (thread_ranks.h), else in the rank's process. The worker starts a job's
// CPU ranks as threads of one `dlbatch-train --thread-ranks` process and
// its GPU ranks as one process per GPU (worker/train_job.h).
#ifndef DLBATCH_TRAINER_TRAINING_H_
#define DLBATCH_TRAINER_TRAINING_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/job.pb.h"
#include "trainer/backend_select.h"
#include "trainer/comm/communicator.h"
#include "trainer/data/data.h"
#include "trainer/output/progress.h"

namespace dlbatch::trainer {

// A run's data sets as read from its spec's data section: the training set
// (less what validation_split holds out), validation and test sets, and
// the training images' normalisation where the spec asks for it.
struct TrainingData {
  Dataset train;
  std::optional<Dataset> validation, test;
  Normalization normalization;
};

struct TrainRequest;
// Reads the request's data sets with request.threads threads (0: every
// core), saying what it decoded, cached or held out to `say` (may be
// empty).
absl::StatusOr<TrainingData> LoadTrainingData(
    const TrainRequest& request,
    const std::function<void(const std::string&)>& say);

struct TrainRequest {
  v1::TrainSpec spec;
  std::string name = "model";  // the job's name, for titles
  std::string base_dir = ".";  // relative data paths start here
  std::string output_dir;      // rank 0 writes outputs and checkpoints here
  // Continue from output_dir/checkpoint.dlbc when it exists (and say so);
  // start from the beginning when it does not.
  bool resume = false;
  int threads = 0;  // per rank; 0: the backend's default
  // How the run's ranks (its replicas) sit in processes, for the diary and
  // metrics.json: the ranks each process trains on its threads, in process
  // order (trainer/thread_ranks.h). Empty: a process per rank.
  std::vector<int> ranks_per_process;
  // A folder where the backend's kernel choices (Backend::SaveTuning) are
  // kept between runs on this machine, so that runs of the same job with
  // the same seed compute alike and skip the timing; "" for none.
  std::string tuning_cache;
  // Overrides of the spec's options (the benchmark's and tests' knobs).
  std::optional<int64_t> max_epochs;
  std::optional<int64_t> max_iterations;
  std::optional<int> mini_batch_size;
  // On a GPU with one rank: record the training step once per batch slot
  // as a CUDA graph (Backend::StartRecording) and replay it, one launch a
  // step instead of forty-odd. dlbatch-train sets it unless
  // DLBATCH_CUDA_GRAPHS=0. Where recording fails the run says so and goes
  // on without.
  bool record_steps = false;
  // Whether training and evaluation batches travel to the backend as the
  // data set's bytes, to be made into images there (Backend::PrepareImages),
  // instead of as floats the loader made: a quarter of the bytes to copy
  // and no conversion on the host. Unset: on a GPU. Either way the images
  // are the same bits. dlbatch-train sets it from DLBATCH_BYTES_BATCHES=0|1.
  std::optional<bool> batches_as_bytes;
  // Dynamic loss scaling (loss_scaler.h): unset, where the backend asks
  // for it (Backend::scales_loss: precision fp16); true or false forces it
  // either way (dlbatch-train: DLBATCH_LOSS_SCALING=1|0; tests scale an
  // fp32 run on the CPU, where scaling by powers of two changes no bit).
  std::optional<bool> loss_scaling;
  // Test-only: the step of this iteration (1-based; 0: none) finds an
  // infinite gradient after its backward pass, as an fp16 overflow would
  // leave one (dlbatch-train: DLBATCH_TEST_INF_AT_ITERATION); with loss
  // scaling the step is skipped, without it the weights take it.
  int64_t inject_inf_at_iteration = 0;
  // The data sets, read already (LoadTrainingData): the ranks of one
  // process share one copy. Null: Train reads them. Not owned.
  const TrainingData* data = nullptr;
  Communicator* communicator = nullptr;  // required; not owned
  BackendChoice device;  // the CPU unless ChooseBackend chose a GPU
  // Where ranks > 0 take rank 0's kernel choices (Backend::SaveTuning), so
  // that every rank computes alike and a resume continues bit for bit.
  // Optional (one rank needs none); not owned.
  Rendezvous* rendezvous = nullptr;
  ProgressChannel* progress = nullptr;  // optional; not owned
  std::FILE* diary = stdout;            // the human output (rank 0 only)
  // Checkpoint and stop (stop_request.h): set (by the thread that takes
  // the signal, or a test) when this rank is asked to stop with its work kept.
  // The ranks agree on it after build and then at iterations they all reach
  // alike (every step on the CPU, every few on a GPU, as the loop reads its
  // numbers there); when any was asked, every rank stops after that same
  // step: rank 0 writes the checkpoint of it (unless the step wrote one)
  // and announces it on the progress channel, and Train returns with
  // TrainResult::stopped_on_request. Asked before the first step: they
  // stop before it, with no new checkpoint. Asked at or after the last
  // step: ignored, the run ends as it would have. Null: never asked.
  // Not owned.
  const std::atomic<bool>* stop_requested = nullptr;
};

struct TrainResult {
  int64_t iterations = 0;  // completed, in total
  double epochs = 0;
  double wall_time_s = 0;   // this process, set-up included
  double train_time_s = 0;  // inside training steps, this process
  double images_per_s = 0;  // training images / train_time_s
  // Making the backend and the network, before the first step (a GPU's
  // convolution algorithm search included, where no tuning cache has it).
  double build_time_s = 0;
  // Of build_time_s, making the backend: on a GPU the CUDA context, the
  // cuDNN and cuBLAS handles and the streams (the device's start-up).
  double backend_time_s = 0;
  // This process's first step, waited for on the device; part of
  // train_time_s. None where the process ran no step.
  std::optional<double> first_step_s;
  double train_loss = 0;  // last mini-batch
  double train_accuracy = 0;
  std::optional<double> validation_loss;  // final, whole validation set
  std::optional<double> validation_accuracy;
  std::optional<double> test_loss;  // data.test, when given
  std::optional<double> test_accuracy;
  bool stopped_early = false;  // validation patience ran out
  // Stopped on request (TrainRequest::stop_requested) after `iterations`,
  // their checkpoint written (none where no step ran): no outputs but the
  // checkpoint and its history; resume to go on.
  bool stopped_on_request = false;
  bool resumed = false;
};

// Trains, writing to output_dir (rank 0): checkpoint.dlbc at every
// checkpoint and at the end, model.onnx, training_history.csv,
// metrics.json and training_progress.svg (a run stopped on request:
// checkpoint.dlbc and training_history.csv only). Every rank returns the
// same result. A non-finite loss is an error naming the iteration.
absl::StatusOr<TrainResult> Train(const TrainRequest& request);

// The file names inside output_dir.
inline constexpr char kCheckpointFile[] = "checkpoint.dlbc";
inline constexpr char kOnnxFile[] = "model.onnx";
inline constexpr char kHistoryFile[] = "training_history.csv";
inline constexpr char kMetricsFile[] = "metrics.json";
inline constexpr char kPlotFile[] = "training_progress.svg";

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_TRAINING_H_
