// The trainer's outputs: training_history.csv (exact format, round trip,
// errors), training_progress.svg (well-formed, finite, complete) and the
// ONNX export (accepted by ONNX's own checker, and computing what the
// trainer's network computes, checked against plain loops over the
// trainer's NHWC layouts on random weights and images).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "trainer/backend.h"
#include "trainer/network.h"
#include "trainer/output/history.h"
#include "trainer/output/onnx_export.h"
#include "trainer/output/onnx_subset.pb.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

// Runs `command` through the shell; its exit status, output into `output`.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t got;
  output->clear();
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output->append(buffer, got);
  }
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Files in the test's temporary directory, removed when it goes.
class TempFiles {
 public:
  TempFiles() = default;
  TempFiles(const TempFiles&) = delete;
  TempFiles& operator=(const TempFiles&) = delete;
  ~TempFiles() {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }
  std::string Path(const std::string& name) {
    std::string dir = testing::TempDir();
    if (!dir.empty() && dir.back() != '/') dir += '/';
    paths_.push_back(absl::StrCat(dir, "output_test_", getpid(), "_", name));
    return paths_.back();
  }

 private:
  std::vector<std::string> paths_;
};

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- training_history.csv ---

TrainingHistory SmallHistory() {
  TrainingHistory h;
  h.iterations = {{1, 1, 0.5, 2.3, 10, 0.01}, {2, 1, 1, 2.1, 20, 0.01}};
  h.validations = {{1, 1, 0.75, 2.25, 12.5}};
  return h;
}

TEST(HistoryCsvTest, WritesHeaderAndRowsExactly) {
  EXPECT_EQ(HistoryCsv(SmallHistory()),
            "kind,iteration,epoch,time_s,loss,accuracy,learn_rate\n"
            "train,1,1,0.5,2.3,10,0.01\n"
            "validation,1,1,0.75,2.25,12.5,\n"
            "train,2,1,1,2.1,20,0.01\n");
  EXPECT_EQ(HistoryCsv({}),
            "kind,iteration,epoch,time_s,loss,accuracy,learn_rate\n");
}

TEST(HistoryCsvTest, OrdersValidationsByIteration) {
  TrainingHistory h;
  h.iterations = {{1, 1, 1, 1, 1, 1}, {2, 1, 2, 1, 1, 1}, {3, 2, 3, 1, 1, 1}};
  h.validations = {{0, 0, 0, 2, 0}, {2, 1, 2.5, 1, 50}, {9, 3, 9, 1, 60}};
  std::vector<std::string> kinds;
  std::istringstream lines(HistoryCsv(h));
  std::string line;
  std::getline(lines, line);  // header
  while (std::getline(lines, line)) {
    kinds.push_back(line.substr(0, line.find(',', line.find(',') + 1)));
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"validation,0", "train,1",
                                             "train,2", "validation,2",
                                             "train,3", "validation,9"}));
}

TEST(HistoryCsvTest, RoundTripsEveryValueExactly) {
  TrainingHistory h;
  Rng rng(Key(7));
  for (int i = 1; i <= 300; ++i) {
    h.iterations.push_back({i, (i - 1) / 100 + 1, i * 0.0123456789 + 1e-9,
                            2.302585 * std::exp(-i / 80.0) + rng.Uniform() / 3,
                            100 * rng.Uniform(),
                            0.01 * std::pow(0.5, i / 100)});
    if (i % 50 == 0) {
      h.validations.push_back({i, (i - 1) / 100 + 1, i * 0.0123456789 + 0.5,
                               rng.Uniform(), 100.0 / 3});
    }
  }
  h.iterations[5].loss = 1e-300;
  h.iterations[6].learn_rate = 1.0 / 3;
  const std::string csv = HistoryCsv(h);
  absl::StatusOr<TrainingHistory> parsed = ParseHistoryCsv(csv);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->iterations.size(), h.iterations.size());
  ASSERT_EQ(parsed->validations.size(), h.validations.size());
  for (size_t i = 0; i < h.iterations.size(); ++i) {
    const IterationRecord &a = h.iterations[i], &b = parsed->iterations[i];
    EXPECT_EQ(a.iteration, b.iteration);
    EXPECT_EQ(a.epoch, b.epoch);
    EXPECT_EQ(a.time_s, b.time_s);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.accuracy, b.accuracy);
    EXPECT_EQ(a.learn_rate, b.learn_rate) << "row " << i;
  }
  for (size_t i = 0; i < h.validations.size(); ++i) {
    const ValidationRecord &a = h.validations[i], &b = parsed->validations[i];
    EXPECT_EQ(a.iteration, b.iteration);
    EXPECT_EQ(a.epoch, b.epoch);
    EXPECT_EQ(a.time_s, b.time_s);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.accuracy, b.accuracy);
  }
  EXPECT_EQ(HistoryCsv(*parsed), csv);
}

// A run that scaled its loss (fp16) adds loss_scale and skipped_steps;
// both forms read back, and a row of the wrong form is an error.
TEST(HistoryCsvTest, LossScaledRunsAddTheScaleAndSkippedSteps) {
  TrainingHistory h = SmallHistory();
  h.loss_scaling = true;
  h.iterations[0].loss_scale = 65536;
  h.iterations[1].loss_scale = 32768;
  h.iterations[1].skipped_steps = 1;
  const std::string csv = HistoryCsv(h);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "kind,iteration,epoch,time_s,loss,accuracy,learn_rate,loss_scale,"
            "skipped_steps");
  EXPECT_NE(csv.find(",65536,0\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",32768,1\n"), std::string::npos) << csv;
  absl::StatusOr<TrainingHistory> parsed = ParseHistoryCsv(csv);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->loss_scaling);
  ASSERT_EQ(parsed->iterations.size(), h.iterations.size());
  EXPECT_EQ(parsed->iterations[1].loss_scale, 32768);
  EXPECT_EQ(parsed->iterations[1].skipped_steps, 1);
  EXPECT_EQ(HistoryCsv(*parsed), csv);
  EXPECT_FALSE(ParseHistoryCsv(HistoryCsv(SmallHistory()))->loss_scaling);

  absl::StatusOr<TrainingHistory> bad = ParseHistoryCsv(
      "kind,iteration,epoch,time_s,loss,accuracy,learn_rate,loss_scale,"
      "skipped_steps\ntrain,1,1,0.5,2.3,10,0.01\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2: 7 fields, expected 9"),
            std::string::npos)
      << bad.status();
}

TEST(HistoryCsvTest, KeepsNonFiniteLossesAndAcceptsCrLf) {
  TrainingHistory h = SmallHistory();
  h.iterations[0].loss = std::numeric_limits<double>::quiet_NaN();
  h.iterations[1].loss = std::numeric_limits<double>::infinity();
  h.validations[0].loss = -std::numeric_limits<double>::infinity();
  std::string csv = HistoryCsv(h);
  EXPECT_TRUE(absl::StrContains(csv, "train,1,1,0.5,nan,10,0.01\n")) << csv;
  std::string crlf;
  for (char c : csv) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  absl::StatusOr<TrainingHistory> parsed = ParseHistoryCsv(crlf);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(std::isnan(parsed->iterations[0].loss));
  EXPECT_EQ(parsed->iterations[1].loss,
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(parsed->validations[0].loss,
            -std::numeric_limits<double>::infinity());
}

TEST(HistoryCsvTest, ParseErrorsNameTheLine) {
  const std::string header =
      "kind,iteration,epoch,time_s,loss,accuracy,learn_rate\n";
  const struct {
    std::string csv;
    std::string expected;
  } cases[] = {
      {"", "empty"},
      {"kind,iteration,epoch\n", "line 1: header"},
      {header + "train,1,1,0.5,2.3,10,0.01\ntrain,2,1,1,2.1,20\n",
       "line 3: 6 fields"},
      {header + "train,1,1,0.5,abc,10,0.01\n", "line 2: loss 'abc'"},
      {header + "train,1.5,1,0.5,2,10,0.01\n", "line 2: iteration '1.5'"},
      {header + "train,1,1,0.5,2,10,\n", "line 2: learn_rate ''"},
      {header + "train,1,1,0.5,2,10,0.1\nvalidation,1,1,1,2,10,0.1\n",
       "line 3: a validation row has no learn_rate"},
      {header + "test,1,1,0.5,2,10,0.1\n", "line 2: kind 'test'"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<TrainingHistory> parsed = ParseHistoryCsv(c.csv);
    ASSERT_FALSE(parsed.ok()) << c.csv;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), c.expected))
        << parsed.status() << " should contain: " << c.expected;
  }
}

// --- training_progress.svg ---

// A run as a real one looks: loss falling with noise, accuracy rising,
// validation every 40 iterations, three epochs, and one diverged step.
TrainingHistory RealisticHistory() {
  TrainingHistory h;
  Rng rng(Key(11));
  for (int i = 1; i <= 300; ++i) {
    const double loss = 2.3 * std::exp(-i / 60.0) + 0.2 + 0.3 * rng.Uniform();
    h.iterations.push_back({i, (i - 1) / 100 + 1, i * 0.05, loss,
                            std::min(100.0, 100 - 40 * loss), 0.01});
    if (i % 40 == 0 || i == 300) {
      h.validations.push_back(
          {i, (i - 1) / 100 + 1, i * 0.05 + 0.01, loss * 1.1, 95 - 30 * loss});
    }
  }
  h.iterations[120].loss = std::numeric_limits<double>::quiet_NaN();
  h.iterations[121].loss = std::numeric_limits<double>::infinity();
  h.iterations[122].accuracy = std::numeric_limits<double>::quiet_NaN();
  return h;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// Parses `svg` with Python's XML parser and checks every coordinate is a
// finite number inside the view box; "" when well-formed, else the error.
// Skips (returns "skip") where no /usr/bin/python3 exists.
std::string CheckSvgWithPython(const std::string& svg) {
  if (access(kPython, X_OK) != 0) return "skip";
  TempFiles files;
  const std::string path = files.Path("progress.svg");
  WriteFile(path, svg);
  const std::string script = R"PY(
import math, re, sys, xml.dom.minidom
doc = xml.dom.minidom.parse(sys.argv[1])
root = doc.documentElement
assert root.tagName == "svg", root.tagName
assert root.getAttribute("xmlns") == "http://www.w3.org/2000/svg"
w, h = float(root.getAttribute("width")), float(root.getAttribute("height"))
for el in doc.getElementsByTagName("*"):
    for name in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "width", "height"):
        v = el.getAttribute(name)
        if v and not v.endswith("%"):
            assert math.isfinite(float(v)), (el.tagName, name, v)
    for v in re.findall(r"-?[0-9.]+", el.getAttribute("d")):
        assert -1 <= float(v) <= max(w, h) + 1, (el.tagName, v)
print("ok")
)PY";
  const std::string script_path = files.Path("check_svg.py");
  WriteFile(script_path, script);
  std::string output;
  const int rc =
      RunCommand(absl::StrCat(kPython, " ", script_path, " ", path), &output);
  return rc == 0 ? "" : output;
}

TEST(ProgressSvgTest, DrawsBothPanelsWithTrainingAndValidation) {
  const TrainingHistory h = RealisticHistory();
  const std::string svg = ProgressSvg(h, "Fashion-MNIST <LeNet> & friends");
  EXPECT_TRUE(absl::StartsWith(svg, "<?xml")) << svg.substr(0, 100);
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  EXPECT_TRUE(absl::StrContains(svg, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(
      absl::StrContains(svg, "Fashion-MNIST &lt;LeNet&gt; &amp; friends"));
  EXPECT_FALSE(absl::StrContains(svg, "<LeNet>"));
  for (const char* label :
       {"Accuracy (%)", ">Loss<", ">Iteration<", "Training accuracy (smoothed)",
        "Training loss", "Validation", "Epoch 3"}) {
    EXPECT_TRUE(absl::StrContains(svg, label)) << label;
  }
  EXPECT_EQ(Count(svg, "class=\"panel\""), 2);
  EXPECT_EQ(Count(svg, "class=\"train-smoothed\""), 2);
  EXPECT_EQ(Count(svg, "class=\"train-raw\""), 2);
  EXPECT_EQ(Count(svg, "class=\"validation\""), 2);
  EXPECT_EQ(Count(svg, "class=\"validation-point\""),
            2 * static_cast<int>(h.validations.size()));
  // The non-finite losses break the raw loss line into two runs.
  const size_t raw_loss = svg.rfind("class=\"train-raw\"");
  const size_t path_start = svg.rfind("<path d=\"", raw_loss);
  EXPECT_EQ(Count(svg.substr(path_start, raw_loss - path_start), "M"), 2);
  // Ticks in 1-2-5 steps: 300 iterations in steps of 50.
  EXPECT_TRUE(absl::StrContains(svg, ">250</text>"));
  EXPECT_FALSE(absl::StrContains(svg, ">260</text>"));
  // The final summary reads from the last validation.
  EXPECT_TRUE(absl::StrContains(svg, "Iteration 300, epoch 3; validation"));

  const std::string lower = absl::AsciiStrToLower(svg);
  EXPECT_FALSE(absl::StrContains(lower, "nan"));
  EXPECT_FALSE(absl::StrContains(lower, "inf"));
  const std::string error = CheckSvgWithPython(svg);
  if (error == "skip") GTEST_SKIP() << kPython << " not found";
  EXPECT_EQ(error, "");
}

TEST(ProgressSvgTest, EmptyAndSinglePointHistoriesAreValid) {
  TrainingHistory one;
  one.iterations = {{1, 1, 0.1, 2.3, 9.375, 0.01}};
  TrainingHistory only_validation;
  only_validation.validations = {{0, 0, 0, 2.31, 10}};
  TrainingHistory all_nan;
  all_nan.iterations = {{1, 1, 0.1, NAN, NAN, 0.01},
                        {2, 1, 0.2, NAN, NAN, 0.01}};
  for (const TrainingHistory& h :
       {TrainingHistory{}, one, only_validation, all_nan}) {
    const std::string svg = ProgressSvg(h, "t");
    const std::string lower = absl::AsciiStrToLower(svg);
    EXPECT_FALSE(absl::StrContains(lower, "nan")) << svg;
    EXPECT_FALSE(absl::StrContains(lower, "inf")) << svg;
    const std::string error = CheckSvgWithPython(svg);
    if (error == "skip") GTEST_SKIP() << kPython << " not found";
    EXPECT_EQ(error, "") << svg;
  }
  EXPECT_TRUE(
      absl::StrContains(ProgressSvg(one, "t"), "class=\"train-point\""));
  EXPECT_TRUE(
      absl::StrContains(ProgressSvg({}, "t"), "No iterations recorded"));
}

// --- ONNX export ---

// Builds a ModelForExport by hand, as Network::Build describes a network:
// shapes resolved layer by layer, windows with `padding_same` resolved to
// the extra row/column at the bottom/right, every weight first in the
// parameter buffer and then every bias and batchnorm scale/offset.
class TestNet {
 public:
  explicit TestNet(Shape input) {
    model_.name = "test-net";
    model_.input = input;
    shape_ = input;
  }

  TestNet& Conv(int filters, int size, int stride, int padding, bool same) {
    v1::LayerSpec spec = Spec("conv");
    spec.set_filters(filters);
    spec.set_size(size);
    spec.set_stride(stride);
    spec.set_padding(padding);
    spec.set_padding_same(same);
    LayerInfo& l = Window(spec, size, stride, padding, same, filters);
    Param(l, "weight", {filters, size, size, l.in.c}, true);
    Param(l, "bias", {filters}, false);
    return *this;
  }
  TestNet& Pool(const std::string& type, int size, int stride, bool same) {
    v1::LayerSpec spec = Spec(type);
    spec.set_size(size);
    spec.set_stride(stride);
    spec.set_padding_same(same);
    Window(spec, size, stride, 0, same, shape_.c);
    return *this;
  }
  TestNet& GlobalAvgPool() {
    LayerInfo& l = Add(Spec("globalavgpool"), {1, 1, shape_.c});
    l.kh = l.in.h;
    l.kw = l.in.w;
    return *this;
  }
  TestNet& BatchNorm(float epsilon) {
    v1::LayerSpec spec = Spec("batchnorm");
    spec.set_epsilon(epsilon);
    LayerInfo& l = Add(spec, shape_);
    Param(l, "scale", {shape_.c}, false);
    Param(l, "offset", {shape_.c}, false);
    State(l, "running_mean", shape_.c);
    State(l, "running_var", shape_.c);
    return *this;
  }
  TestNet& Activation(const std::string& type, float alpha = 0) {
    v1::LayerSpec spec = Spec(type);
    spec.set_alpha(alpha);
    Add(spec, shape_);
    return *this;
  }
  TestNet& Fc(int units) {
    v1::LayerSpec spec = Spec("fc");
    spec.set_units(units);
    const int64_t in = shape_.size();
    LayerInfo& l = Add(spec, {1, 1, units});
    Param(l, "weight", {units, in}, true);
    Param(l, "bias", {units}, false);
    return *this;
  }
  TestNet& Softmax() {
    Add(Spec("softmax"), shape_);
    model_.num_classes = shape_.c;
    return *this;
  }

  // Lays the buffers out and fills them with random values of the scale
  // trained networks have. `generic_names`: parameters named "p<i>", so
  // the exporter must go by network.h's order alone.
  ModelForExport Finish(uint64_t seed, bool generic_names = false) {
    Rng rng(Key(seed));
    int64_t offset = 0;
    for (bool decayed : {true, false}) {
      for (const Pending& p : pending_) {
        if (p.decayed != decayed) continue;
        const int index = static_cast<int>(model_.params_info.size());
        model_.params_info.push_back(
            {generic_names
                 ? absl::StrCat("p", index)
                 : absl::StrCat(model_.layers[p.layer].name, ".", p.name),
             p.layer, offset, Count(p.dims), p.dims});
        offset += Count(p.dims);
      }
    }
    model_.params.resize(offset);
    // Each layer lists its arrays in network.h's order: weight then bias,
    // scale then offset.
    for (const Pending& p : pending_) {
      for (size_t i = 0; i < model_.params_info.size(); ++i) {
        const ParamInfo& info = model_.params_info[i];
        if (info.layer == p.layer && info.dims == p.dims &&
            (generic_names || absl::EndsWith(info.name, "." + p.name)) &&
            !Listed(model_.layers[p.layer].params, i)) {
          model_.layers[p.layer].params.push_back(static_cast<int>(i));
          Fill(p, info, &rng);
          break;
        }
      }
    }
    for (ParamInfo& s : model_.state_info) {
      s.offset = static_cast<int64_t>(model_.state.size());
      const bool var = absl::EndsWith(s.name, "var");
      for (int64_t i = 0; i < s.count; ++i) {
        model_.state.push_back(var ? 0.5 + 1.5 * rng.Uniform()
                                   : 0.6 * rng.Uniform() - 0.3);
      }
      if (generic_names) s.name = absl::StrCat("s", s.offset);
    }
    return model_;
  }

 private:
  struct Pending {
    int layer;
    std::string name;
    std::vector<int64_t> dims;
    bool decayed;
  };

  static int64_t Count(const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  static bool Listed(const std::vector<int>& list, size_t i) {
    for (int j : list) {
      if (j == static_cast<int>(i)) return true;
    }
    return false;
  }

  v1::LayerSpec Spec(const std::string& type) {
    v1::LayerSpec spec;
    spec.set_type(type);
    return spec;
  }

  LayerInfo& Add(const v1::LayerSpec& spec, Shape out) {
    LayerInfo l;
    l.index = static_cast<int>(model_.layers.size());
    l.name = absl::StrCat(spec.type(), "_", l.index + 1);
    l.spec = spec;
    l.in = shape_;
    l.out = out;
    shape_ = out;
    model_.layers.push_back(l);
    return model_.layers.back();
  }

  LayerInfo& Window(const v1::LayerSpec& spec, int size, int stride,
                    int padding, bool same, int out_c) {
    auto resolve = [&](int in, int* begin, int* end) {
      if (same) {
        const int out = (in + stride - 1) / stride;
        const int total = std::max((out - 1) * stride + size - in, 0);
        *begin = total / 2;
        *end = total - *begin;
        return out;
      }
      *begin = *end = padding;
      return (in + 2 * padding - size) / stride + 1;
    };
    Padding pad;
    Shape out;
    out.h = resolve(shape_.h, &pad.top, &pad.bottom);
    out.w = resolve(shape_.w, &pad.left, &pad.right);
    out.c = out_c;
    LayerInfo& l = Add(spec, out);
    l.kh = l.kw = size;
    l.stride_h = l.stride_w = stride;
    l.pad = pad;
    return l;
  }

  void Param(const LayerInfo& l, const std::string& name,
             std::vector<int64_t> dims, bool decayed) {
    pending_.push_back({l.index, name, std::move(dims), decayed});
  }
  void State(LayerInfo& l, const std::string& name, int c) {
    l.state.push_back(static_cast<int>(model_.state_info.size()));
    model_.state_info.push_back({l.name + "." + name, l.index, 0, c, {c}});
  }

  void Fill(const Pending& p, const ParamInfo& info, Rng* rng) {
    float* out = model_.params.data() + info.offset;
    if (p.decayed) {  // He-normal over the fan-in
      const double fan_in = static_cast<double>(info.count / info.dims[0]);
      for (int64_t i = 0; i < info.count; ++i) {
        out[i] = static_cast<float>(rng->Normal() * std::sqrt(2.0 / fan_in));
      }
    } else if (p.name == "scale") {
      for (int64_t i = 0; i < info.count; ++i) out[i] = 0.5 + rng->Uniform();
    } else {
      for (int64_t i = 0; i < info.count; ++i) {
        out[i] = 0.4 * rng->Uniform() - 0.2;
      }
    }
  }

  ModelForExport model_;
  Shape shape_;
  std::vector<Pending> pending_;
};

// The network's forward pass for one NHWC sample, in double, straight from
// network.h's layouts: what the exported model must reproduce.
std::vector<double> ReferenceForward(const ModelForExport& m,
                                     const float* image) {
  Shape s = m.input;
  std::vector<double> x(image, image + s.size());
  if (!m.normalization.mean.empty()) {
    for (int64_t i = 0; i < s.size(); ++i) {
      x[i] =
          (x[i] - m.normalization.mean[i % s.c]) / m.normalization.std[i % s.c];
    }
  }
  auto param = [&](const LayerInfo& l, int k) {
    return m.params.data() + m.params_info[l.params[k]].offset;
  };
  auto state = [&](const LayerInfo& l, int k) {
    return m.state.data() + m.state_info[l.state[k]].offset;
  };
  for (const LayerInfo& l : m.layers) {
    const std::string& type = l.spec.type();
    const Shape in = l.in, out = l.out;
    std::vector<double> y(out.size(), 0.0);
    auto at = [&](int h, int w, int c) {
      return x[(int64_t{h} * in.w + w) * in.c + c];
    };
    if (type == "conv" || type == "maxpool" || type == "avgpool" ||
        type == "globalavgpool") {
      const int top = type == "globalavgpool" ? 0 : l.pad.top;
      const int left = type == "globalavgpool" ? 0 : l.pad.left;
      for (int oh = 0; oh < out.h; ++oh) {
        for (int ow = 0; ow < out.w; ++ow) {
          for (int oc = 0; oc < out.c; ++oc) {
            double acc = type == "conv" ? param(l, 1)[oc] : 0.0;
            double best = -INFINITY;
            int count = 0;
            for (int ky = 0; ky < l.kh; ++ky) {
              for (int kx = 0; kx < l.kw; ++kx) {
                const int ih = oh * l.stride_h - top + ky;
                const int iw = ow * l.stride_w - left + kx;
                if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                ++count;
                if (type == "conv") {
                  for (int ic = 0; ic < in.c; ++ic) {
                    acc +=
                        at(ih, iw, ic) *
                        param(
                            l,
                            0)[((int64_t{oc} * l.kh + ky) * l.kw + kx) * in.c +
                               ic];
                  }
                } else {
                  acc += at(ih, iw, oc);
                  best = std::max(best, at(ih, iw, oc));
                }
              }
            }
            double& v = y[(int64_t{oh} * out.w + ow) * out.c + oc];
            v = type == "conv" ? acc : type == "maxpool" ? best : acc / count;
          }
        }
      }
    } else if (type == "batchnorm") {
      const float eps = l.spec.epsilon() != 0 ? l.spec.epsilon() : 1e-5f;
      for (int64_t i = 0; i < in.size(); ++i) {
        const int c = static_cast<int>(i % in.c);
        y[i] = (x[i] - state(l, 0)[c]) /
                   std::sqrt(state(l, 1)[c] + double{eps}) * param(l, 0)[c] +
               param(l, 1)[c];
      }
    } else if (type == "relu" || type == "leakyrelu") {
      const double alpha = type == "relu"        ? 0.0
                           : l.spec.alpha() != 0 ? double{l.spec.alpha()}
                                                 : double{0.01f};
      for (int64_t i = 0; i < in.size(); ++i) {
        y[i] = x[i] > 0 ? x[i] : alpha * x[i];
      }
    } else if (type == "fc") {
      for (int u = 0; u < out.c; ++u) {
        double acc = param(l, 1)[u];
        for (int64_t k = 0; k < in.size(); ++k) {
          acc += param(l, 0)[u * in.size() + k] * x[k];
        }
        y[u] = acc;
      }
    } else if (type == "softmax") {
      double max = -INFINITY, sum = 0;
      for (double v : x) max = std::max(max, v);
      for (int64_t i = 0; i < in.size(); ++i)
        sum += y[i] = std::exp(x[i] - max);
      for (double& v : y) v /= sum;
    } else {
      y = x;  // dropout: the identity at inference
    }
    x = std::move(y);
  }
  return x;
}

bool PythonHasOnnx() {
  if (access(kPython, X_OK) != 0) return false;
  std::string output;
  return RunCommand(absl::StrCat(kPython, " -c 'import onnx, numpy'"),
                    &output) == 0;
}

// Exports `model`, has ONNX's checker accept it and the numpy interpreter
// run it on `n` random images, and compares with ReferenceForward.
void ExpectOnnxMatchesReference(const ModelForExport& model, int n,
                                uint64_t seed) {
  absl::StatusOr<std::string> bytes = ExportOnnx(model);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  TempFiles files;
  const std::string model_path = files.Path(absl::StrCat(seed, ".onnx"));
  const std::string input_path = files.Path(absl::StrCat(seed, ".in"));
  const std::string output_path = files.Path(absl::StrCat(seed, ".out"));
  WriteFile(model_path, *bytes);

  const Shape s = model.input;
  std::vector<float> nhwc(n * s.size()), nchw(n * s.size());
  Rng rng(Key(seed, 1));
  for (float& v : nhwc) v = static_cast<float>(rng.Uniform());
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < s.h; ++h) {
      for (int w = 0; w < s.w; ++w) {
        for (int c = 0; c < s.c; ++c) {
          nchw[((int64_t{i} * s.c + c) * s.h + h) * s.w + w] =
              nhwc[((int64_t{i} * s.h + h) * s.w + w) * s.c + c];
        }
      }
    }
  }
  WriteFile(input_path, std::string(reinterpret_cast<const char*>(nchw.data()),
                                    nchw.size() * sizeof(float)));
  std::string output;
  const int rc = RunCommand(
      absl::StrCat(kPython, " ", DLBATCH_TEST_SOURCE_DIR, "/onnx_eval.py ",
                   model_path, " ", input_path, " ", n, " ", s.c, " ", s.h, " ",
                   s.w, " ", output_path),
      &output);
  ASSERT_EQ(rc, 0) << output;

  const std::string result = ReadFile(output_path);
  ASSERT_EQ(result.size(), n * model.num_classes * sizeof(double)) << output;
  std::vector<double> onnx(n * model.num_classes);
  std::memcpy(onnx.data(), result.data(), result.size());
  double max_p = 0;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> ref =
        ReferenceForward(model, nhwc.data() + i * s.size());
    ASSERT_EQ(static_cast<int>(ref.size()), model.num_classes);
    for (int k = 0; k < model.num_classes; ++k) {
      const double got = onnx[i * model.num_classes + k];
      EXPECT_NEAR(got, ref[k], 1e-4 * std::fabs(ref[k]) + 1e-12)
          << "sample " << i << " class " << k;
      max_p = std::max(max_p, ref[k]);
    }
  }
  // Probabilities far from saturation, so the comparison could fail.
  EXPECT_LT(max_p, 0.999);
}

ModelForExport LeNet(uint64_t seed) {
  ModelForExport m = TestNet({16, 14, 3})
                         .Conv(6, 5, 1, 2, false)      // [16, 14, 6]
                         .Pool("maxpool", 3, 2, true)  // [8, 7, 6], pads 0/1
                         .Conv(8, 4, 1, 0, true)       // [8, 7, 8], pads 1/2
                         .BatchNorm(1e-3f)
                         .Activation("relu")
                         .Pool("avgpool", 2, 2, true)  // [4, 4, 8], pads w 0/1
                         .Fc(20)
                         .Activation("leakyrelu", 0.1f)
                         .Activation("dropout")
                         .Fc(5)
                         .Softmax()
                         .Finish(seed);
  m.normalization.mean = {0.49f, 0.48f, 0.45f};
  m.normalization.std = {0.25f, 0.24f, 0.26f};
  return m;
}

std::vector<int64_t> Ints(const onnx::NodeProto& node,
                          const std::string& name) {
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() == name) return {a.ints().begin(), a.ints().end()};
  }
  return {};
}

TEST(OnnxExportTest, WritesTheModelDescription) {
  const ModelForExport model = LeNet(1);
  ASSERT_EQ(model.layers[2].pad, (Padding{1, 1, 2, 2}));
  ASSERT_EQ(model.layers[1].pad, (Padding{0, 0, 1, 1}));
  absl::StatusOr<std::string> bytes = ExportOnnx(model);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(*bytes));
  EXPECT_EQ(proto.ir_version(), 7);
  EXPECT_EQ(proto.producer_name(), "dlbatch");
  ASSERT_EQ(proto.opset_import_size(), 1);
  EXPECT_EQ(proto.opset_import(0).version(), 13);
  const onnx::GraphProto& g = proto.graph();
  std::vector<std::string> ops;
  for (const onnx::NodeProto& node : g.node()) ops.push_back(node.op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{
                     "Sub", "Div", "Conv", "MaxPool", "Conv",
                     "BatchNormalization", "Relu", "AveragePool", "Flatten",
                     "Gemm", "LeakyRelu", "Identity", "Gemm", "Softmax"}));
  EXPECT_EQ(Ints(g.node(4), "pads"), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(Ints(g.node(3), "pads"), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(Ints(g.node(4), "kernel_shape"), (std::vector<int64_t>{4, 4}));
  ASSERT_EQ(g.input_size(), 1);
  EXPECT_EQ(g.input(0).name(), "images");
  const auto& in_dims = g.input(0).type().tensor_type().shape().dim();
  ASSERT_EQ(in_dims.size(), 4);
  EXPECT_EQ(in_dims[0].dim_param(), "N");
  EXPECT_EQ(in_dims[1].dim_value(), 3);
  EXPECT_EQ(in_dims[2].dim_value(), 16);
  EXPECT_EQ(in_dims[3].dim_value(), 14);
  ASSERT_EQ(g.output_size(), 1);
  EXPECT_EQ(g.output(0).name(), "probabilities");
  EXPECT_EQ(g.node(g.node_size() - 1).output(0), "probabilities");
  // Every parameter is an initializer, plus the normalisation's two.
  int64_t floats = 0;
  for (const onnx::TensorProto& t : g.initializer()) {
    floats += static_cast<int64_t>(t.raw_data().size() / sizeof(float));
  }
  EXPECT_EQ(floats,
            static_cast<int64_t>(model.params.size() + model.state.size() + 6));
}

TEST(OnnxExportTest, LeNetPassesCheckerAndMatchesTheNetwork) {
  if (!PythonHasOnnx()) {
    GTEST_SKIP() << kPython << " lacks the onnx or numpy module";
  }
  ExpectOnnxMatchesReference(LeNet(2), 4, 2);
}

// Global pooling, batchnorm on an fc's output (2-D), leakyrelu's default
// slope, batchnorm's default epsilon, no normalisation, and parameters
// found by network.h's order alone.
TEST(OnnxExportTest, GlobalPoolNetPassesCheckerAndMatchesTheNetwork) {
  if (!PythonHasOnnx()) {
    GTEST_SKIP() << kPython << " lacks the onnx or numpy module";
  }
  const ModelForExport model = TestNet({9, 7, 2})
                                   .Conv(5, 3, 2, 0, true)
                                   .BatchNorm(0)
                                   .Activation("leakyrelu")
                                   .GlobalAvgPool()
                                   .Fc(6)
                                   .BatchNorm(0)
                                   .Activation("relu")
                                   .Fc(3)
                                   .Softmax()
                                   .Finish(3, /*generic_names=*/true);
  ExpectOnnxMatchesReference(model, 3, 3);
}

// A network of graph layers built by Network::Build and run by the CPU
// backend: the exported model (Add, Concat, gelu's erf form, a residual
// taken from the input itself) computes what the trainer's forward pass
// does, in inference mode.
TEST(OnnxExportTest, GraphNetworkPassesCheckerAndMatchesTheCpuForward) {
  if (!PythonHasOnnx()) {
    GTEST_SKIP() << kPython << " lacks the onnx or numpy module";
  }
  auto layer = [](const std::string& type, const std::string& name,
                  std::vector<std::string> inputs, int filters = 0) {
    v1::LayerSpec l;
    l.set_type(type);
    l.set_name(name);
    for (auto& i : inputs) l.add_inputs(i);
    if (type == "conv") {
      l.set_filters(filters);
      l.set_size(3);
      l.set_padding_same(true);
    }
    if (type == "fc") l.set_units(filters);
    return l;
  };
  v1::NetworkSpec spec;
  for (int d : {6, 5, 2}) spec.add_input(d);
  for (const v1::LayerSpec& l : {
           layer("conv", "stem", {}, 2),
           layer("batchnorm", "bn", {}),
           layer("gelu", "g", {}),
           layer("add", "res", {"g", "input"}),  // [6, 5, 2] twice
           layer("conv", "branch", {"res"}, 3),
           layer("concat", "cat", {"res", "branch", "g"}),  // 7 channels
           layer("fc", "fc1", {}, 4),
           layer("gelu", "g2", {}),
           layer("fc", "fc2", {"fc1"}, 4),
           layer("add", "flat_sum", {"g2", "fc2"}),  // [N, 4] tensors
           layer("fc", "logits", {}, 3),
           layer("softmax", "", {}),
       }) {
    *spec.add_layers() = l;
  }
  auto backend = MakeCpuBackend(1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int n = 3;
  auto net = Network::Build(spec, backend->get(), n);
  ASSERT_TRUE(net.ok()) << net.status();
  (*net)->Initialize(8);
  // Batchnorm's running statistics away from 0 and 1, as after training.
  std::vector<float> state = {0.1f, -0.2f, 1.5f, 0.7f};
  ASSERT_EQ((*net)->state_size(), 4);
  (*backend)->CopyToDevice((*net)->state(), state.data(), 16);

  ModelForExport m;
  m.input = (*net)->input_shape();
  m.num_classes = (*net)->num_classes();
  m.layers = (*net)->layers();
  m.params_info = (*net)->params_info();
  m.state_info = (*net)->state_info();
  m.params.resize((*net)->num_params());
  (*backend)->CopyToHost(m.params.data(), (*net)->params(),
                         m.params.size() * 4);
  m.state = state;
  absl::StatusOr<std::string> bytes = ExportOnnx(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(*bytes));
  std::vector<std::string> ops;
  for (const onnx::NodeProto& node : proto.graph().node()) {
    ops.push_back(node.op_type());
  }
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Add"), 4);  // 2 + 2 in gelus
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Concat"), 1);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Erf"), 2);

  TempFiles files;
  const std::string model_path = files.Path("graph.onnx");
  const std::string input_path = files.Path("graph.in");
  const std::string output_path = files.Path("graph.out");
  WriteFile(model_path, *bytes);
  const Shape s = m.input;
  std::vector<float> nhwc(n * s.size()), nchw(n * s.size());
  Rng rng(Key(21, 1));
  for (float& v : nhwc) v = static_cast<float>(2 * rng.Uniform() - 1);
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < s.h; ++h) {
      for (int w = 0; w < s.w; ++w) {
        for (int c = 0; c < s.c; ++c) {
          nchw[((int64_t{i} * s.c + c) * s.h + h) * s.w + w] =
              nhwc[((int64_t{i} * s.h + h) * s.w + w) * s.c + c];
        }
      }
    }
  }
  WriteFile(input_path, std::string(reinterpret_cast<const char*>(nchw.data()),
                                    nchw.size() * sizeof(float)));
  std::string output;
  ASSERT_EQ(RunCommand(
                absl::StrCat(kPython, " ", DLBATCH_TEST_SOURCE_DIR,
                             "/onnx_eval.py ", model_path, " ", input_path, " ",
                             n, " ", s.c, " ", s.h, " ", s.w, " ", output_path),
                &output),
            0)
      << output;
  const std::string result = ReadFile(output_path);
  ASSERT_EQ(result.size(), n * 3 * sizeof(double)) << output;
  std::vector<double> onnx(n * 3);
  std::memcpy(onnx.data(), result.data(), result.size());

  Buffer images = *(*backend)->Allocate(nhwc.size() * 4);
  (*backend)->CopyToDevice(images.as<void>(), nhwc.data(), nhwc.size() * 4);
  (*net)->Forward(n, images.f32(), /*training=*/false);
  std::vector<float> probs(n * 3);
  (*backend)->CopyToHost(probs.data(), (*net)->probabilities(), n * 3 * 4);
  double max_p = 0;
  for (int i = 0; i < n * 3; ++i) {
    EXPECT_NEAR(onnx[i], probs[i], 1e-5) << i;
    max_p = std::max<double>(max_p, probs[i]);
  }
  EXPECT_LT(max_p, 0.999);  // far from saturation: the check could fail
}

TEST(OnnxExportTest, RefusesWhatItCannotExport) {
  ModelForExport bad_norm = LeNet(4);
  bad_norm.normalization.std.pop_back();
  EXPECT_TRUE(absl::StrContains(ExportOnnx(bad_norm).status().message(),
                                "for 3 channels"));

  ModelForExport short_params = LeNet(4);
  short_params.params.resize(short_params.params.size() - 1);
  absl::Status s = ExportOnnx(short_params).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "lies outside")) << s;

  ModelForExport unknown = LeNet(4);
  unknown.layers[6].spec.set_type("lstm");
  s = ExportOnnx(unknown).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(s.message(), "layers[6] (lstm 'fc_7')")) << s;

  ModelForExport no_softmax = LeNet(4);
  no_softmax.layers.pop_back();
  EXPECT_FALSE(ExportOnnx(no_softmax).ok());
}

}  // namespace
}  // namespace dlbatch::trainer
