#include "worker/command_progress.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dlbatch::worker {
namespace {

// A metric's name as Prometheus and a CSV header take it, not too long.
bool GoodMetricName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || c == '_' || (digit && i > 0))) return false;
  }
  return true;
}

// A whole number of steps (JSON has one kind of number; 12.0 counts).
std::optional<int64_t> Count(const nlohmann::json& v) {
  if (!v.is_number()) return std::nullopt;
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0 || d > 9.0e15 || std::floor(d) != d)
    return std::nullopt;
  return static_cast<int64_t>(d);
}

// A JSON number, or a non-finite one as protobuf's JSON form writes it
// (JSON has no NaN): "NaN", "Infinity", "-Infinity".
std::optional<double> Number(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return std::nullopt;
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "NaN") return std::nan("");
  if (s == "Infinity") return HUGE_VAL;
  if (s == "-Infinity") return -HUGE_VAL;
  return std::nullopt;
}

std::string Quoted(const std::string& key) {
  return absl::StrCat("'", key.size() > 40 ? key.substr(0, 40) + "..." : key,
                      "'");
}

}  // namespace

CommandProgress::Result CommandProgress::Read(std::string_view line,
                                              bool complete, int64_t now_ms) {
  Result r;
  if (in_long_line_) {
    // The rest of a line already counted.
    in_long_line_ = !complete;
    r.kind = Result::kPiece;
    return r;
  }
  ++lines_;
  if (!complete) {
    in_long_line_ = true;
    ++bad_;
    r.problem = "longer than the worker's line limit (64 KiB)";
    return r;
  }
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    ++bad_;
    r.problem = j.is_discarded() ? "not JSON" : "not a JSON object";
    if (j.is_discarded() && (line.find("NaN") != std::string_view::npos ||
                             line.find("Infinity") != std::string_view::npos))
      r.problem +=
          " (NaN and Infinity are not JSON numbers: write \"NaN\", "
          "\"Infinity\" or \"-Infinity\" as strings)";
    return r;
  }
  // Checked first, applied after: a bad line changes nothing.
  v1::TrainProgress next = progress_;
  std::optional<int64_t> checkpoint;
  bool has_loss = false, has_validation = false;
  int64_t dropped = 0;
  for (auto item = j.begin(); item != j.end(); ++item) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    auto number = [&](double* out) -> bool {
      std::optional<double> d = Number(value);
      if (!d) return false;
      *out = *d;
      return true;
    };
    auto count = [&](int64_t* out) -> bool {
      std::optional<int64_t> n = Count(value);
      if (!n) return false;
      *out = *n;
      return true;
    };
    double d = 0;
    int64_t n = 0;
    bool ok = true;
    if (key == "iteration" || key == "step") {
      ok = count(&n);
      next.set_iteration(n);
    } else if (key == "iterations" || key == "steps") {
      ok = count(&n);
      next.set_iterations(n);
    } else if (key == "epoch") {
      ok = count(&n) && n <= INT32_MAX;
      next.set_epoch(static_cast<int32_t>(n));
    } else if (key == "epochs") {
      ok = count(&n) && n <= INT32_MAX;
      next.set_epochs(static_cast<int32_t>(n));
    } else if (key == "checkpoint") {
      ok = count(&n);
      checkpoint = n;
    } else if (key == "loss") {
      ok = number(&d);
      next.set_loss(d);
      has_loss = true;
    } else if (key == "accuracy") {
      ok = number(&d);
      next.set_accuracy(d);
    } else if (key == "learn_rate") {
      ok = number(&d);
      next.set_learn_rate(d);
    } else if (key == "images_per_s") {
      ok = number(&d);
      next.set_images_per_s(d);
    } else if (key == "elapsed_s") {
      ok = number(&d);
      next.set_elapsed_s(d);
    } else if (key == "eta_s") {
      ok = number(&d);
      next.set_eta_s(d);
    } else if (key == "validation_loss") {
      ok = number(&d);
      next.set_validation_loss(d);
      next.set_has_validation(true);
      has_validation = true;
    } else if (key == "validation_accuracy") {
      ok = number(&d);
      next.set_validation_accuracy(d);
      next.set_has_validation(true);
      has_validation = true;
    } else if (std::optional<double> metric = Number(value)) {
      if (!GoodMetricName(key)) {
        ++bad_;
        r.problem = absl::StrCat(
            "the metric name ", Quoted(key),
            " is not letters, digits and _ (at most 64, not starting with a "
            "digit)");
        return r;
      }
      auto& metrics = *next.mutable_metrics();
      if (metrics.contains(key) ||
          static_cast<int>(metrics.size()) < kMaxJobMetrics) {
        metrics[key] = *metric;
      } else {
        ++dropped;
      }
    } else {
      // Not a number: a label the job keeps for itself (ignored).
    }
    if (!ok) {
      ++bad_;
      r.problem = absl::StrCat(
          Quoted(key), key == "loss" || key == "accuracy" ||
                               key == "learn_rate" || key == "images_per_s" ||
                               key == "elapsed_s" || key == "eta_s" ||
                               absl::StartsWith(key, "validation_")
                           ? " is not a number"
                           : " is not a whole number of at least 0");
      return r;
    }
  }
  metrics_dropped_ += dropped;
  const double now_s = static_cast<double>(now_ms - start_ms_) / 1000.0;
  if (!j.contains("elapsed_s")) next.set_elapsed_s(std::max(0.0, now_s));
  if (!j.contains("eta_s") && next.iterations() > 0 && next.iteration() > 0 &&
      next.iteration() <= next.iterations()) {
    next.set_eta_s(next.elapsed_s() *
                   static_cast<double>(next.iterations() - next.iteration()) /
                   static_cast<double>(next.iteration()));
  }
  next.set_time_ms(now_ms);
  progress_ = std::move(next);
  Record(has_loss, has_validation, progress_.elapsed_s());
  if (checkpoint) {
    r.kind = Result::kCheckpoint;
    r.step = *checkpoint;
    r.progress = j.size() > 1;
  } else {
    r.kind = Result::kProgress;
    r.progress = true;
  }
  return r;
}

void CommandProgress::Record(bool has_loss, bool has_validation,
                             double time_s) {
  if (has_loss) {
    if (rows_seen_++ % keep_every_ == 0) {
      trainer::IterationRecord row;
      row.iteration = progress_.iteration();
      row.epoch = progress_.epoch();
      row.time_s = time_s;
      row.loss = progress_.loss();
      row.accuracy = progress_.accuracy();
      row.learn_rate = progress_.learn_rate();
      history_.iterations.push_back(row);
    }
  }
  if (has_validation) {
    trainer::ValidationRecord row;
    row.iteration = progress_.iteration();
    row.epoch = progress_.epoch();
    row.time_s = time_s;
    row.loss = progress_.validation_loss();
    row.accuracy = progress_.validation_accuracy();
    history_.validations.push_back(row);
  }
  if (history_.iterations.size() + history_.validations.size() >
      kMaxHistoryRows)
    Thin();
}

void CommandProgress::Thin() {
  auto halve = [](auto& rows) {
    size_t out = 0;
    for (size_t i = 0; i < rows.size(); i += 2) rows[out++] = rows[i];
    rows.resize(out);
  };
  halve(history_.iterations);
  if (history_.validations.size() > kMaxHistoryRows / 2)
    halve(history_.validations);
  keep_every_ *= 2;
}

std::vector<HistoryFile> HistoryFiles(const trainer::TrainingHistory& history,
                                      const std::string& title) {
  if (history.iterations.empty() && history.validations.empty()) return {};
  return {{"training_history.csv", trainer::HistoryCsv(history)},
          {"training_progress.svg", trainer::ProgressSvg(history, title)}};
}

}  // namespace dlbatch::worker
