// What a training run tells the people and programs watching it: the
// verbose progress table in the diary (MATLAB's trainNetwork layout), and
// structured progress as JSON lines on a channel the worker reads.
#ifndef DLBATCH_TRAINER_OUTPUT_PROGRESS_H_
#define DLBATCH_TRAINER_OUTPUT_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

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

// JSON lines, one object each, flushed as written. Every line has "event"
// ("start", "progress", "validation", "checkpoint", "done") and
// "time_ms"; progress lines carry iteration, epoch, iterations, epochs,
// loss, accuracy, learn_rate, images_per_s, elapsed_s and eta_s.
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
  // Writes one line; `json_object` is a serialized JSON object. Write
  // errors (the reader went away) disable the channel, never the run.
  void Emit(const std::string& json_object);

 private:
  int fd_ = -1;
  bool owned_ = false;
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_OUTPUT_PROGRESS_H_
