// What a training run tells the people and programs watching it: the
// verbose progress table in the diary (MATLAB's trainNetwork layout), and
// structured progress (v1.TrainProgress as JSON lines) on a channel the
// worker reads.
#ifndef DLBATCH_TRAINER_OUTPUT_PROGRESS_H_
#define DLBATCH_TRAINER_OUTPUT_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch::trainer {

struct ProgressRow {
  int64_t epoch = 0;
  int64_t iteration = 0;
  double elapsed_s = 0;
  double loss = 0;
  double accuracy = 0;  // percent
  std::optional<double> validation_loss;
  std::optional<double> validation_accuracy;
  double learn_rate = 0;
};

// Writes the table to `out` (not owned): the header once, then one row per
// call, and the closing rule.
class ProgressTable {
 public:
  explicit ProgressTable(std::FILE* out) : out_(out) {}
  void Header();
  void Row(const ProgressRow& row);
  void Footer();

 private:
  std::FILE* out_;
};

// "00:01:23".
std::string FormatElapsed(double seconds);

// The channel's line for `progress`: protobuf's JSON form of
// v1.TrainProgress (proto/dlbatch/v1/job.proto) on one line, field names as
// in the proto, every field written (64-bit numbers as strings, as in every
// JSON form of a proto). The worker reads it back into the same message.
std::string ProgressLine(const v1::TrainProgress& progress);

// Structured progress for the worker: one line per event, flushed as
// written, each the run's whole v1.TrainProgress after the event (start, a
// reported step, a validation, a checkpoint, the end), so a reader needs
// only the last line. checkpoint_iteration is the iteration of the last
// checkpoint this run wrote (0: none yet); a line that changes it
// announces a new checkpoint. done is set on the last line, once the
// outputs are written.
class ProgressChannel {
 public:
  // `target`: "" (none), "fd:N" (an open descriptor, not closed here) or a
  // file path (created or appended to).
  static absl::StatusOr<ProgressChannel> Open(const std::string& target);
  ProgressChannel() = default;
  ProgressChannel(ProgressChannel&& other) noexcept;
  ProgressChannel& operator=(ProgressChannel&& other) noexcept;
  ~ProgressChannel();

  bool enabled() const { return fd_ >= 0; }
  // Writes ProgressLine(progress) and a newline. Write errors (the reader
  // went away) disable the channel, never the run.
  void Emit(const v1::TrainProgress& progress);

 private:
  void Write(const std::string& line);

  int fd_ = -1;
  bool owned_ = false;
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_OUTPUT_PROGRESS_H_
