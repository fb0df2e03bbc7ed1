// Human output of the CLI: aligned tables, times, and a progress bar for
// long transfers.
#ifndef DLBATCH_CLIENT_FORMAT_H_
#define DLBATCH_CLIENT_FORMAT_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dlbatch/v1/job.pb.h"
#include "google/protobuf/message.h"

namespace dlbatch::client {

// A table for a terminal. Each cell is untrusted text: it is shown as
// TerminalText (terminal_text.h), and columns are aligned by display
// width (a wide character takes two cells).
class Table {
 public:
  explicit Table(std::vector<std::string> header) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell; the last column is not padded.
  std::string Render() const;
  size_t rows() const { return rows_.size() - 1; }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "2026-11-22 14:03:07" in local time; "-" for 0.
std::string LocalTime(int64_t ms);

// A train job's progress in the jobs table: "45% 420/937 loss 0.521";
// "" for jobs that report none.
std::string ProgressCell(const v1::Job& job);
// One preemption the job suffered, as `show` says it: "preempted by job 7
// (priority 10) at 2026-12-02 14:02:11; resumed from iteration 1400", or,
// while it stops, "... since 14:02:11; stopping (killed at ... if still
// running)". Plain text (nothing in it comes from a user).
std::string PreemptionText(const v1::Preemption& p, bool train);
// The NOTE of `jobs` and the monitor: why a queued job waits (and, queued
// again by a preemption, by whom), why a job failed or was cancelled, or
// that a running one is stopping for a preemption. Raw: the caller escapes
// it for the terminal.
std::string JobNote(const v1::Job& job);
// `dlbatch show`'s progress section, one "  Label:  value" line each.
std::string ProgressLines(const v1::TrainProgress& progress);

// A one-line bar on stderr, redrawn at most 10 times a second; silent when
// stderr is not a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void Update(int64_t done, int64_t total);
  void Done();

 private:
  void Draw(bool final);
  std::string label_;
  bool tty_;
  int64_t done_ = 0, total_ = 0;
  int64_t last_draw_ms_ = 0;
  int64_t start_ms_;
  bool finished_ = false;
};

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_FORMAT_H_
