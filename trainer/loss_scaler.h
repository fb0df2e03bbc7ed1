// Dynamic loss scaling for fp16 training (precision: fp16, on GPUs): the
// loss is multiplied by scale() before the backward pass, so that small
// gradients do not flush to zero in fp16, and the gradients are divided by
// it before the solver's update. A step whose gradients hold an inf or a NaN
// (the scale overflowed fp16's range) is skipped and the scale halved;
// after `growth_interval` clean steps in a row it doubles, so that it stays
// near the largest that does not overflow (Micikevicius et al. 2018, as
// PyTorch's GradScaler and MATLAB's dlnetwork training do).
//
// Pure: no device, no clock. The training loop reports each step's
// finiteness (one SumSquares of the gradients, non-finite where any is)
// and follows the answer. Thread-compatible.
#ifndef DLBATCH_TRAINER_LOSS_SCALER_H_
#define DLBATCH_TRAINER_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace dlbatch::trainer {

class LossScaler {
 public:
  struct Options {
    double initial_scale = 65536;    // 2^16
    double backoff_factor = 0.5;     // on an inf/NaN gradient
    double growth_factor = 2;        // after growth_interval clean steps
    int64_t growth_interval = 2000;  // clean steps in a row
    double min_scale = 1;            // never below (a NaN loss stays NaN)
    double max_scale = 16777216;     // 2^24: never above
  };
  // What a checkpoint keeps, so that a resumed run continues the scale.
  struct State {
    double scale = 0;
    int64_t clean_steps = 0;    // in a row, since the last change
    int64_t skipped_steps = 0;  // over the run
  };

  LossScaler() : LossScaler(Options()) {}
  explicit LossScaler(const Options& options);
  // InvalidArgument, naming the field, where options cannot work (a factor
  // that does not shrink or grow, a non-positive interval or scale).
  static absl::StatusOr<LossScaler> Make(const Options& options);

  // The factor the loss (and so every gradient) is multiplied by.
  double scale() const { return state_.scale; }
  // 1 / scale(): what the gradients are multiplied by before the update.
  double inverse_scale() const { return 1.0 / state_.scale; }
  int64_t skipped_steps() const { return state_.skipped_steps; }

  // After a step's backward pass: `finite` is whether every gradient is
  // finite. Returns whether to apply the step (unscaled by the scale it was
  // computed with, read before this call); the scale for the next step is
  // then scale().
  bool Update(bool finite);

  const State& state() const { return state_; }
  // A checkpoint's state; a scale outside [min_scale, max_scale] or not
  // finite is InvalidArgument and changes nothing.
  absl::Status Restore(const State& state);

 private:
  Options options_;
  State state_;
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_LOSS_SCALER_H_
