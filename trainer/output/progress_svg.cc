// training_progress.svg: MATLAB's training-progress figure drawn as a
// standalone SVG. Two panels share the iteration axis: accuracy (0-100 %)
// above, loss below. Training is drawn raw (faint) and exponentially
// smoothed (solid); validation as dots joined by a dashed line; epochs as
// alternating bands. Non-finite values (a diverged loss) are left out, and
// the curve breaks there, so no coordinate is ever NaN or infinite.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/output/history.h"

namespace dlbatch::trainer {
namespace {

constexpr double kWidth = 960, kHeight = 700;
constexpr double kPlotLeft = 80, kPlotRight = 930;
constexpr double kAccTop = 80, kAccBottom = 310;
constexpr double kLossTop = 360, kLossBottom = 590;
// Enough points for a smooth line at this width; longer runs are thinned.
constexpr size_t kMaxPolylinePoints = 2000;

constexpr char kAccColor[] = "#0072BD";   // MATLAB's first line colour
constexpr char kLossColor[] = "#D95319";  // and its second
constexpr char kValidationColor[] = "#000000";
constexpr char kFont[] = "Helvetica, Arial, sans-serif";

std::string Escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;
    }
  }
  return out;
}

// A coordinate; callers pass finite values only, this is the last guard.
std::string Num(double v) {
  if (!std::isfinite(v)) v = 0;
  return absl::StrFormat("%.2f", v);
}

// A 1-2-5 step that divides `range` into about `target` intervals.
double NiceStep(double range, int target) {
  if (!(range > 0)) return 1;
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double nice = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10;
  return nice * magnitude;
}

std::string TickLabel(double value, double step) {
  const int decimals =
      step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  if (std::fabs(value) < step * 1e-6) value = 0;  // no "-0.0"
  return absl::StrFormat("%.*f", decimals, value);
}

struct Axis {
  double min = 0, max = 1, step = 1;
  double pixel_min = 0, pixel_max = 1;  // where min and max are drawn
  double ToPixel(double v) const {
    return pixel_min + (v - min) / (max - min) * (pixel_max - pixel_min);
  }
};

struct Point {
  double x, y;
};
// Runs of consecutive finite points; a non-finite value ends a run.
using Polyline = std::vector<std::vector<Point>>;

void AddPoint(double x, double y, Polyline* line, bool* broken) {
  if (!std::isfinite(x) || !std::isfinite(y)) {
    *broken = true;
    return;
  }
  if (*broken || line->empty()) line->emplace_back();
  *broken = false;
  line->back().push_back({x, y});
}

// Exponential moving average with the start-up bias removed (as
// TensorBoard smooths), skipping non-finite values. The span grows with
// the run so that long runs still read as a trend.
std::vector<double> Smooth(const std::vector<double>& values) {
  const double span =
      std::clamp(static_cast<double>(values.size()) / 40.0, 1.0, 25.0);
  const double beta = 1.0 - 2.0 / (span + 1.0);
  std::vector<double> out(values.size(), NAN);
  double average = 0, weight = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    average = beta * average + (1 - beta) * values[i];
    weight = beta * weight + (1 - beta);
    out[i] = average / weight;
  }
  return out;
}

std::string PathData(const Polyline& line, const Axis& x, const Axis& y) {
  std::string d;
  for (const std::vector<Point>& run : line) {
    for (size_t i = 0; i < run.size(); ++i) {
      absl::StrAppend(&d, i == 0 ? "M" : "L", Num(x.ToPixel(run[i].x)), " ",
                      Num(y.ToPixel(run[i].y)), " ");
    }
  }
  if (!d.empty()) d.pop_back();
  return d;
}

void AppendPath(const Polyline& line, const Axis& x, const Axis& y,
                const std::string& style, std::string* svg) {
  const std::string d = PathData(line, x, y);
  if (d.empty()) return;
  absl::StrAppend(svg, "<path d=\"", d, "\" fill=\"none\" ", style, "/>\n");
}

struct Series {
  std::vector<double> iteration;
  std::vector<double> train;  // per iteration
  std::vector<double> val_iteration;
  std::vector<double> validation;  // per validation
};

// One panel: frame, grid and ticks, the series, the axis labels.
void AppendPanel(const std::string& id, const Series& s, const Axis& x,
                 const Axis& y, const std::string& y_label, const char* color,
                 bool label_x_axis, std::string* svg) {
  const double top = y.pixel_max, bottom = y.pixel_min;
  absl::StrAppend(svg, "<g class=\"panel\" id=\"", id, "\">\n");
  // Data outside the axes (an accuracy below 0) is cut at the frame, with
  // room for a marker on the edge.
  constexpr double kMargin = 4;
  absl::StrAppend(svg, "<clipPath id=\"", id, "-clip\"><rect x=\"",
                  Num(x.pixel_min - kMargin), "\" y=\"", Num(top - kMargin),
                  "\" width=\"", Num(x.pixel_max - x.pixel_min + 2 * kMargin),
                  "\" height=\"", Num(bottom - top + 2 * kMargin),
                  "\"/></clipPath>\n");
  // Grid and tick labels.
  for (double v = x.min; v <= x.max + x.step * 1e-6; v += x.step) {
    const double px = x.ToPixel(v);
    absl::StrAppend(svg, "<line x1=\"", Num(px), "\" y1=\"", Num(top),
                    "\" x2=\"", Num(px), "\" y2=\"", Num(bottom),
                    "\" stroke=\"#e0e0e0\" stroke-width=\"1\"/>\n");
    absl::StrAppend(svg, "<text x=\"", Num(px), "\" y=\"", Num(bottom + 18),
                    "\" text-anchor=\"middle\" font-size=\"12\">",
                    TickLabel(v, x.step), "</text>\n");
  }
  for (double v = y.min; v <= y.max + y.step * 1e-6; v += y.step) {
    const double py = y.ToPixel(v);
    absl::StrAppend(svg, "<line x1=\"", Num(x.pixel_min), "\" y1=\"", Num(py),
                    "\" x2=\"", Num(x.pixel_max), "\" y2=\"", Num(py),
                    "\" stroke=\"#e0e0e0\" stroke-width=\"1\"/>\n");
    absl::StrAppend(svg, "<text x=\"", Num(x.pixel_min - 8), "\" y=\"",
                    Num(py + 4), "\" text-anchor=\"end\" font-size=\"12\">",
                    TickLabel(v, y.step), "</text>\n");
  }

  absl::StrAppend(svg, "<g class=\"data\" clip-path=\"url(#", id,
                  "-clip)\">\n");
  // Training: raw, faint; then smoothed. Thinned alike for long runs.
  const size_t n = s.iteration.size();
  const size_t stride =
      std::max<size_t>(1, (n + kMaxPolylinePoints - 1) / kMaxPolylinePoints);
  const std::vector<double> smoothed = Smooth(s.train);
  Polyline raw, smooth;
  bool raw_broken = false, smooth_broken = false;
  for (size_t i = 0; i < n; i += stride) {
    AddPoint(s.iteration[i], s.train[i], &raw, &raw_broken);
    AddPoint(s.iteration[i], smoothed[i], &smooth, &smooth_broken);
  }
  if (n > 0 && (n - 1) % stride != 0) {  // always end at the last iteration
    AddPoint(s.iteration[n - 1], s.train[n - 1], &raw, &raw_broken);
    AddPoint(s.iteration[n - 1], smoothed[n - 1], &smooth, &smooth_broken);
  }
  AppendPath(raw, x, y,
             absl::StrCat("class=\"train-raw\" stroke=\"", color,
                          "\" stroke-opacity=\"0.3\" stroke-width=\"1\""),
             svg);
  AppendPath(smooth, x, y,
             absl::StrCat("class=\"train-smoothed\" stroke=\"", color,
                          "\" stroke-width=\"1.8\""),
             svg);
  // A lone training point has no line to show: mark it.
  if (raw.size() == 1 && raw[0].size() == 1) {
    absl::StrAppend(svg, "<circle class=\"train-point\" cx=\"",
                    Num(x.ToPixel(raw[0][0].x)), "\" cy=\"",
                    Num(y.ToPixel(raw[0][0].y)), "\" r=\"2.5\" fill=\"", color,
                    "\"/>\n");
  }

  // Validation: dashed line through dots.
  Polyline val;
  bool val_broken = false;
  for (size_t i = 0; i < s.validation.size(); ++i) {
    AddPoint(s.val_iteration[i], s.validation[i], &val, &val_broken);
  }
  AppendPath(val, x, y,
             absl::StrCat("class=\"validation\" stroke=\"", kValidationColor,
                          "\" stroke-width=\"1.2\" stroke-dasharray=\"5,4\""),
             svg);
  for (const std::vector<Point>& run : val) {
    for (const Point& p : run) {
      absl::StrAppend(svg, "<circle class=\"validation-point\" cx=\"",
                      Num(x.ToPixel(p.x)), "\" cy=\"", Num(y.ToPixel(p.y)),
                      "\" r=\"3.5\" fill=\"", kValidationColor,
                      "\" stroke=\"#ffffff\" stroke-width=\"1\"/>\n");
    }
  }

  absl::StrAppend(svg, "</g>\n");

  // Frame and labels.
  absl::StrAppend(svg, "<rect x=\"", Num(x.pixel_min), "\" y=\"", Num(top),
                  "\" width=\"", Num(x.pixel_max - x.pixel_min), "\" height=\"",
                  Num(bottom - top),
                  "\" fill=\"none\" stroke=\"#404040\" stroke-width=\"1\"/>\n");
  const double mid_y = (top + bottom) / 2;
  absl::StrAppend(
      svg, "<text x=\"", Num(24), "\" y=\"", Num(mid_y),
      "\" text-anchor=\"middle\" font-size=\"14\" transform=\"rotate(-90 ",
      Num(24), " ", Num(mid_y), ")\">", Escape(y_label), "</text>\n");
  if (label_x_axis) {
    absl::StrAppend(
        svg, "<text x=\"", Num((x.pixel_min + x.pixel_max) / 2), "\" y=\"",
        Num(bottom + 40),
        "\" text-anchor=\"middle\" font-size=\"14\">Iteration</text>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

// Alternate epochs shaded, across both panels, with "Epoch k" above when
// there are few enough to label.
void AppendEpochBands(const TrainingHistory& h, const Axis& x,
                      std::string* svg) {
  struct Band {
    int64_t epoch;
    double begin, end;
  };
  std::vector<Band> bands;
  for (const IterationRecord& r : h.iterations) {
    const double begin = static_cast<double>(r.iteration) - 1;
    const double end = static_cast<double>(r.iteration);
    if (bands.empty() || bands.back().epoch != r.epoch) {
      bands.push_back({r.epoch, begin, end});
    } else {
      bands.back().end = end;
    }
  }
  if (bands.size() < 2 || bands.size() > 200) return;
  const bool label = bands.size() <= 20;
  absl::StrAppend(svg, "<g class=\"epochs\">\n");
  for (size_t i = 0; i < bands.size(); ++i) {
    const double left = x.ToPixel(std::max(bands[i].begin, x.min));
    const double right = x.ToPixel(std::min(bands[i].end, x.max));
    if (!(right > left)) continue;
    if (i % 2 == 1) {
      for (const auto& [top, bottom] :
           {std::pair{kAccTop, kAccBottom}, std::pair{kLossTop, kLossBottom}}) {
        absl::StrAppend(svg, "<rect x=\"", Num(left), "\" y=\"", Num(top),
                        "\" width=\"", Num(right - left), "\" height=\"",
                        Num(bottom - top), "\" fill=\"#f2f2f2\"/>\n");
      }
    }
    if (label) {
      absl::StrAppend(svg, "<text x=\"", Num((left + right) / 2), "\" y=\"",
                      Num(kAccTop - 6),
                      "\" text-anchor=\"middle\" font-size=\"10\" "
                      "fill=\"#808080\">Epoch ",
                      bands[i].epoch, "</text>\n");
    }
  }
  absl::StrAppend(svg, "</g>\n");
}

void AppendLegend(std::string* svg) {
  struct Entry {
    const char* label;
    const char* color;
    const char* style;  // extra stroke attributes
    bool dot;
  };
  const Entry entries[] = {
      {"Training accuracy (smoothed)", kAccColor, "stroke-width=\"1.8\"",
       false},
      {"Training accuracy", kAccColor,
       "stroke-width=\"1\" stroke-opacity=\"0.3\"", false},
      {"Training loss (smoothed)", kLossColor, "stroke-width=\"1.8\"", false},
      {"Training loss", kLossColor, "stroke-width=\"1\" stroke-opacity=\"0.3\"",
       false},
      {"Validation", kValidationColor,
       "stroke-width=\"1.2\" stroke-dasharray=\"5,4\"", true},
  };
  const double y = kHeight - 28;
  double x = kPlotLeft;
  absl::StrAppend(svg, "<g class=\"legend\" font-size=\"12\">\n");
  for (const Entry& e : entries) {
    absl::StrAppend(svg, "<line x1=\"", Num(x), "\" y1=\"", Num(y), "\" x2=\"",
                    Num(x + 28), "\" y2=\"", Num(y), "\" stroke=\"", e.color,
                    "\" ", e.style, "/>\n");
    if (e.dot) {
      absl::StrAppend(svg, "<circle cx=\"", Num(x + 14), "\" cy=\"", Num(y),
                      "\" r=\"3.5\" fill=\"", e.color, "\"/>\n");
    }
    absl::StrAppend(svg, "<text x=\"", Num(x + 34), "\" y=\"", Num(y + 4),
                    "\">", e.label, "</text>\n");
    x += 34 + 6.2 * std::string(e.label).size() + 20;
  }
  absl::StrAppend(svg, "</g>\n");
}

// "Iteration 1200, epoch 4; validation accuracy 91.25 %, loss 0.2481".
std::string Summary(const TrainingHistory& h) {
  if (h.iterations.empty()) return "No iterations recorded";
  const IterationRecord& last = h.iterations.back();
  std::string text =
      absl::StrCat("Iteration ", last.iteration, ", epoch ", last.epoch);
  if (!h.validations.empty()) {
    const ValidationRecord& v = h.validations.back();
    absl::StrAppend(&text, "; validation accuracy ",
                    absl::StrFormat("%.2f", v.accuracy), " %, loss ",
                    absl::StrFormat("%.4g", v.loss));
  }
  return text;
}

}  // namespace

std::string ProgressSvg(const TrainingHistory& history,
                        const std::string& title) {
  Series acc, loss;
  double max_iteration = 0, max_loss = 0;
  for (const IterationRecord& r : history.iterations) {
    const double it = static_cast<double>(r.iteration);
    acc.iteration.push_back(it);
    acc.train.push_back(r.accuracy);
    loss.iteration.push_back(it);
    loss.train.push_back(r.loss);
    max_iteration = std::max(max_iteration, it);
    if (std::isfinite(r.loss)) max_loss = std::max(max_loss, r.loss);
  }
  for (const ValidationRecord& r : history.validations) {
    const double it = static_cast<double>(r.iteration);
    acc.val_iteration.push_back(it);
    acc.validation.push_back(r.accuracy);
    loss.val_iteration.push_back(it);
    loss.validation.push_back(r.loss);
    max_iteration = std::max(max_iteration, it);
    if (std::isfinite(r.loss)) max_loss = std::max(max_loss, r.loss);
  }

  Axis x;
  x.max = std::max(1.0, max_iteration);
  x.step = std::max(1.0, NiceStep(x.max, 8));
  x.pixel_min = kPlotLeft;
  x.pixel_max = kPlotRight;

  Axis acc_y;
  acc_y.max = 100;
  acc_y.step = 20;
  acc_y.pixel_min = kAccBottom;
  acc_y.pixel_max = kAccTop;

  Axis loss_y;
  loss_y.step = NiceStep(max_loss > 0 ? max_loss : 1, 5);
  loss_y.max = max_loss > 0
                   ? std::max(loss_y.step,
                              std::ceil(max_loss / loss_y.step) * loss_y.step)
                   : 1;
  loss_y.pixel_min = kLossBottom;
  loss_y.pixel_max = kLossTop;

  std::string svg = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"",
      Num(kWidth), "\" height=\"", Num(kHeight), "\" viewBox=\"0 0 ",
      Num(kWidth), " ", Num(kHeight), "\" font-family=\"", kFont, "\">\n");
  absl::StrAppend(&svg, "<title>", Escape(title), "</title>\n");
  absl::StrAppend(&svg,
                  "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  absl::StrAppend(&svg, "<text x=\"", Num(kWidth / 2),
                  "\" y=\"28\" text-anchor=\"middle\" font-size=\"18\" "
                  "font-weight=\"bold\">",
                  Escape(title), "</text>\n");
  absl::StrAppend(&svg, "<text x=\"", Num(kWidth / 2),
                  "\" y=\"50\" text-anchor=\"middle\" font-size=\"12\" "
                  "fill=\"#404040\">",
                  Escape(Summary(history)), "</text>\n");
  AppendEpochBands(history, x, &svg);
  AppendPanel("accuracy", acc, x, acc_y, "Accuracy (%)", kAccColor, false,
              &svg);
  AppendPanel("loss", loss, x, loss_y, "Loss", kLossColor, true, &svg);
  AppendLegend(&svg);
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace dlbatch::trainer
