// Progress from any program: what a command job writes to $DLBATCH_PROGRESS
// (a FIFO in its folder, also its descriptor 3), read into the same
// v1.TrainProgress a train job's trainer reports, so that `jobs`, `show`,
// the monitor, --json and the metrics show both alike, and into the
// training history the job's outputs get (training_history.csv and the
// progress plot, as a train job's).
//
// A line is one JSON object of numbers:
//   {"iteration": 120, "iterations": 1000, "epoch": 2, "loss": 0.41,
//    "accuracy": 87.5, "learn_rate": 0.01, "my_metric": 3.2}
// Known keys (kProgressKeys; "step" is another name for "iteration") set
// the progress field of that name; any other key with a number is one of
// the job's own metrics (v1.TrainProgress.metrics); {"checkpoint": STEP}
// says the job has written its checkpoint for STEP. A key a line leaves out
// keeps its earlier value. A bad line (not a JSON object, a known key that
// is not a number, a line longer than the worker's line cap) changes
// nothing and is counted: the channel is the job's, and nothing on it may
// stall the job or the worker.
//
// Pure: no I/O, time as an argument.
#ifndef DLBATCH_WORKER_COMMAND_PROGRESS_H_
#define DLBATCH_WORKER_COMMAND_PROGRESS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dlbatch/v1/job.pb.h"
#include "trainer/output/history.h"

namespace dlbatch::worker {

// The environment variable naming the channel.
inline constexpr char kProgressEnv[] = "DLBATCH_PROGRESS";
// The channel's FIFO, in the job's folder.
inline constexpr char kProgressFifo[] = ".dlbatch-progress";
// The most metrics of its own a job may report; later names are ignored.
inline constexpr int kMaxJobMetrics = 64;
// The most history rows kept in memory: past it every other row is
// dropped and then only every 2nd (4th, ...) row kept, so a job reporting
// every step for days still gets a plot of its whole run.
inline constexpr size_t kMaxHistoryRows = 100000;

class CommandProgress {
 public:
  struct Result {
    // kPiece: a later piece of a line already counted bad (nothing to say).
    enum Kind { kBad, kPiece, kProgress, kCheckpoint } kind = kBad;
    std::string problem;    // kBad: what is wrong, for the diary
    int64_t step = 0;       // kCheckpoint: the step it holds
    bool progress = false;  // kCheckpoint too: progress changed as well
  };

  // `start_ms`: when the job's process started (elapsed_s counts from it).
  explicit CommandProgress(int64_t start_ms) : start_ms_(start_ms) {}

  // One line of the channel, `complete` false for a piece of a longer line
  // (the worker's cap; the rest follows as further pieces).
  Result Read(std::string_view line, bool complete, int64_t now_ms);

  const v1::TrainProgress& progress() const { return progress_; }
  const trainer::TrainingHistory& history() const { return history_; }
  int64_t lines() const { return lines_; }
  int64_t bad_lines() const { return bad_; }
  // Metrics named past kMaxJobMetrics, ignored.
  int64_t metrics_dropped() const { return metrics_dropped_; }

 private:
  void Record(bool has_loss, bool has_validation, double now_s);
  void Thin();

  const int64_t start_ms_;
  v1::TrainProgress progress_;
  trainer::TrainingHistory history_;
  int64_t lines_ = 0;
  int64_t bad_ = 0;
  int64_t metrics_dropped_ = 0;
  bool in_long_line_ = false;  // later pieces of a line already counted bad
  size_t keep_every_ = 1;      // history thinning: keep 1 row in this many
  size_t rows_seen_ = 0;
};

// The files a command job's outputs get from its reported history (none
// when it reported no loss and no validation): training_history.csv and
// training_progress.svg, as a train job's.
struct HistoryFile {
  std::string name;
  std::string content;
};
std::vector<HistoryFile> HistoryFiles(const trainer::TrainingHistory& history,
                                      const std::string& title);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_COMMAND_PROGRESS_H_
