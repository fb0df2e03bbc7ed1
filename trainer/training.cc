#include "trainer/training.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/backend_select.h"
#include "trainer/comm/grad_buckets.h"
#include "trainer/data/data.h"
#include "trainer/loss_scaler.h"
#include "trainer/network.h"
#include "trainer/options.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"
#include "trainer/output/onnx_export.h"
#include "trainer/rng.h"
#include "trainer/solver.h"
#include "trainer/stop_request.h"
#include "trainer/thread_ranks.h"

namespace dlbatch::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* SolverName(SolverKind kind) {
  switch (kind) {
    case SolverKind::kSgdm:
      return "sgdm";
    case SolverKind::kAdam:
      return "adam";
    case SolverKind::kRmsprop:
      return "rmsprop";
  }
  return "?";
}

absl::Status CheckFits(const Dataset& data, const Network& net,
                       absl::string_view role) {
  if (!(data.shape == net.input_shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.data.", role, ": images of ", data.source, " are ",
                     data.shape.ToString(), " but the network's input is ",
                     net.input_shape().ToString(), "; change network.input to ",
                     data.shape.ToString()));
  }
  if (data.num_classes > net.num_classes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.data.", role, ": ", data.source, " has labels up to ",
        data.num_classes - 1, " but the network's last fc layer has ",
        net.num_classes(), " units; give it ", data.num_classes, " units"));
  }
  return absl::OkStatus();
}

// Metrics of a pass over a data set.
struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Backend::Describe() less a CPU backend's thread count ("cpu: oneDNN
// 2.6.3, 2 threads, bf16": each replica's), which the diary's first line
// gives for the run's processes instead.
std::string DeviceWithoutThreads(const Backend& backend) {
  if (backend.on_gpu()) return backend.Describe();
  std::vector<std::string> kept;
  for (const absl::string_view part :
       absl::StrSplit(backend.Describe(), ", ")) {
    if (!absl::EndsWith(part, " thread") && !absl::EndsWith(part, " threads")) {
      kept.emplace_back(part);
    }
  }
  return absl::StrJoin(kept, ", ");
}

class Run {
 public:
  explicit Run(const TrainRequest& request)
      : req_(request), comm_(*request.communicator) {}
  // The communicator outlives the backend's stream it was given.
  ~Run() { comm_.SetComputeStream(nullptr); }

  // The run: builds it, then the loop (each iteration a Step of the step
  // pipeline, and what the iteration asks besides: reading the steps'
  // numbers back, validating, reporting, checkpointing), then the outputs.
  absl::StatusOr<TrainResult> Execute();

 private:
  bool leader() const { return comm_.rank() == 0; }
  void Say(const std::string& line) {
    if (leader() && req_.diary != nullptr) {
      std::fprintf(req_.diary, "%s\n", line.c_str());
      std::fflush(req_.diary);
    }
  }
  std::string OutPath(const char* file) const {
    return absl::StrCat(req_.output_dir, "/", file);
  }
  double Elapsed() const { return elapsed_offset_ + SecondsSince(start_); }
  // The tuning cache file for this backend on this machine; "" for none.
  std::string TuningCachePath() const;

  absl::Status LoadData();
  absl::Status Build();
  absl::Status ResumeIfAsked();
  absl::StatusOr<Evaluation> Evaluate(const Dataset& data);
  absl::Status AverageState();
  absl::Status SaveCheckpoint();
  absl::Status WriteOutputs(const TrainResult& result);
  // Takes the step's figures into progress_ and reports it at most every
  // 500 ms unless `force`.
  void EmitProgress(double images_per_s, bool force);
  // Writes progress_ on the channel, stamped now (the leader's only).
  void Report();
  int64_t EpochOf(int64_t iteration) const;
  int64_t Epochs() const;
  // This rank's stop request (TrainRequest::stop_requested).
  bool StopAsked() const {
    return req_.stop_requested != nullptr &&
           req_.stop_requested->load(std::memory_order_relaxed);
  }
  // Whether any rank was asked to stop: a collective (stop_request.h).
  absl::StatusOr<bool> AgreeToStop() {
    return trainer::AgreeToStop(StopAsked(), comm_, *backend_,
                                stop_flag_.f32());
  }
  // Ends a run stopped on request after iteration_ (its checkpoint
  // written, where a step ran): says so, and leaves with the other ranks.
  absl::StatusOr<TrainResult> StopOnRequest(TrainResult result);
  BatchRequest RequestFor(int64_t iteration);

  const TrainRequest& req_;
  Communicator& comm_;
  Options opt_;
  Clock::time_point start_ = Clock::now();
  double elapsed_offset_ = 0;

  // The data sets: the request's, else data_'s (LoadData).
  TrainingData data_;
  const Dataset* train_ = nullptr;
  const Dataset* validation_ = nullptr;   // null: none
  const Dataset* test_ = nullptr;         // null: none
  std::optional<Checkpoint> checkpoint_;  // read for --resume
  // The data's; a resumed run's is its checkpoint's.
  Normalization normalization_;

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<Solver> solver_;
  // Evaluate's batch and sums; with bytes_, the batch's bytes (pixels_).
  // What PrepareImages makes images with (scale_bias_, with bytes_).
  Buffer images_, labels_, stats_, pixels_, scale_bias_;
  Buffer stop_flag_;    // AgreeToStop's float
  bool bytes_ = false;  // TrainRequest::batches_as_bytes, resolved
  // A training step's loss and accuracy sums (device float[2]), copied
  // into stats_ring_ after the step: a fixed address, so that a recorded
  // step writes the same place each time.
  Buffer step_stats_;
  // Training batches, double-buffered: while a step computes on one slot,
  // the next batch is copied into the other (Backend::Upload; on a GPU from
  // the slot's page-locked host memory). With bytes_ (by default on a GPU)
  // it travels as bytes and placements (BatchLoader::Options::bytes), and
  // PrepareImages makes the slot's images of them before the step.
  struct Slot {
    Buffer images, labels;
    Buffer pixels, placements;  // bytes_
    // On a GPU: host_pixels and host_placements with bytes_, else
    // host_images.
    HostMemory host_images, host_pixels, host_placements, host_labels;
    uint64_t upload = 0;  // token of the slot's last upload
    int n = 0;            // samples staged
    bool placed = false;  // whether the staged batch has placements
  };
  Slot slots_[2];
  // Each step's loss and accuracy sums, kStatsRing steps deep: the host
  // reads them (a wait for the device) only where it needs a number.
  static constexpr int kStatsRing = 64;
  static constexpr int kReadEvery = 16;  // on a GPU; < kStatsRing
  Buffer stats_ring_;
  // The step recorded for each slot (TrainRequest::record_steps) and its
  // batch size; freed before the backend (declared after it).
  std::unique_ptr<Recording> recorded_[2];
  int recorded_n_[2] = {0, 0};

  int global_batch_ = 0;
  int lo_ = 0, hi_ = 0;  // this rank's slice of each global batch
  int64_t per_epoch_ = 0;
  int64_t total_ = 0;  // iterations of the whole run
  std::string fingerprint_;
  double backend_time_ = 0;  // TrainResult::backend_time_s

  // Position: iterations completed, and where the next one is.
  int64_t iteration_ = 0;
  double best_validation_loss_ = std::numeric_limits<double>::infinity();
  int64_t without_improvement_ = 0;
  bool resumed_ = false;

  TrainingHistory history_;
  double last_loss_ = 0, last_accuracy_ = 0, last_lr_ = 0;
  Clock::time_point last_emit_{};
  // What the progress channel says: the run's latest (progress.h).
  v1::TrainProgress progress_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;

  // --- The step pipeline: batches from the loader into the slots, a step
  // on the device with the solver's update, its numbers read back. ---
  // Starts the loader, the gradients' buckets, and stages the first batch.
  absl::Status StartPipeline();
  // Keeps the loader `depth` batches ahead of the step.
  void TopUp();
  absl::StatusOr<Batch> NextBatch();
  absl::Status Stage(const Batch& b, Slot& slot);
  absl::Status Compute(const Slot& s);
  absl::StatusOr<std::unique_ptr<Recording>> RecordStep(const Slot& s);
  // Runs step iteration_ + 1 (its batch staged in slots_[current_]) and the
  // solver's update, staging the next batch while it computes; queues the
  // step for Retire.
  absl::Status Step();
  // Reads the queued steps' sums (waiting for the device), records them in
  // the history and checks them.
  absl::Status Retire();
  // With loss scaling, after a step's backward pass and its allreduce:
  // whether its gradients are finite (a host wait for their sum of
  // squares), told to the scaler. Returns whether to apply the step, its
  // gradients then unscaled for the solver.
  bool UnscaleGradients();
  // The factor the loss gradient is multiplied by: 1 / the global batch,
  // times the loss scale where there is one.
  float BackwardScale() const {
    return scaler_ ? static_cast<float>(scale_ * scaler_->scale()) : scale_;
  }

  // Steps queued whose loss the host has not read yet.
  struct Queued {
    int64_t iteration, epoch;
    double lr, elapsed;
    double loss_scale;      // the step's (with loss scaling)
    int64_t skipped_steps;  // up to and including the step
  };
  std::unique_ptr<GradientBuckets> buckets_;
  float scale_ = 0;  // 1 / the global batch
  std::vector<Queued> queued_;
  // Dynamic loss scaling (TrainRequest::loss_scaling). Its scale is fixed
  // in a recorded step (a scalar of the loss's backward call): a new scale
  // records the step again.
  std::optional<LossScaler> scaler_;
  // Steps skipped for a gradient that was not finite, over the run (a
  // resumed one's included): adam's step count leaves them out.
  int64_t skipped_steps_ = 0;
  std::vector<float> ring_;  // stats_ring_ read back
  bool record_ = false;      // steps are recorded (CUDA graphs)
  bool said_recorded_ = false;
  bool has_dropout_ = false;
  int64_t steps_run_ = 0;   // by this process
  int current_ = 0;         // the slot of the next step's batch
  int64_t step_epoch_ = 0;  // the last step's epoch and learn rate
  double step_lr_ = 0;
  int loader_depth_ = 0;
  int64_t pushed_ = 0;  // batches asked of the loader
  // Last: it reads train_, and goes first.
  std::unique_ptr<BatchLoader> loader_;

  // --- The reporter: the diary's table and the progress channel. ---
  bool verbose() const { return leader() && req_.diary != nullptr; }
  void ReportStart();
  void ReportRow(int64_t epoch, double lr,
                 const std::optional<Evaluation>& validation);
  void ReportValidation(const Evaluation& v);
  void ReportDone(const TrainResult& result);
  ProgressTable table_{nullptr};
};

absl::Status Run::LoadData() {
  const TrainingData* data = req_.data;
  if (data == nullptr) {
    ASSIGN_OR_RETURN(
        data_,
        LoadTrainingData(req_, [this](const std::string& line) { Say(line); }));
    data = &data_;
  }
  train_ = &data->train;
  validation_ = data->validation ? &*data->validation : nullptr;
  test_ = data->test ? &*data->test : nullptr;
  normalization_ = data->normalization;
  return absl::OkStatus();
}

std::string Run::TuningCachePath() const {
  if (req_.tuning_cache.empty()) return "";
  std::string machine;
  if (absl::StatusOr<std::string> cpuinfo = ReadFile("/proc/cpuinfo");
      cpuinfo.ok()) {
    const size_t at = cpuinfo->find("model name");
    if (at != std::string::npos) {
      machine = cpuinfo->substr(at, cpuinfo->find('\n', at) - at);
    }
  }
  // Choices hold for one library version, thread count and processor.
  const std::string scope = Sha256Hex(backend_->Describe() + "|" + machine);
  return absl::StrCat(req_.tuning_cache, "/tuning-", scope.substr(0, 16),
                      ".txt");
}

absl::Status Run::Build() {
  if (!req_.device.note.empty()) Say(req_.device.note + ".");
  const auto backend_start = Clock::now();
  ASSIGN_OR_RETURN(backend_,
                   MakeChosenBackend(req_.device, req_.threads,
                                     req_.spec.options().precision()));
  backend_time_ = SecondsSince(backend_start);
  if (req_.loss_scaling.value_or(backend_->scales_loss())) {
    scaler_.emplace();
    history_.loss_scaling = true;
  }
  // Collectives wait for this stream's work with events, not device syncs.
  comm_.SetComputeStream(backend_->native_stream());
  const std::string cache = TuningCachePath();
  if (!cache.empty()) {
    absl::StatusOr<std::string> tuning = ReadFile(cache);
    if (tuning.ok()) backend_->LoadTuning(*tuning);
  }
  if (req_.resume && access(OutPath(kCheckpointFile).c_str(), F_OK) == 0) {
    // Read before the kernels are made, so that they choose the
    // implementations the interrupted run computed with.
    ASSIGN_OR_RETURN(Checkpoint c, ReadCheckpoint(OutPath(kCheckpointFile)));
    backend_->LoadTuning(c.tuning);
    checkpoint_ = std::move(c);
  }

  global_batch_ = opt_.mini_batch_size;
  const int world = comm_.size();
  if (global_batch_ < world) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.options.mini_batch_size ", global_batch_,
                     " is smaller than the ", world,
                     " ranks that share it; use a mini_batch_size of at least ",
                     world, " or a smaller pool"));
  }
  if (train_->count < global_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.options.mini_batch_size ", global_batch_, " exceeds the ",
        train_->count, " training images of ", train_->source,
        "; use a mini_batch_size of at most ", train_->count));
  }
  lo_ = static_cast<int>(int64_t{global_batch_} * comm_.rank() / world);
  hi_ = static_cast<int>(int64_t{global_batch_} * (comm_.rank() + 1) / world);
  const int max_batch = (global_batch_ + world - 1) / world;
  constexpr char kTuningKey[] = "tuning";
  if (req_.rendezvous != nullptr && !leader()) {
    ASSIGN_OR_RETURN(std::string tuning,
                     req_.rendezvous->Get(kTuningKey, absl::Minutes(10)));
    backend_->LoadTuning(tuning);
  }
  ASSIGN_OR_RETURN(net_, Network::Build(req_.spec.network(), backend_.get(),
                                        max_batch, &comm_));
  if (req_.rendezvous != nullptr && leader()) {
    RETURN_IF_ERROR(req_.rendezvous->Set(kTuningKey, backend_->SaveTuning()));
  }
  if (!cache.empty() && leader()) {
    // Best effort: a cache that cannot be written only costs the next run
    // its timing.
    if (MakeDirs(req_.tuning_cache, 0700).ok()) {
      WriteFileAtomic(cache, backend_->SaveTuning()).IgnoreError();
    }
  }
  RETURN_IF_ERROR(CheckFits(*train_, *net_, "train"));
  if (validation_)
    RETURN_IF_ERROR(CheckFits(*validation_, *net_, "validation"));
  if (test_) RETURN_IF_ERROR(CheckFits(*test_, *net_, "test"));

  per_epoch_ = train_->count / global_batch_;
  total_ = opt_.max_iterations > 0 ? opt_.max_iterations
                                   : opt_.max_epochs * per_epoch_;

  net_->Initialize(opt_.seed);
  net_->SetLabelSmoothing(static_cast<float>(opt_.label_smoothing));
  ASSIGN_OR_RETURN(solver_, Solver::Create(opt_, backend_.get(), net_.get()));
  const size_t sample = static_cast<size_t>(net_->input_shape().size());
  ASSIGN_OR_RETURN(images_,
                   backend_->Allocate(max_batch * sample * sizeof(float)));
  ASSIGN_OR_RETURN(labels_, backend_->Allocate(max_batch * sizeof(int32_t)));
  ASSIGN_OR_RETURN(stats_, backend_->Allocate(4 * sizeof(float)));
  ASSIGN_OR_RETURN(step_stats_, backend_->Allocate(2 * sizeof(float)));
  ASSIGN_OR_RETURN(stop_flag_, backend_->Allocate(sizeof(float)));
  bytes_ = req_.batches_as_bytes.value_or(backend_->on_gpu());
  if (bytes_) {
    ASSIGN_OR_RETURN(pixels_, backend_->Allocate(max_batch * sample));
  }
  const size_t image_bytes = max_batch * sample * sizeof(float);
  const size_t placement_bytes = max_batch * sizeof(SamplePlacement);
  for (Slot& slot : slots_) {
    ASSIGN_OR_RETURN(slot.images, backend_->Allocate(image_bytes));
    ASSIGN_OR_RETURN(slot.labels,
                     backend_->Allocate(max_batch * sizeof(int32_t)));
    if (bytes_) {
      ASSIGN_OR_RETURN(slot.pixels, backend_->Allocate(max_batch * sample));
      ASSIGN_OR_RETURN(slot.placements, backend_->Allocate(placement_bytes));
    }
    if (!backend_->on_gpu()) continue;
    if (bytes_) {
      ASSIGN_OR_RETURN(
          slot.host_pixels,
          HostMemory::Allocate(backend_.get(), max_batch * sample));
      ASSIGN_OR_RETURN(slot.host_placements,
                       HostMemory::Allocate(backend_.get(), placement_bytes));
    } else {
      ASSIGN_OR_RETURN(slot.host_images,
                       HostMemory::Allocate(backend_.get(), image_bytes));
    }
    ASSIGN_OR_RETURN(
        slot.host_labels,
        HostMemory::Allocate(backend_.get(), max_batch * sizeof(int32_t)));
  }
  ASSIGN_OR_RETURN(stats_ring_,
                   backend_->Allocate(2 * kStatsRing * sizeof(float)));
  fingerprint_ = Sha256Hex(req_.spec.network().SerializeAsString());
  return absl::OkStatus();
}

absl::Status Run::ResumeIfAsked() {
  if (!req_.resume) return absl::OkStatus();
  const std::string path = OutPath(kCheckpointFile);
  if (!checkpoint_) {
    Say(absl::StrCat("No checkpoint at ", path,
                     "; starting from the beginning."));
    return absl::OkStatus();
  }
  const Checkpoint c = *std::move(checkpoint_);
  checkpoint_.reset();
  if (c.network_fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        " was written for another network; train this one in another "
        "output folder, or start without --resume"));
  }
  if (c.solver != SolverName(opt_.solver) ||
      c.mini_batch_size != global_batch_ || c.seed != opt_.seed) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was written with solver ", c.solver, ", mini_batch_size ",
        c.mini_batch_size, " and seed ", c.seed, "; this run has ",
        SolverName(opt_.solver), ", ", global_batch_, " and ", opt_.seed,
        ". Resume with the same options, or start without --resume"));
  }
  if (static_cast<int64_t>(c.params.size()) != net_->num_params() ||
      static_cast<int64_t>(c.state.size()) != net_->state_size() ||
      static_cast<int64_t>(c.solver_state.size()) != solver_->state_size()) {
    return absl::DataLossError(absl::StrCat(
        path, ": its arrays do not fit this network; start without --resume"));
  }
  backend_->CopyToDevice(net_->params(), c.params.data(),
                         c.params.size() * sizeof(float));
  if (!c.state.empty()) {
    backend_->CopyToDevice(net_->state(), c.state.data(),
                           c.state.size() * sizeof(float));
  }
  solver_->LoadState(c.solver_state);
  skipped_steps_ = c.skipped_steps;
  if (scaler_) {
    // A checkpoint of a run without scaling starts the scale afresh.
    LossScaler::State state;
    if (c.loss_scale > 0) {
      state = {c.loss_scale, c.loss_scale_clean_steps, c.skipped_steps};
    } else {
      state = scaler_->state();
      state.skipped_steps = c.skipped_steps;
    }
    if (absl::Status s = scaler_->Restore(state); !s.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
    }
  }
  iteration_ = c.iteration;
  elapsed_offset_ = c.elapsed_s;
  best_validation_loss_ = c.best_validation_loss;
  without_improvement_ = c.validations_without_improvement;
  normalization_ = c.normalization;
  resumed_ = true;

  // The history up to the checkpoint continues; anything after it (written
  // by the run that stopped) is dropped, as that run's weights are.
  absl::StatusOr<std::string> csv = ReadFile(OutPath(kHistoryFile));
  if (csv.ok()) {
    absl::StatusOr<TrainingHistory> h = ParseHistoryCsv(*csv);
    if (h.ok()) history_ = std::move(h).value();
  }
  // A history with the scale's columns keeps them (the rows of a run
  // resumed without scaling say 0), so what was written stays.
  history_.loss_scaling = history_.loss_scaling || scaler_.has_value();
  std::erase_if(history_.iterations, [&](const IterationRecord& r) {
    return r.iteration > iteration_;
  });
  std::erase_if(history_.validations, [&](const ValidationRecord& r) {
    return r.iteration > iteration_;
  });
  const int64_t recorded =
      history_.iterations.empty() ? 0 : history_.iterations.back().iteration;
  if (recorded < iteration_) {
    Say(absl::StrCat(OutPath(kHistoryFile), " ends at iteration ", recorded,
                     ", before the checkpoint's ", iteration_,
                     "; the history continues with those rows missing."));
  }
  Say(absl::StrCat("Resuming from ", path, ": iteration ", iteration_, " of ",
                   total_, " (epoch ", iteration_ / per_epoch_ + 1, ")."));
  return absl::OkStatus();
}

BatchRequest Run::RequestFor(int64_t iteration) {
  const int64_t epoch = iteration / per_epoch_;
  if (epoch != order_epoch_) {
    order_ = EpochOrder(opt_.shuffle, opt_.seed, epoch, train_->count);
    order_epoch_ = epoch;
  }
  const int64_t first = (iteration % per_epoch_) * global_batch_;
  BatchRequest r;
  r.epoch = epoch;
  r.iteration = iteration;
  r.indices.assign(order_.begin() + first + lo_, order_.begin() + first + hi_);
  r.augment = true;
  return r;
}

absl::StatusOr<Evaluation> Run::Evaluate(const Dataset& data) {
  const int world = comm_.size();
  const int64_t begin = data.count * comm_.rank() / world;
  const int64_t end = data.count * (comm_.rank() + 1) / world;
  const int max_batch = net_->max_batch();
  BatchLoader::Options lo;
  lo.normalization = normalization_;
  lo.bytes = bytes_;
  double sums[2] = {0, 0};
  for (int64_t first = begin; first < end; first += max_batch) {
    BatchRequest r;
    const int64_t n = std::min<int64_t>(max_batch, end - first);
    for (int64_t i = 0; i < n; ++i) r.indices.push_back(first + i);
    Batch b = PrepareBatch(data, lo, r);
    if (lo.bytes) {
      backend_->CopyToDevice(pixels_.as<void>(), b.pixels.data(),
                             b.pixels.size());
      backend_->PrepareImages(b.n, data.shape, pixels_.as<uint8_t>(), nullptr,
                              scale_bias_.f32(), images_.f32());
    } else {
      backend_->CopyToDevice(images_.f32(), b.images.data(),
                             b.images.size() * sizeof(float));
    }
    backend_->CopyToDevice(labels_.as<int32_t>(), b.labels.data(),
                           b.labels.size() * sizeof(int32_t));
    net_->Forward(b.n, images_.f32(), /*training=*/false);
    backend_->Fill(stats_.f32(), 2, 0);
    net_->Loss(b.n, labels_.as<int32_t>(), stats_.f32());
    float host[2];
    backend_->CopyToHost(host, stats_.f32(), sizeof(host));
    sums[0] += host[0];
    sums[1] += host[1];
  }
  float totals[2] = {static_cast<float>(sums[0]), static_cast<float>(sums[1])};
  if (world > 1) {
    backend_->CopyToDevice(stats_.f32(), totals, sizeof(totals));
    RETURN_IF_ERROR(comm_.AllreduceSum(stats_.f32(), 2));
    backend_->CopyToHost(totals, stats_.f32(), sizeof(totals));
  }
  Evaluation e;
  e.loss = totals[0] / static_cast<double>(data.count);
  e.accuracy = 100.0 * totals[1] / static_cast<double>(data.count);
  return e;
}

// Batchnorm's running statistics are per rank (as DDP keeps them); where a
// checkpoint or the model is written, the ranks agree on their mean. They
// do not feed back into training, so this changes no training step.
absl::Status Run::AverageState() {
  if (comm_.size() == 1 || net_->state_size() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(comm_.AllreduceSum(net_->state(), net_->state_size()));
  backend_->Scale(net_->state_size(), 1.0f / comm_.size(), net_->state());
  return absl::OkStatus();
}

absl::Status Run::SaveCheckpoint() {
  RETURN_IF_ERROR(AverageState());
  if (!leader()) return absl::OkStatus();
  Checkpoint c;
  c.network_fingerprint = fingerprint_;
  c.solver = SolverName(opt_.solver);
  c.iteration = iteration_;
  c.epoch = iteration_ / per_epoch_ + 1;
  c.epoch_iteration = iteration_ % per_epoch_;
  c.mini_batch_size = global_batch_;
  c.seed = opt_.seed;
  c.elapsed_s = Elapsed();
  c.best_validation_loss = best_validation_loss_;
  c.validations_without_improvement = without_improvement_;
  c.normalization = normalization_;
  c.tuning = backend_->SaveTuning();
  c.skipped_steps = skipped_steps_;
  if (scaler_) {
    c.loss_scale = scaler_->state().scale;
    c.loss_scale_clean_steps = scaler_->state().clean_steps;
  }
  c.params.resize(net_->num_params());
  backend_->CopyToHost(c.params.data(), net_->params(),
                       c.params.size() * sizeof(float));
  c.state.resize(net_->state_size());
  if (!c.state.empty()) {
    backend_->CopyToHost(c.state.data(), net_->state(),
                         c.state.size() * sizeof(float));
  }
  c.solver_state = solver_->SaveState();
  // The history first: a run that stops between the two writes (killed, or
  // a write that fails) leaves a history reaching past the checkpoint,
  // whose extra rows ResumeIfAsked drops. The other order would leave a
  // checkpoint ahead of its history, and the rows between would be lost.
  RETURN_IF_ERROR(WriteFileAtomic(OutPath(kHistoryFile), HistoryCsv(history_)));
  RETURN_IF_ERROR(WriteCheckpoint(OutPath(kCheckpointFile), c));
  progress_.set_checkpoint_iteration(iteration_);
  Report();
  return absl::OkStatus();
}

int64_t Run::Epochs() const { return (total_ + per_epoch_ - 1) / per_epoch_; }

int64_t Run::EpochOf(int64_t iteration) const {
  return std::min<int64_t>((iteration - 1) / per_epoch_ + 1, Epochs());
}

void Run::Report() {
  if (!leader() || req_.progress == nullptr) return;
  progress_.set_time_ms(NowMs());
  req_.progress->Emit(progress_);
}

void Run::EmitProgress(double images_per_s, bool force) {
  if (!leader() || req_.progress == nullptr || !req_.progress->enabled())
    return;
  const double per_iteration =
      images_per_s > 0 ? global_batch_ / images_per_s : 0;
  progress_.set_iteration(iteration_);
  progress_.set_epoch(static_cast<int32_t>(EpochOf(iteration_)));
  progress_.set_loss(last_loss_);
  progress_.set_accuracy(last_accuracy_);
  progress_.set_learn_rate(last_lr_);
  progress_.set_images_per_s(images_per_s);
  progress_.set_elapsed_s(Elapsed());
  progress_.set_eta_s(per_iteration * static_cast<double>(total_ - iteration_));
  const auto now = Clock::now();
  if (!force && now - last_emit_ < std::chrono::milliseconds(500)) return;
  last_emit_ = now;
  Report();
}

absl::Status Run::WriteOutputs(const TrainResult& result) {
  ModelForExport m;
  m.name = req_.name;
  m.input = net_->input_shape();
  m.num_classes = net_->num_classes();
  m.layers = net_->layers();
  m.params_info = net_->params_info();
  m.state_info = net_->state_info();
  m.params.resize(net_->num_params());
  backend_->CopyToHost(m.params.data(), net_->params(),
                       m.params.size() * sizeof(float));
  m.state.resize(net_->state_size());
  if (!m.state.empty()) {
    backend_->CopyToHost(m.state.data(), net_->state(),
                         m.state.size() * sizeof(float));
  }
  m.normalization = normalization_;
  m.class_names = train_->class_names;
  ASSIGN_OR_RETURN(std::string onnx, ExportOnnx(m));
  RETURN_IF_ERROR(WriteFileAtomic(OutPath(kOnnxFile), onnx));
  RETURN_IF_ERROR(
      WriteFileAtomic(OutPath(kPlotFile), ProgressSvg(history_, req_.name)));
  const RunLayout layout =
      LayoutOf(req_, comm_.size(), backend_->on_gpu(), comm_.splits_batch());
  nlohmann::json j = {
      {"name", req_.name},
      {"iterations", result.iterations},
      {"epochs", result.epochs},
      // The ranks asked for (--ranks, a pool's slots): a rank whose
      // mini-batch is split over its process's threads is one rank of
      // several replicas; thread ranks of a pool are a rank each.
      {"ranks", layout.split_batch ? layout.processes() : comm_.size()},
      {"replicas", comm_.size()},
      {"processes", layout.processes()},
      {"replicas_per_process", layout.replicas_per_process},
      // Whether the replicas split one rank's mini-batch, batch norms
      // taking its statistics over them all (thread_ranks.h).
      {"split_batch", req_.communicator->splits_batch()},
      {"mini_batch_size", global_batch_},
      {"backend", backend_->Describe()},
      // How batches reached the backend: the data set's bytes, made into
      // images there (a GPU's default), or the host loader's floats.
      {"batches", bytes_ ? "bytes" : "floats"},
      {"wall_time_s", result.wall_time_s},
      {"train_time_s", result.train_time_s},
      {"images_per_s", result.images_per_s},
      {"build_time_s", result.build_time_s},
      {"backend_time_s", result.backend_time_s},
      {"train_loss", result.train_loss},
      {"train_accuracy", result.train_accuracy},
      {"stopped_early", result.stopped_early},
      {"resumed", result.resumed},
  };
  // The CPU threads of rank 0's process (every process's where the
  // machines' slots are alike).
  if (layout.threads_per_replica > 0) {
    j["threads_per_process"] = layout.threads_of(0);
  }
  if (result.first_step_s) j["first_step_s"] = *result.first_step_s;
  if (scaler_) {
    j["loss_scale"] = scaler_->scale();
    j["skipped_steps"] = skipped_steps_;
  }
  // Format folders: label i's name.
  if (!train_->class_names.empty()) j["class_names"] = train_->class_names;
  if (result.validation_loss) {
    j["validation_loss"] = *result.validation_loss;
    j["validation_accuracy"] = *result.validation_accuracy;
  }
  if (result.test_loss) {
    j["test_loss"] = *result.test_loss;
    j["test_accuracy"] = *result.test_accuracy;
  }
  // Names (the job's, the classes') need not be UTF-8: bytes that are not
  // become U+FFFD.
  return WriteFileAtomic(
      OutPath(kMetricsFile),
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

absl::Status Run::StartPipeline() {
  BatchLoader::Options lo;
  lo.augmentation = req_.spec.data().augmentation();
  lo.normalization = normalization_;
  lo.seed = opt_.seed;
  lo.bytes = bytes_;
  loader_depth_ = lo.depth;
  loader_ = BatchLoader::Start(train_, lo);
  pushed_ = iteration_;
  TopUp();
  scale_ = 1.0f / static_cast<float>(global_batch_);
  buckets_ = std::make_unique<GradientBuckets>(
      &comm_, net_->grads(), net_->num_params(),
      DefaultBucketFloats(backend_->on_gpu()));
  ring_.assign(2 * kStatsRing, 0.0f);
  // One rank only: several would record collectives and their host waits.
  record_ = req_.record_steps && backend_->can_record() && comm_.size() == 1;
  const auto& layers = req_.spec.network().layers();
  has_dropout_ =
      std::any_of(layers.begin(), layers.end(),
                  [](const v1::LayerSpec& l) { return l.type() == "dropout"; });
  current_ = 0;
  if (iteration_ < total_) {
    ASSIGN_OR_RETURN(Batch first, NextBatch());
    RETURN_IF_ERROR(Stage(first, slots_[current_]));
  }
  return absl::OkStatus();
}

void Run::TopUp() {
  while (pushed_ < total_ && pushed_ < iteration_ + loader_depth_ + 1) {
    loader_->Push(RequestFor(pushed_++));
  }
}

absl::StatusOr<Batch> Run::NextBatch() {
  std::optional<Batch> batch = loader_->Next();
  if (!batch) return absl::InternalError("the batch loader ended early");
  TopUp();
  return *std::move(batch);
}

// Copies a prepared batch towards a slot: on a GPU through the slot's
// page-locked memory, once the slot's previous upload has read it. That
// upload followed the compute stream, which with several ranks waits for
// their allreduces: there the wait is bounded like a collective's.
// The wait is the host's only one between progress reads, and it does
// not idle the device: in iteration k, staging batch k+1 waits for the
// upload of batch k-1 (staged in iteration k-2, after the compute of step
// k-3 was queued), while steps k-2 and k-1 are still queued. It keeps the
// host two or three steps ahead of the device, no further.
absl::Status Run::Stage(const Batch& b, Slot& slot) {
  slot.n = b.n;
  slot.placed = !b.placements.empty();
  struct Part {
    void* to;
    const void* from;
    size_t bytes;
    void* host;  // page-locked, on a GPU
  };
  Part parts[3];
  int count = 0;
  if (bytes_) {
    parts[count++] = {slot.pixels.as<void>(), b.pixels.data(), b.pixels.size(),
                      slot.host_pixels.get()};
    if (slot.placed) {
      parts[count++] = {slot.placements.as<void>(), b.placements.data(),
                        b.placements.size() * sizeof(SamplePlacement),
                        slot.host_placements.get()};
    }
  } else {
    parts[count++] = {slot.images.as<void>(), b.images.data(),
                      b.images.size() * sizeof(float), slot.host_images.get()};
  }
  parts[count++] = {slot.labels.as<void>(), b.labels.data(),
                    b.labels.size() * sizeof(int32_t), slot.host_labels.get()};
  if (!backend_->on_gpu()) {
    for (int i = 0; i < count; ++i) {
      backend_->CopyToDevice(parts[i].to, parts[i].from, parts[i].bytes);
    }
    return absl::OkStatus();
  }
  if (comm_.size() > 1) {
    const uint64_t token = slot.upload;
    RETURN_IF_ERROR(comm_.WaitOnDevice(
        [&] { return backend_->Uploaded(token); },
        "the step before last (its batch slot's upload waits for it)"));
  } else {
    backend_->WaitUploaded(slot.upload);
  }
  // The slot's uploads run in order: the last one's token covers all.
  for (int i = 0; i < count; ++i) {
    std::memcpy(parts[i].host, parts[i].from, parts[i].bytes);
    slot.upload = backend_->Upload(parts[i].to, parts[i].host, parts[i].bytes);
  }
  return absl::OkStatus();
}

absl::Status Run::Retire() {
  if (queued_.empty()) return absl::OkStatus();
  if (comm_.size() > 1 && backend_->on_gpu()) {
    // The host's wait for the steps' collectives, bounded by the
    // communicator's timeout (a Barrier queues after them): a dead peer
    // is an error here, not a hang in the read of the device below. On
    // the CPU, GradientBuckets::Finish has waited for them, bounded too.
    RETURN_IF_ERROR(comm_.Barrier());
  }
  backend_->CopyToHost(ring_.data(), stats_ring_.f32(),
                       ring_.size() * sizeof(float));
  for (const Queued& q : queued_) {
    const float* sums = &ring_[2 * ((q.iteration - 1) % kStatsRing)];
    last_loss_ = sums[0] / global_batch_;
    last_accuracy_ = 100.0 * sums[1] / global_batch_;
    last_lr_ = q.lr;
    if (!std::isfinite(last_loss_)) {
      // In fp16 the forward pass itself may overflow: loss scaling guards
      // the gradients only, and convolutions return fp16 outputs.
      return absl::OutOfRangeError(absl::StrCat(
          "the training loss became ", last_loss_, " at iteration ",
          q.iteration, " (epoch ", q.epoch,
          "); lower initial_learn_rate or set gradient_threshold",
          scaler_ ? "; in precision: fp16 a layer's output above 65504 also "
                    "overflows (loss scaling guards only the gradients): "
                    "try precision: bf16 or fp32"
                  : ""));
    }
    history_.iterations.push_back({q.iteration, q.epoch, q.elapsed, last_loss_,
                                   last_accuracy_, q.lr, q.loss_scale,
                                   q.skipped_steps});
  }
  queued_.clear();
  return absl::OkStatus();
}

// A training step's work on the device, from the slot's batch to the
// gradients (the solver's update follows outside: its learn rate changes
// from step to step, and with a gradient threshold it reads norms back).
// Several ranks: each layer's gradients start their allreduce (in
// buckets) while the layers before it compute.
// The step's loss sums start their allreduce as soon as they are known,
// ahead of the gradients' buckets (every rank in the same order), and
// are complete after the step's WaitAll (below, after the buckets').
absl::Status Run::Compute(const Slot& s) {
  net_->Forward(s.n, s.images.f32(), /*training=*/true);
  backend_->Fill(step_stats_.f32(), 2, 0);
  net_->Loss(s.n, s.labels.as<int32_t>(), step_stats_.f32());
  if (comm_.size() > 1) {
    RETURN_IF_ERROR(comm_.StartAllreduceSum(step_stats_.f32(), 2));
  }
  net_->Backward(s.n, s.labels.as<int32_t>(), BackwardScale(),
                 comm_.size() > 1 ? buckets_->ReadyFn() : nullptr);
  return net_->collective_status();
}

absl::StatusOr<std::unique_ptr<Recording>> Run::RecordStep(const Slot& s) {
  RETURN_IF_ERROR(backend_->StartRecording());
  const absl::Status computed = Compute(s);
  absl::StatusOr<std::unique_ptr<Recording>> r = backend_->FinishRecording();
  RETURN_IF_ERROR(computed);
  return r;
}

absl::Status Run::Step() {
  Slot& slot = slots_[current_];
  const int n = slot.n;
  backend_->UseUploads();  // this step's batch is on the device
  // The next batch travels while this step computes.
  if (iteration_ + 1 < total_) {
    ASSIGN_OR_RETURN(Batch next, NextBatch());
    RETURN_IF_ERROR(Stage(next, slots_[current_ ^ 1]));
  }
  if (queued_.size() == kStatsRing) RETURN_IF_ERROR(Retire());
  // Outside any recording: the key is what changes between replays. Only
  // dropout reads it; without dropout a GPU is spared a launch a step.
  if (has_dropout_) {
    backend_->SetDropoutKey(Key(opt_.seed, static_cast<uint64_t>(iteration_),
                                static_cast<uint64_t>(comm_.rank())));
  }
  if (bytes_) {
    // Outside any recording, like the key: the step reads the images.
    backend_->PrepareImages(
        n, train_->shape, slot.pixels.as<uint8_t>(),
        slot.placed ? slot.placements.as<SamplePlacement>() : nullptr,
        scale_bias_.f32(), slot.images.f32());
  }
  std::unique_ptr<Recording>& recorded = recorded_[current_];
  // An evaluation's new batch size may have grown a workspace.
  if (recorded != nullptr && recorded->stale()) recorded.reset();
  if (record_ && recorded == nullptr && steps_run_ > 0) {
    // Recorded once the kernels have run (and set themselves up) once.
    absl::StatusOr<std::unique_ptr<Recording>> r = RecordStep(slot);
    if (r.ok()) {
      if (!said_recorded_) {
        said_recorded_ = true;
        Say("Training steps are recorded once as a CUDA graph and "
            "replayed.");
      }
      recorded = *std::move(r);
      recorded_n_[current_] = n;
    } else {
      record_ = false;
      Say(absl::StrCat("Recording the training step as a CUDA graph failed (",
                       r.status().message(),
                       "); the steps run launch by launch instead."));
    }
  }
  if (recorded != nullptr && recorded_n_[current_] == n) {
    recorded->Replay();
  } else {
    RETURN_IF_ERROR(Compute(slot));
  }
  ++steps_run_;
  // On GPUs no host wait: the compute stream waits for the allreduces.
  // WaitAll after Finish: the loss sums' allreduce was started outside
  // the buckets, and a network without parameters starts no bucket.
  if (comm_.size() > 1) {
    RETURN_IF_ERROR(buckets_->Finish());
    RETURN_IF_ERROR(comm_.WaitAll());
  }
  backend_->CopyOnDevice(stats_ring_.f32() + 2 * (iteration_ % kStatsRing),
                         step_stats_.f32(), 2 * sizeof(float));
  step_epoch_ = iteration_ / per_epoch_ + 1;
  step_lr_ = LearnRate(opt_, iteration_, step_epoch_, total_);
  if (req_.inject_inf_at_iteration == iteration_ + 1 && net_->num_params()) {
    backend_->Fill(net_->grads(), 1, std::numeric_limits<float>::infinity());
  }
  const double loss_scale = scaler_ ? scaler_->scale() : 0;
  if (!scaler_ || UnscaleGradients()) {
    solver_->Step(step_lr_, iteration_ + 1 - skipped_steps_);
  }
  ++iteration_;
  current_ ^= 1;
  queued_.push_back({iteration_, step_epoch_, step_lr_, Elapsed(), loss_scale,
                     skipped_steps_});
  return absl::OkStatus();
}

bool Run::UnscaleGradients() {
  float* grads = net_->grads();
  const int64_t count = net_->num_params();
  const double used = scaler_->scale();
  // Every rank sums the same averaged gradients, so all decide alike.
  const bool finite =
      count == 0 || std::isfinite(backend_->SumSquares(count, grads));
  const bool apply = scaler_->Update(finite);
  skipped_steps_ = scaler_->skipped_steps();
  // A power of two: unscaling changes no bit that scaling did not.
  if (apply) backend_->Scale(count, static_cast<float>(1.0 / used), grads);
  if (scaler_->scale() != used) {
    for (std::unique_ptr<Recording>& r : recorded_) r.reset();
  }
  return apply;
}

void Run::ReportStart() {
  progress_.set_iteration(iteration_);
  progress_.set_iterations(total_);
  progress_.set_epoch(static_cast<int32_t>(EpochOf(iteration_)));
  progress_.set_epochs(static_cast<int32_t>(Epochs()));
  progress_.set_elapsed_s(Elapsed());
  Report();
}

void Run::ReportRow(int64_t epoch, double lr,
                    const std::optional<Evaluation>& validation) {
  if (!verbose()) return;
  ProgressRow r;
  r.epoch = epoch;
  r.iteration = iteration_;
  r.elapsed_s = Elapsed();
  r.loss = last_loss_;
  r.accuracy = last_accuracy_;
  if (validation) {
    r.validation_loss = validation->loss;
    r.validation_accuracy = validation->accuracy;
  }
  r.learn_rate = lr;
  table_.Row(r);
}

void Run::ReportValidation(const Evaluation& v) {
  progress_.set_iteration(iteration_);
  progress_.set_epoch(static_cast<int32_t>(EpochOf(iteration_)));
  progress_.set_has_validation(true);
  progress_.set_validation_loss(v.loss);
  progress_.set_validation_accuracy(v.accuracy);
  Report();
}

void Run::ReportDone(const TrainResult& result) {
  progress_.set_done(true);
  progress_.set_iteration(iteration_);
  progress_.set_epoch(static_cast<int32_t>(EpochOf(iteration_)));
  progress_.set_images_per_s(result.images_per_s);
  progress_.set_eta_s(0);
  if (result.validation_accuracy) {
    progress_.set_has_validation(true);
    progress_.set_validation_loss(*result.validation_loss);
    progress_.set_validation_accuracy(*result.validation_accuracy);
  }
  Report();
}

absl::StatusOr<TrainResult> Run::Execute() {
  opt_ = ResolveOptions(req_.spec.options());
  if (req_.max_epochs) opt_.max_epochs = *req_.max_epochs;
  if (req_.max_iterations) opt_.max_iterations = *req_.max_iterations;
  if (req_.mini_batch_size) opt_.mini_batch_size = *req_.mini_batch_size;
  if (leader()) RETURN_IF_ERROR(MakeDirs(req_.output_dir));
  RETURN_IF_ERROR(LoadData());
  const auto build_start = Clock::now();
  RETURN_IF_ERROR(Build());
  const double build_time = SecondsSince(build_start);
  RETURN_IF_ERROR(ResumeIfAsked());
  // The first place where the ranks can agree on a stop asked while they
  // connected, read the data or built the network: every rank is here,
  // with its communicator and backend. A stop asked later stops after a
  // step.
  if (iteration_ < total_) {
    ASSIGN_OR_RETURN(const bool stop, AgreeToStop());
    if (stop) {
      TrainResult result;
      result.resumed = resumed_;
      result.build_time_s = build_time;
      return StopOnRequest(result);
    }
  }
  if (bytes_) {
    // Final now (a resumed run's is its checkpoint's).
    const std::vector<float> scale_bias =
        ScaleAndBias(normalization_, train_->shape.c);
    const size_t bytes = scale_bias.size() * sizeof(float);
    ASSIGN_OR_RETURN(scale_bias_, backend_->Allocate(bytes));
    backend_->CopyToDevice(scale_bias_.f32(), scale_bias.data(), bytes);
  }

  Say(absl::StrFormat(
      "Training on %s: %s; %d training images%s, %d "
      "iterations per epoch, %d iterations.",
      DeviceWithoutThreads(*backend_),
      DescribeLayout(LayoutOf(req_, comm_.size(), backend_->on_gpu(),
                              comm_.splits_batch()),
                     global_batch_),
      train_->count,
      validation_ ? absl::StrCat(", ", validation_->count, " for validation")
                  : "",
      per_epoch_, total_));

  table_ = ProgressTable(req_.diary);
  if (verbose()) table_.Header();
  ReportStart();
  RETURN_IF_ERROR(StartPipeline());

  TrainResult result;
  result.resumed = resumed_;
  double train_time = 0;
  int64_t images = 0;
  std::optional<Evaluation> last_validation;
  while (iteration_ < total_) {
    const auto step_start = Clock::now();
    RETURN_IF_ERROR(Step());
    images += global_batch_;
    const int64_t epoch = step_epoch_;
    const double lr = step_lr_;

    // What this iteration does besides the step, each of which needs the
    // step's numbers (and so waits for the device).
    const bool last = iteration_ == total_;
    const bool validate =
        validation_ && (iteration_ % opt_.validation_frequency == 0 || last);
    const bool row =
        iteration_ == 1 || iteration_ % opt_.verbose_frequency == 0;
    const bool epoch_end = iteration_ % per_epoch_ == 0;
    const int64_t freq = opt_.checkpoint_frequency;
    const bool checkpoint =
        freq > 0 && (opt_.checkpoint_per_iteration
                         ? iteration_ % freq == 0
                         : epoch_end && (iteration_ / per_epoch_) % freq == 0);
    // Every rank reads at the same iterations, so that all of them find a
    // loss that is not finite at the same one and say so. On a GPU reading
    // waits for the device: every kReadEvery steps there, which keeps the
    // progress report current; on the CPU it costs nothing.
    const bool read = queued_.size() >=
                      static_cast<size_t>(backend_->on_gpu() ? kReadEvery : 1);
    // This process's first step is waited for, once, and its time kept:
    // what it costs beyond a steady step (lazy set-up in the libraries) is
    // then known apart from the steady steps' rate.
    const bool first = steps_run_ == 1;
    // One rank alone reads its stop request at every step, for free;
    // ranks agree on theirs where they read (below).
    const bool asked_alone = comm_.size() == 1 && StopAsked();
    if (!(last || validate || row || checkpoint || read || first ||
          asked_alone)) {
      train_time += SecondsSince(step_start);
      continue;
    }
    RETURN_IF_ERROR(Retire());
    train_time += SecondsSince(step_start);
    if (first) result.first_step_s = train_time;

    std::optional<Evaluation> validation;
    if (validate) {
      ASSIGN_OR_RETURN(Evaluation v, Evaluate(*validation_));
      validation = v;
      last_validation = v;
      history_.validations.push_back(
          {iteration_, epoch, Elapsed(), v.loss, v.accuracy});
      ReportValidation(v);
      if (v.loss < best_validation_loss_) {
        best_validation_loss_ = v.loss;
        without_improvement_ = 0;
      } else {
        ++without_improvement_;
      }
    }
    const bool stop_early = opt_.validation_patience > 0 &&
                            without_improvement_ >= opt_.validation_patience;
    const double images_per_s = train_time > 0 ? images / train_time : 0;
    if (row || validation.has_value() || last || stop_early) {
      ReportRow(epoch, lr, validation);
    }
    EmitProgress(images_per_s, validation.has_value() || last);

    if (checkpoint && !last && !stop_early) RETURN_IF_ERROR(SaveCheckpoint());
    if (stop_early) {
      result.stopped_early = true;
      Say(absl::StrCat("Validation loss did not improve for ",
                       opt_.validation_patience,
                       " validations in a row; stopping early at iteration ",
                       iteration_, "."));
      break;
    }
    // Every rank reaches this point at the same iterations (those above
    // are the same on every rank), after the iteration's validation and
    // checkpoint: a stop leaves nothing of the iteration undone, so the
    // resumed run goes on as this one would have. At the last step the
    // run ends anyway, with its outputs.
    if (!last) {
      ASSIGN_OR_RETURN(const bool stop, AgreeToStop());
      if (stop) {
        if (!checkpoint) RETURN_IF_ERROR(SaveCheckpoint());
        result.stopped_on_request = true;
        break;
      }
    }
  }
  loader_->Close();
  if (verbose()) table_.Footer();
  if (result.stopped_on_request) {
    result.train_time_s = train_time;
    result.images_per_s = train_time > 0 ? images / train_time : 0;
    result.build_time_s = build_time;
    result.train_loss = last_loss_;
    result.train_accuracy = last_accuracy_;
    return StopOnRequest(result);
  }

  result.iterations = iteration_;
  result.epochs = static_cast<double>(iteration_) / per_epoch_;
  result.train_time_s = train_time;
  result.images_per_s = train_time > 0 ? images / train_time : 0;
  result.build_time_s = build_time;
  result.backend_time_s = backend_time_;
  result.train_loss = last_loss_;
  result.train_accuracy = last_accuracy_;
  if (validation_) {
    if (!last_validation) {
      ASSIGN_OR_RETURN(Evaluation v, Evaluate(*validation_));
      last_validation = v;
    }
    result.validation_loss = last_validation->loss;
    result.validation_accuracy = last_validation->accuracy;
  }
  RETURN_IF_ERROR(AverageState());
  if (test_) {
    ASSIGN_OR_RETURN(Evaluation t, Evaluate(*test_));
    result.test_loss = t.loss;
    result.test_accuracy = t.accuracy;
  }
  RETURN_IF_ERROR(SaveCheckpoint());
  result.wall_time_s = SecondsSince(start_);
  if (leader()) {
    RETURN_IF_ERROR(WriteOutputs(result));
    std::string summary = absl::StrFormat(
        "Training finished: %d iterations in %s, %.0f images/s.",
        result.iterations, FormatElapsed(Elapsed()), result.images_per_s);
    if (result.validation_accuracy) {
      absl::StrAppend(&summary,
                      absl::StrFormat(" Validation accuracy %.2f%%, loss %.4f.",
                                      *result.validation_accuracy,
                                      *result.validation_loss));
    }
    if (result.test_accuracy) {
      absl::StrAppend(&summary, absl::StrFormat(" Test accuracy %.2f%%.",
                                                *result.test_accuracy));
    }
    Say(summary);
    ReportDone(result);
  }
  // Gloo closes its connections when the communicator goes: no rank may
  // leave while another is still in a collective.
  RETURN_IF_ERROR(comm_.Barrier());
  return result;
}

absl::StatusOr<TrainResult> Run::StopOnRequest(TrainResult result) {
  result.stopped_on_request = true;
  result.iterations = iteration_;
  result.epochs = static_cast<double>(iteration_) / per_epoch_;
  result.backend_time_s = backend_time_;
  result.wall_time_s = SecondsSince(start_);
  if (steps_run_ > 0) {
    Say(absl::StrCat("Stopping at iteration ", iteration_,
                     " on request (preempted): checkpoint written; a "
                     "resumed run continues from it."));
  } else {
    Say(absl::StrCat(
        "Stopping before the first step on request (preempted): no step "
        "ran and no checkpoint was written; a resumed run ",
        resumed_ ? absl::StrCat("continues from iteration ", iteration_,
                                ", as this one would have.")
                 : std::string("starts from the beginning.")));
  }
  // As at a normal end: no rank leaves while another is in a collective.
  RETURN_IF_ERROR(comm_.Barrier());
  return result;
}

}  // namespace

absl::StatusOr<TrainingData> LoadTrainingData(
    const TrainRequest& request,
    const std::function<void(const std::string&)>& say) {
  const v1::DataSpec& d = request.spec.data();
  LoadOptions lo;
  const auto& input = request.spec.network().input();
  if (input.size() == 3) lo.input = Shape{input[0], input[1], input[2]};
  lo.threads = request.threads > 0
                   ? request.threads
                   : static_cast<int>(std::thread::hardware_concurrency());
  lo.cache_dir = request.tuning_cache;
  lo.say = say;
  TrainingData data;
  ASSIGN_OR_RETURN(data.train, LoadDataset(d.train(), request.base_dir, lo));
  // Folders of validation and test images label by the training classes.
  lo.class_names = data.train.class_names;
  if (d.has_validation()) {
    ASSIGN_OR_RETURN(Dataset v,
                     LoadDataset(d.validation(), request.base_dir, lo));
    data.validation = std::move(v);
  } else if (d.validation_split() > 0) {
    auto [kept, held_out] =
        SplitEachLabel(data.train, d.validation_split(),
                       ResolveOptions(request.spec.options()).seed);
    if (say) {
      say(absl::StrFormat(
          "Validating on %d of the %d training images (validation_split %g, "
          "per class, from the seed).",
          held_out.count, data.train.count, d.validation_split()));
    }
    data.train = std::move(kept);
    data.validation = std::move(held_out);
  }
  if (d.has_test()) {
    ASSIGN_OR_RETURN(Dataset t, LoadDataset(d.test(), request.base_dir, lo));
    data.test = std::move(t);
  }
  if (d.normalize()) data.normalization = ComputeNormalization(data.train);
  return data;
}

absl::StatusOr<TrainResult> Train(const TrainRequest& request) {
  if (request.communicator == nullptr) {
    return absl::InvalidArgumentError("Train needs a communicator");
  }
  if (request.output_dir.empty()) {
    return absl::InvalidArgumentError("Train needs an output folder");
  }
  Run run(request);
  return run.Execute();
}

}  // namespace dlbatch::trainer
