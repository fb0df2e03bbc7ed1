#include "proto/network_shapes.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace dlbatch {
namespace {

constexpr int64_t kMaxDim = std::numeric_limits<int>::max();

absl::Status Refuse(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// "'a' [8, 8, 16], 'b' [8, 8, 32]"
std::string DescribeInputs(absl::Span<const SampleShape> ins,
                           absl::Span<const std::string> in_names) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ins.size(); ++i) {
    parts.push_back(absl::StrCat("'", i < in_names.size() ? in_names[i] : "",
                                 "' ", ins[i].ToString()));
  }
  return absl::StrJoin(parts, ", ");
}

// Sizes are int32 in the spec; sums and products of them are taken in
// int64 and must come back within an int, or the layer is refused.
absl::Status TooLarge(absl::string_view what, int64_t value) {
  return Refuse(absl::StrCat(what, " would be ", value, ", beyond ", kMaxDim,
                             "; use a smaller size, stride or padding"));
}

// `same` padding of one dimension, in int64 (a window or stride near the
// int limit must not overflow).
void SamePadding64(int64_t in, int64_t k, int64_t stride, int64_t* before,
                   int64_t* after, int64_t* out) {
  *out = (in + stride - 1) / stride;
  const int64_t total = std::max((*out - 1) * stride + k - in, int64_t{0});
  *before = total / 2;
  *after = total - *before;
}

// The window of a conv or pooling layer (stride 0: `default_stride`)
// against `in`; out.c is the input's channels.
absl::StatusOr<LayerShape> ResolveWindow(const v1::LayerSpec& layer,
                                         const SampleShape& in,
                                         int default_stride) {
  if (layer.size() <= 0) {
    return Refuse(absl::StrCat("size must be > 0, not ", layer.size()));
  }
  if (layer.stride() < 0) {
    return Refuse(absl::StrCat("stride must be >= 0, not ", layer.stride(),
                               " (0: the default)"));
  }
  if (layer.padding() < 0) {
    return Refuse(absl::StrCat("padding must be >= 0, not ", layer.padding()));
  }
  if (layer.padding_same() && layer.padding() > 0) {
    return Refuse("give either a padding or padding `same`, not both");
  }
  LayerShape s;
  s.kh = s.kw = layer.size();
  s.stride_h = s.stride_w =
      layer.stride() > 0 ? layer.stride() : default_stride;
  s.out.c = in.c;
  int64_t out_h = 0, out_w = 0;
  int64_t top = 0, bottom = 0, left = 0, right = 0;
  if (layer.padding_same()) {
    SamePadding64(in.h, s.kh, s.stride_h, &top, &bottom, &out_h);
    SamePadding64(in.w, s.kw, s.stride_w, &left, &right, &out_w);
    if (std::max({top, bottom, left, right}) > kMaxDim) {
      return TooLarge("padding `same`", std::max({top, bottom, left, right}));
    }
  } else {
    const int64_t p = layer.padding();
    top = bottom = left = right = p;
    const int64_t padded_h = in.h + 2 * p, padded_w = in.w + 2 * p;
    if (s.kh > padded_h || s.kw > padded_w) {
      return Refuse(absl::StrCat(
          "window [", s.kh, ", ", s.kw, "] is larger than its input ",
          in.ToString(), " padded to [", padded_h, ", ", padded_w,
          "]; use a smaller size, padding or padding: same",
          in.h == 1 && in.w == 1
              ? " (an input of [1, 1, N] is what fc and globalavgpool "
                "layers make: put conv and pooling layers before them)"
              : ""));
    }
    out_h = (padded_h - s.kh) / s.stride_h + 1;
    out_w = (padded_w - s.kw) / s.stride_w + 1;
  }
  if (std::max(out_h, out_w) > kMaxDim) {
    return TooLarge("the output's height or width", std::max(out_h, out_w));
  }
  s.pad = WindowPadding{static_cast<int>(top), static_cast<int>(left),
                        static_cast<int>(bottom), static_cast<int>(right)};
  s.out.h = static_cast<int>(out_h);
  s.out.w = static_cast<int>(out_w);
  return s;
}

absl::StatusOr<LayerShape> JoinShape(const v1::LayerSpec& layer,
                                     absl::Span<const SampleShape> ins,
                                     absl::Span<const std::string> in_names) {
  if (ins.size() < 2) {
    return Refuse(absl::StrCat("joins two or more outputs, got ", ins.size(),
                               "; name them in inputs: [a, b]"));
  }
  LayerShape s;
  if (layer.type() == "add") {
    for (const SampleShape& in : ins) {
      if (in != ins[0]) {
        return Refuse(absl::StrCat(
            "adds inputs of one shape, got ", DescribeInputs(ins, in_names),
            "; make them agree (a 1x1 conv with stride can match channels "
            "and size)"));
      }
    }
    s.out = ins[0];
    return s;
  }
  int64_t channels = 0;
  for (const SampleShape& in : ins) {
    if (in.h != ins[0].h || in.w != ins[0].w) {
      return Refuse(absl::StrCat(
          "concatenates channels of inputs of one height and width, got ",
          DescribeInputs(ins, in_names)));
    }
    channels += in.c;
  }
  if (channels > kMaxDim) return TooLarge("the channels joined", channels);
  s.out = SampleShape{ins[0].h, ins[0].w, static_cast<int>(channels)};
  return s;
}

}  // namespace

void SamePadding(int in, int k, int stride, int* before, int* after, int* out) {
  int64_t b = 0, a = 0, o = 0;
  SamePadding64(in, k, stride, &b, &a, &o);
  *before = static_cast<int>(b);
  *after = static_cast<int>(a);
  *out = static_cast<int>(o);
}

absl::StatusOr<LayerShape> InferLayerShape(
    const v1::LayerSpec& layer, absl::Span<const SampleShape> ins,
    absl::Span<const std::string> in_names) {
  const std::string& type = layer.type();
  if (type == "add" || type == "concat") {
    return JoinShape(layer, ins, in_names);
  }
  if (ins.size() != 1) {
    return Refuse(
        absl::StrCat("takes one input, not ", ins.size(), " (",
                     absl::StrJoin(in_names, ", "),
                     "); join them first with an add or concat layer"));
  }
  const SampleShape& in = ins[0];
  LayerShape s;
  s.out = in;
  if (type == "conv") {
    if (layer.filters() <= 0) {
      return Refuse(absl::StrCat("filters must be > 0, not ", layer.filters()));
    }
    absl::StatusOr<LayerShape> window =
        ResolveWindow(layer, in, /*default_stride=*/1);
    if (window.ok()) window->out.c = layer.filters();
    return window;
  }
  if (type == "maxpool" || type == "avgpool") {
    return ResolveWindow(layer, in, /*default_stride=*/layer.size());
  }
  if (type == "globalavgpool") {
    s.kh = in.h;
    s.kw = in.w;
    s.out = SampleShape{1, 1, in.c};
    return s;
  }
  if (type == "fc") {
    if (layer.units() <= 0) {
      return Refuse(absl::StrCat("units must be > 0, not ", layer.units()));
    }
    s.out = SampleShape{1, 1, layer.units()};
    return s;
  }
  if (type == "softmax") {
    if (in.h != 1 || in.w != 1) {
      return Refuse(absl::StrCat(
          "input ", in.ToString(),
          " must be [1, 1, classes] (the output of an fc or globalavgpool "
          "layer); got [",
          in.h, ", ", in.w, "] positions"));
    }
    return s;
  }
  if (type == "batchnorm" || type == "relu" || type == "leakyrelu" ||
      type == "gelu" || type == "dropout") {
    return s;
  }
  return Refuse(absl::StrCat(
      "unknown layer type '", type,
      "'; expected conv, batchnorm, relu, leakyrelu, gelu, maxpool, avgpool, "
      "globalavgpool, fc, dropout, add, concat or softmax"));
}

absl::StatusOr<std::vector<LayerShape>> InferNetworkShapes(
    const v1::NetworkSpec& spec, const NetworkWiring& wiring) {
  if (spec.input_size() != 3 ||
      std::any_of(spec.input().begin(), spec.input().end(),
                  [](int32_t x) { return x <= 0; })) {
    return Refuse(
        absl::StrCat("input: must be [height, width, channels], all > 0; got [",
                     absl::StrJoin(spec.input(), ", "), "]"));
  }
  const int count = spec.layers_size();
  if (count == 0) {
    return Refuse("layers: the network has no layers; add at least one");
  }
  auto error = [&](int i, absl::string_view message) {
    return Refuse(absl::StrCat(DescribeLayer(spec, wiring, i), ": ", message));
  };
  if (spec.layers(count - 1).type() != "softmax") {
    return error(count - 1,
                 "the last layer must be softmax (after an fc layer with one "
                 "unit per class); add `- softmax` after it");
  }
  const SampleShape input{spec.input(0), spec.input(1), spec.input(2)};
  std::vector<LayerShape> shapes;
  shapes.reserve(count);
  for (int i = 0; i < count; ++i) {
    if (spec.layers(i).type() == "softmax" && i + 1 != count) {
      return error(i, "softmax must be the last layer");
    }
    std::vector<SampleShape> ins;
    std::vector<std::string> names;
    for (int j : wiring.inputs[i]) {
      ins.push_back(j < 0 ? input : shapes[j].out);
      names.push_back(j < 0 ? kNetworkInputName : wiring.names[j]);
    }
    absl::StatusOr<LayerShape> shape =
        InferLayerShape(spec.layers(i), ins, names);
    if (!shape.ok()) return error(i, shape.status().message());
    shapes.push_back(*shape);
  }
  return shapes;
}

}  // namespace dlbatch
