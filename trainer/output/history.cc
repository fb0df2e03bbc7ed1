// training_history.csv: writing and parsing. Numbers are written in their
// shortest form that reads back to the same double (std::to_chars), so a
// resumed run's history continues bit for bit; non-finite values are
// written "nan", "inf" and "-inf", which also read back.
#include "trainer/output/history.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace dlbatch::trainer {
namespace {

constexpr char kHeader[] =
    "kind,iteration,epoch,time_s,loss,accuracy,learn_rate";
constexpr int kFields = 7;
// TrainingHistory::loss_scaling's form: two more columns.
constexpr char kScaledHeader[] =
    "kind,iteration,epoch,time_s,loss,accuracy,learn_rate,loss_scale,"
    "skipped_steps";
constexpr int kScaledFields = 9;

void AppendDouble(double value, std::string* out) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
}

void AppendInt(int64_t value, std::string* out) {
  char buffer[32];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
}

// kind,iteration,epoch,time_s,loss,accuracy, -- the fields both kinds of
// row share, with the comma before learn_rate.
void AppendSharedFields(const char* kind, int64_t iteration, int64_t epoch,
                        double time_s, double loss, double accuracy,
                        std::string* out) {
  out->append(kind);
  out->push_back(',');
  AppendInt(iteration, out);
  out->push_back(',');
  AppendInt(epoch, out);
  out->push_back(',');
  AppendDouble(time_s, out);
  out->push_back(',');
  AppendDouble(loss, out);
  out->push_back(',');
  AppendDouble(accuracy, out);
  out->push_back(',');
}

void AppendTrainRow(const IterationRecord& r, bool scaled, std::string* out) {
  AppendSharedFields("train", r.iteration, r.epoch, r.time_s, r.loss,
                     r.accuracy, out);
  AppendDouble(r.learn_rate, out);
  if (scaled) {
    out->push_back(',');
    AppendDouble(r.loss_scale, out);
    out->push_back(',');
    AppendInt(r.skipped_steps, out);
  }
  out->push_back('\n');
}

void AppendValidationRow(const ValidationRecord& r, bool scaled,
                         std::string* out) {
  AppendSharedFields("validation", r.iteration, r.epoch, r.time_s, r.loss,
                     r.accuracy, out);
  if (scaled) out->append(",,");  // no learn rate, scale or skipped steps
  out->push_back('\n');
}

// Parses a whole field as T; `what` and `line` name it in the error.
template <typename T>
absl::Status ParseNumber(absl::string_view field, absl::string_view what,
                         int line, T* value) {
  const char* end = field.data() + field.size();
  auto result = std::from_chars(field.data(), end, *value);
  if (field.empty() || result.ec != std::errc() || result.ptr != end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training history line ", line, ": ", what, " '", field, "' is not a ",
        std::is_integral_v<T> ? "whole " : "", "number"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HistoryCsv(const TrainingHistory& history) {
  const bool scaled = history.loss_scaling;
  std::string out(scaled ? kScaledHeader : kHeader);
  out.push_back('\n');
  out.reserve(out.size() +
              64 * (history.iterations.size() + history.validations.size()));
  // A validation comes after the iteration it follows, and before any later
  // one: merge by iteration, training rows first on a tie.
  size_t v = 0;
  for (const IterationRecord& r : history.iterations) {
    while (v < history.validations.size() &&
           history.validations[v].iteration < r.iteration) {
      AppendValidationRow(history.validations[v++], scaled, &out);
    }
    AppendTrainRow(r, scaled, &out);
  }
  while (v < history.validations.size()) {
    AppendValidationRow(history.validations[v++], scaled, &out);
  }
  return out;
}

absl::StatusOr<TrainingHistory> ParseHistoryCsv(const std::string& csv) {
  TrainingHistory history;
  std::vector<absl::string_view> lines = absl::StrSplit(csv, '\n');
  // A final newline leaves one empty piece.
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) {
    return absl::InvalidArgumentError(
        "training history is empty: expected the header line '" +
        std::string(kHeader) + "'");
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view text = lines[i];
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    const int line = static_cast<int>(i) + 1;
    if (i == 0) {
      if (text != kHeader && text != kScaledHeader) {
        return absl::InvalidArgumentError(absl::StrCat(
            "training history line 1: header is '", text, "', expected '",
            kHeader, "' or '", kScaledHeader, "'"));
      }
      history.loss_scaling = text == kScaledHeader;
      continue;
    }
    const bool scaled = history.loss_scaling;
    const size_t fields = scaled ? kScaledFields : kFields;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    if (f.size() != fields) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training history line ", line, ": ", f.size(), " fields, expected ",
          fields, " (", scaled ? kScaledHeader : kHeader, ")"));
    }
    int64_t iteration = 0, epoch = 0;
    double time_s = 0, loss = 0, accuracy = 0;
    if (absl::Status s = ParseNumber(f[1], "iteration", line, &iteration);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ParseNumber(f[2], "epoch", line, &epoch); !s.ok()) {
      return s;
    }
    if (absl::Status s = ParseNumber(f[3], "time_s", line, &time_s); !s.ok()) {
      return s;
    }
    if (absl::Status s = ParseNumber(f[4], "loss", line, &loss); !s.ok()) {
      return s;
    }
    if (absl::Status s = ParseNumber(f[5], "accuracy", line, &accuracy);
        !s.ok()) {
      return s;
    }
    if (f[0] == "train") {
      double learn_rate = 0;
      if (absl::Status s = ParseNumber(f[6], "learn_rate", line, &learn_rate);
          !s.ok()) {
        return s;
      }
      IterationRecord r{iteration, epoch, time_s, loss, accuracy, learn_rate};
      if (scaled) {
        if (absl::Status s =
                ParseNumber(f[7], "loss_scale", line, &r.loss_scale);
            !s.ok()) {
          return s;
        }
        if (absl::Status s =
                ParseNumber(f[8], "skipped_steps", line, &r.skipped_steps);
            !s.ok()) {
          return s;
        }
      }
      history.iterations.push_back(r);
    } else if (f[0] == "validation") {
      for (size_t k = 6; k < fields; ++k) {
        if (!f[k].empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("training history line ", line,
                           ": a validation row has no learn_rate",
                           scaled ? ", loss_scale or skipped_steps" : "",
                           ", found '", f[k], "'"));
        }
      }
      history.validations.push_back({iteration, epoch, time_s, loss, accuracy});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("training history line ", line, ": kind '", f[0],
                       "' is neither 'train' nor 'validation'"));
    }
  }
  return history;
}

}  // namespace dlbatch::trainer
