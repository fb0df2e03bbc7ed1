// The training history a run leaves behind: per-iteration and
// per-validation records, written as training_history.csv and drawn as
// training_progress.svg (MATLAB's training-progress plot: loss and
// accuracy over iterations, training and validation).
#ifndef DLBATCH_TRAINER_OUTPUT_HISTORY_H_
#define DLBATCH_TRAINER_OUTPUT_HISTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlbatch::trainer {

struct IterationRecord {
  int64_t iteration = 0;  // 1-based
  int64_t epoch = 0;      // 1-based
  double time_s = 0;      // since training started
  double loss = 0;        // mini-batch mean cross-entropy
  double accuracy = 0;    // mini-batch, percent
  double learn_rate = 0;
  // With dynamic loss scaling (TrainingHistory::loss_scaling): the scale
  // this step's gradients were computed with, and the steps skipped for an
  // inf or NaN gradient up to and including this one.
  double loss_scale = 0;
  int64_t skipped_steps = 0;
};

struct ValidationRecord {
  int64_t iteration = 0;
  int64_t epoch = 0;
  double time_s = 0;
  double loss = 0;
  double accuracy = 0;  // percent
};

struct TrainingHistory {
  // Whether the run scaled its loss (precision: fp16): the rows then carry
  // loss_scale and skipped_steps.
  bool loss_scaling = false;
  std::vector<IterationRecord> iterations;
  std::vector<ValidationRecord> validations;
};

// One row per iteration and one per validation, ordered by iteration
// (a validation after the iteration it follows):
//   kind,iteration,epoch,time_s,loss,accuracy,learn_rate
// with kind "train" or "validation" (learn_rate empty on validation rows);
// with loss_scaling two more columns, loss_scale,skipped_steps (empty on
// validation rows).
std::string HistoryCsv(const TrainingHistory& history);
// Parses what HistoryCsv wrote, either form (a resumed run continues its
// history; loss_scaling says which form it was).
absl::StatusOr<TrainingHistory> ParseHistoryCsv(const std::string& csv);

// A standalone SVG: two panels (accuracy above, loss below) over
// iterations; training as a thin line (smoothed, as MATLAB draws it, with
// the raw points faint), validation as dots joined by a dashed line;
// axes with ticks and labels, a legend, and `title`.
std::string ProgressSvg(const TrainingHistory& history,
                        const std::string& title);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_OUTPUT_HISTORY_H_
