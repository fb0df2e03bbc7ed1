// Training options with MATLAB's trainingOptions defaults filled in, and
// the learning-rate schedule. Pure functions: no I/O, no clock.
#ifndef DLBATCH_TRAINER_OPTIONS_H_
#define DLBATCH_TRAINER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "dlbatch/v1/job.pb.h"

namespace dlbatch::trainer {

enum class SolverKind { kSgdm, kAdam, kRmsprop };

struct Options {
  SolverKind solver = SolverKind::kSgdm;
  double initial_learn_rate = 0.01;  // adam, rmsprop: 0.001
  double momentum = 0.9;
  double l2_regularization = 1e-4;
  double gradient_threshold = 0;  // 0: no clipping
  double beta1 = 0.9;             // gradient_decay_factor
  double beta2 = 0.999;           // squared_gradient_decay_factor; rmsprop 0.9
  double epsilon = 1e-8;
  bool nesterov = false;           // sgdm: Nesterov's momentum
  double label_smoothing = 0;      // the loss's target: (1 - s) onehot + s / k
  v1::LearnRateSchedule schedule;  // type resolved ("none" if empty)
  int mini_batch_size = 128;
  int64_t max_epochs = 30;
  int64_t max_iterations = 0;  // 0: max_epochs decides
  std::string shuffle = "once";
  int64_t validation_frequency = 50;
  int64_t validation_patience = 0;  // 0: never stop early
  int64_t verbose_frequency = 50;
  int64_t checkpoint_frequency = 1;       // 0: none
  bool checkpoint_per_iteration = false;  // else per epoch
  uint64_t seed = 0;
  std::string execution_environment = "auto";
};

Options ResolveOptions(const v1::TrainingOptions& spec);

// The learning rate for 0-based `iteration`, in 1-based `epoch`, of a run of
// `total_iterations`:
//   none       lr0
//   piecewise  lr0 * drop_factor ^ floor((epoch - 1) / drop_period)
//              (MATLAB; defaults 0.1 and 10 epochs)
//   inv        lr0 * (1 + gamma * iteration) ^ -power        (Caffe)
//   step       lr0 * gamma ^ floor(iteration / step_size)   (Caffe; gamma
//              defaults to 0.1)
//   cosine     lr0 * (1 + cos(pi * t)) / 2, t = progress after warm-up
// With warmup_iterations W, iterations below W use the scheduled rate
// times (iteration + 1) / W.
double LearnRate(const Options& options, int64_t iteration, int64_t epoch,
                 int64_t total_iterations);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_OPTIONS_H_
