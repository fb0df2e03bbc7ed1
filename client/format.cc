#include "client/format.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/terminal_text.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/files.h"
#include "proto/job_state.h"

namespace dlbatch::client {

std::string Table::Render() const {
  // Every cell as it is shown, and its width.
  std::vector<std::vector<std::string>> shown;
  std::vector<std::vector<int>> cells;
  std::vector<int> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    auto& text = shown.emplace_back();
    auto& cell = cells.emplace_back();
    for (size_t i = 0; i < row.size(); ++i) {
      text.push_back(TerminalText(row[i]));
      cell.push_back(DisplayWidth(text.back()));
      width[i] = std::max(width[i], cell.back());
    }
  }
  std::string out;
  for (size_t r = 0; r < shown.size(); ++r) {
    for (size_t i = 0; i < shown[r].size(); ++i) {
      out.append(shown[r][i]);
      if (i + 1 < shown[r].size())
        out.append(static_cast<size_t>(width[i] - cells[r][i] + 2), ' ');
    }
    out.push_back('\n');
  }
  return out;
}

std::string LocalTime(int64_t ms) {
  if (ms <= 0) return "-";
  time_t t = static_cast<time_t>(ms / 1000);
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// Who preempted, briefly (the NOTE): a job of dlbatch's, or Slurm itself.
static std::string PreemptedBy(const v1::Preemption& p) {
  return p.kind() == kPreemptedBySlurm
             ? PreemptedByText(p)
             : absl::StrCat("preempted by job ", p.by_job());
}

std::string PreemptionText(const v1::Preemption& p, bool train) {
  const std::string by = PreemptedByText(p);
  if (!p.done()) {
    return absl::StrCat(by, " at ", LocalTime(p.time_ms()), "; attempt ",
                        p.attempt(), " is stopping",
                        train ? " at a checkpoint" : "", " (killed at ",
                        LocalTime(p.deadline_ms()), " if still running)");
  }
  std::string out = absl::StrCat(by, " at ", LocalTime(p.time_ms()),
                                 " (attempt ", p.attempt(), ")");
  if (train) {
    absl::StrAppend(&out, p.resume_iteration() > 0
                              ? absl::StrCat("; resumes from iteration ",
                                             p.resume_iteration())
                              : std::string("; starts afresh (no checkpoint)"));
  }
  if (p.lost_ms() > 0) {
    absl::StrAppend(&out, "; ", FormatDurationMs(p.lost_ms()), " of work lost");
  }
  return out;
}

std::string JobNote(const v1::Job& job) {
  const v1::Preemption* last =
      job.preemptions_size() > 0 ? &job.preemptions(job.preemptions_size() - 1)
                                 : nullptr;
  const bool train = job.spec().has_train();
  if (job.state() == v1::JOB_STATE_QUEUED) {
    std::string note = job.wait_reason();
    // Queued again by it, and not started since.
    if (last != nullptr && last->done() && last->attempt() == job.attempt()) {
      absl::StrAppend(&note, note.empty() ? "" : "; ", PreemptedBy(*last));
      if (train && last->resume_iteration() > 0)
        absl::StrAppend(&note, ", resumes from iteration ",
                        last->resume_iteration());
    }
    if (!note.empty()) return note;
  }
  if (job.state() == v1::JOB_STATE_RUNNING && last != nullptr &&
      !last->done() && last->attempt() == job.attempt()) {
    return absl::StrCat(PreemptedBy(*last), ": stopping",
                        train ? " at a checkpoint" : "");
  }
  return job.reason();
}

std::string ProgressCell(const v1::Job& job) {
  const v1::TrainProgress& p = job.progress();
  // A command job may report steps without saying how many in all.
  if (p.iterations() <= 0) {
    if (p.iteration() <= 0) return "";
    return absl::StrFormat("step %d loss %.3f", p.iteration(), p.loss());
  }
  const int percent = static_cast<int>(100 * p.iteration() / p.iterations());
  std::string cell =
      absl::StrFormat("%d%% %d/%d", percent, p.iteration(), p.iterations());
  if (p.iteration() > 0) absl::StrAppendFormat(&cell, " loss %.3f", p.loss());
  if (p.has_validation())
    absl::StrAppendFormat(&cell, " val %.1f%%", p.validation_accuracy());
  return cell;
}

std::string ProgressLines(const v1::TrainProgress& p) {
  std::string out;
  if (p.iterations() > 0) {
    out = absl::StrFormat(
        "  Progress:   iteration %d of %d (%d%%), epoch %d of %d%s\n",
        p.iteration(), p.iterations(), 100 * p.iteration() / p.iterations(),
        p.epoch(), p.epochs(), p.done() ? ", done" : "");
  } else if (p.iteration() > 0) {
    // A command job's report that does not say how many in all.
    out = absl::StrFormat("  Progress:   iteration %d", p.iteration());
    if (p.epoch() > 0) absl::StrAppendFormat(&out, ", epoch %d", p.epoch());
    out += "\n";
  }
  if (p.iteration() > 0) {
    absl::StrAppendFormat(
        &out, "  Mini-batch: loss %.4f, accuracy %.2f%%, learn rate %g\n",
        p.loss(), p.accuracy(), p.learn_rate());
  }
  if (p.has_validation()) {
    absl::StrAppendFormat(&out, "  Validation: loss %.4f, accuracy %.2f%%\n",
                          p.validation_loss(), p.validation_accuracy());
  }
  if (p.images_per_s() > 0) {
    absl::StrAppendFormat(
        &out, "  Speed:      %.0f images/s, elapsed %s%s\n", p.images_per_s(),
        FormatDurationMs(static_cast<int64_t>(p.elapsed_s() * 1000)),
        p.done() ? ""
                 : absl::StrCat(", ETA ", FormatDurationMs(static_cast<int64_t>(
                                              p.eta_s() * 1000))));
  }
  // A command job's own numbers (their names are letters, digits and _).
  if (!p.metrics().empty()) {
    std::vector<std::pair<std::string, double>> sorted(p.metrics().begin(),
                                                       p.metrics().end());
    std::sort(sorted.begin(), sorted.end());
    out += "  Metrics:    ";
    for (size_t i = 0; i < sorted.size(); ++i) {
      absl::StrAppendFormat(&out, "%s%s %g", i ? ", " : "", sorted[i].first,
                            sorted[i].second);
    }
    out += "\n";
  }
  return out;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_ms_(SystemClock::Get()->MonotonicMs()) {}

ProgressBar::~ProgressBar() { Done(); }

void ProgressBar::Update(int64_t done, int64_t total) {
  done_ = done;
  total_ = total;
  int64_t now = SystemClock::Get()->MonotonicMs();
  if (now - last_draw_ms_ < 100 && done < total) return;
  last_draw_ms_ = now;
  Draw(false);
}

void ProgressBar::Done() {
  if (finished_) return;
  finished_ = true;
  if (last_draw_ms_ != 0) Draw(true);
}

void ProgressBar::Draw(bool final) {
  if (!tty_) return;
  constexpr int kWidth = 30;
  double frac = total_ > 0
                    ? static_cast<double>(done_) / static_cast<double>(total_)
                    : 1.0;
  frac = std::clamp(frac, 0.0, 1.0);
  int filled = static_cast<int>(frac * kWidth);
  double secs =
      std::max<int64_t>(1, SystemClock::Get()->MonotonicMs() - start_ms_) /
      1000.0;
  std::string rate =
      HumanBytes(static_cast<int64_t>(static_cast<double>(done_) / secs)) +
      "/s";
  std::fprintf(stderr, "\r%-28.28s [%s%s] %5.1f%%  %s / %s  %s%s",
               label_.c_str(), std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '.').c_str(), frac * 100,
               HumanBytes(done_).c_str(), HumanBytes(total_).c_str(),
               rate.c_str(), final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace dlbatch::client
