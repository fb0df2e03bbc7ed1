// ExportOnnx: the network as an ONNX graph (IR version 7, opset 13), one
// node per layer (plus a Flatten before an fc on a spatial input, and the
// normalisation's Sub/Div up front), every parameter an initializer in
// ONNX's layout. Tensors in the graph are NCHW, and [N, features] after an
// fc; the batch is the symbolic dimension "N". A layer takes the tensors of
// its LayerInfo::inputs: add is a chain of Add nodes, concat one Concat
// along the channels, gelu its erf form (opset 13 has no Gelu):
// Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5).
#include "trainer/output/onnx_export.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "trainer/output/onnx_subset.pb.h"

namespace dlbatch::trainer {
namespace {

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian; add a byte swap here");

constexpr int64_t kIrVersion = 7;  // the IR of ONNX 1.8, whose opset is 13
constexpr int64_t kOpsetVersion = 13;
constexpr float kDefaultEpsilon = 1e-5f;
constexpr float kDefaultLeakyAlpha = 0.01f;

// "layers[3] (conv 'conv_4')", as Network::Build names a layer.
std::string Where(const LayerInfo& layer) {
  return absl::StrCat("layers[", layer.index, "] (", layer.spec.type(), " '",
                      layer.name, "')");
}

// The tensor flowing between nodes: NCHW, or [N, features] after an fc.
struct Flow {
  std::string name;
  bool spatial = true;
  Shape shape;  // (h, w, c) of one sample; (1, 1, features) when flat
};

class GraphBuilder {
 public:
  explicit GraphBuilder(onnx::GraphProto* graph) : graph_(graph) {}

  // `base`, or `base` with a suffix if a tensor of that name exists.
  std::string Unique(const std::string& base) {
    std::string name = base;
    for (int i = 2; !names_.insert(name).second; ++i) {
      name = absl::StrCat(base, "_", i);
    }
    return name;
  }

  onnx::NodeProto* AddNode(const std::string& op_type, const std::string& name,
                           const std::vector<std::string>& inputs,
                           const std::string& output) {
    onnx::NodeProto* node = graph_->add_node();
    node->set_op_type(op_type);
    node->set_name(name);
    for (const std::string& in : inputs) node->add_input(in);
    node->add_output(output);
    return node;
  }

  std::string AddFloats(const std::string& base,
                        const std::vector<int64_t>& dims,
                        const std::vector<float>& values) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(Unique(base));
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    std::string* raw = t->mutable_raw_data();
    raw->resize(values.size() * sizeof(float));
    std::memcpy(raw->data(), values.data(), raw->size());
    return t->name();
  }

  std::string AddInt64s(const std::string& base,
                        const std::vector<int64_t>& values) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(Unique(base));
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
    return t->name();
  }

 private:
  onnx::GraphProto* graph_;
  std::set<std::string> names_;
};

void SetInts(onnx::NodeProto* node, const std::string& name,
             const std::vector<int64_t>& values) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void SetInt(onnx::NodeProto* node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void SetFloat(onnx::NodeProto* node, const std::string& name, float value) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

void SetWindow(const LayerInfo& layer, onnx::NodeProto* node) {
  SetInts(node, "kernel_shape", {layer.kh, layer.kw});
  SetInts(node, "strides", {layer.stride_h, layer.stride_w});
  // ONNX orders pads as all begins, then all ends: [top, left, bottom, right].
  SetInts(node, "pads",
          {layer.pad.top, layer.pad.left, layer.pad.bottom, layer.pad.right});
}

void SetTensorType(const std::vector<int64_t>& dims, onnx::ValueInfoProto* v) {
  onnx::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto* shape = t->mutable_shape();
  shape->add_dim()->set_dim_param("N");
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

// Reads a layer's parameter (or state) array from the host buffers.
class ParamReader {
 public:
  ParamReader(const std::vector<ParamInfo>& infos,
              const std::vector<float>& buffer, const char* buffer_name)
      : infos_(infos), buffer_(buffer), buffer_name_(buffer_name) {}

  // The array of `layer` (among `indices`, its params or state) whose name
  // ends in one of `suffixes`, else the one at `position` in `indices` (the
  // order network.h lists them in); it must hold `count` floats.
  absl::StatusOr<std::vector<float>> Read(
      const LayerInfo& layer, const std::vector<int>& indices,
      std::initializer_list<absl::string_view> suffixes, size_t position,
      int64_t count) const {
    int chosen = -1;
    for (int index : indices) {
      if (index < 0 || index >= static_cast<int>(infos_.size())) continue;
      for (absl::string_view suffix : suffixes) {
        if (absl::EndsWith(infos_[index].name, suffix)) chosen = index;
      }
    }
    if (chosen < 0 && position < indices.size()) chosen = indices[position];
    if (chosen < 0 || chosen >= static_cast<int>(infos_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(layer), ": no ", *suffixes.begin(), " array among its ",
          buffer_name_, " (", indices.size(), " listed)"));
    }
    const ParamInfo& info = infos_[chosen];
    if (info.count != count) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(layer), ": ", info.name, " has ", info.count,
                       " elements, expected ", count));
    }
    if (info.offset < 0 ||
        info.offset + info.count > static_cast<int64_t>(buffer_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(layer), ": ", info.name, " [", info.offset, ", +", info.count,
          ") lies outside the ", buffer_.size(), " floats of ", buffer_name_));
    }
    return std::vector<float>(buffer_.begin() + info.offset,
                              buffer_.begin() + info.offset + info.count);
  }

 private:
  const std::vector<ParamInfo>& infos_;
  const std::vector<float>& buffer_;
  const char* buffer_name_;
};

class Exporter {
 public:
  explicit Exporter(const ModelForExport& model)
      : model_(model),
        graph_(proto_.mutable_graph()),
        builder_(graph_),
        params_(model.params_info, model.params, "params"),
        state_(model.state_info, model.state, "state") {}

  absl::StatusOr<std::string> Run() {
    proto_.set_ir_version(kIrVersion);
    proto_.set_producer_name("dlbatch");
    proto_.set_model_version(1);
    onnx::OperatorSetIdProto* opset = proto_.add_opset_import();
    opset->set_domain("");
    opset->set_version(kOpsetVersion);
    graph_->set_name(model_.name.empty() ? "dlbatch" : model_.name);
    graph_->set_doc_string(
        "Input: images, NCHW, pixels scaled to [0, 1]. Output: class "
        "probabilities.");
    if (!model_.class_names.empty()) {
      onnx::StringStringEntryProto* entry = proto_.add_metadata_props();
      entry->set_key("class_names");
      // Folder names need not be UTF-8: bytes that are not become U+FFFD.
      entry->set_value(
          nlohmann::json(model_.class_names)
              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }

    const Shape& in = model_.input;
    if (in.h <= 0 || in.w <= 0 || in.c <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input shape ", in.ToString(), " is not positive"));
    }
    builder_.Unique("probabilities");  // reserved for the graph's output
    flow_ = {builder_.Unique("images"), true, in};
    SetTensorType({in.c, in.h, in.w}, graph_->add_input());
    graph_->mutable_input(0)->set_name(flow_.name);
    if (absl::Status s = AddNormalization(); !s.ok()) return s;

    if (model_.layers.empty() ||
        model_.layers.back().spec.type() != "softmax") {
      return absl::InvalidArgumentError(
          "the network must end with a softmax layer to export class "
          "probabilities");
    }
    const Flow input = flow_;
    for (size_t i = 0; i < model_.layers.size(); ++i) {
      const LayerInfo& layer = model_.layers[i];
      // Without inputs (a model described by hand): the previous layer's.
      std::vector<int> inputs = layer.inputs;
      if (inputs.empty()) inputs.push_back(static_cast<int>(i) - 1);
      std::vector<Flow> flows;
      for (int j : inputs) {
        if (j >= static_cast<int>(i)) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(layer), ": takes the output of layers[", j,
                           "], which comes after it"));
        }
        flows.push_back(j < 0 ? input : outputs_[j]);
      }
      flow_ = flows[0];
      const std::string& type = layer.spec.type();
      absl::Status s = type == "add" || type == "concat"
                           ? AddJoin(layer, std::move(flows))
                           : AddLayer(layer);
      if (!s.ok()) return s;
      outputs_.push_back(flow_);
    }
    if (flow_.shape.size() != model_.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the network yields ", flow_.shape.ToString(), " per sample, not ",
          model_.num_classes, " class probabilities"));
    }
    // The softmax is the last node: its output is the graph's.
    graph_->mutable_node(graph_->node_size() - 1)
        ->set_output(0, "probabilities");
    onnx::ValueInfoProto* out = graph_->add_output();
    out->set_name("probabilities");
    SetTensorType({model_.num_classes}, out);

    std::string bytes;
    if (!proto_.SerializeToString(&bytes)) {
      return absl::InternalError("serializing the ONNX model failed");
    }
    return bytes;
  }

 private:
  absl::Status AddNormalization() {
    const Normalization& norm = model_.normalization;
    if (norm.mean.empty() && norm.std.empty()) return absl::OkStatus();
    const int c = model_.input.c;
    if (static_cast<int>(norm.mean.size()) != c ||
        static_cast<int>(norm.std.size()) != c) {
      return absl::InvalidArgumentError(absl::StrCat(
          "normalization has ", norm.mean.size(), " means and ",
          norm.std.size(), " standard deviations for ", c, " channels"));
    }
    for (float s : norm.std) {
      if (!(s > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "normalization standard deviation ", s, " is not positive"));
      }
    }
    const std::string mean =
        builder_.AddFloats("normalization.mean", {1, c, 1, 1}, norm.mean);
    const std::string std =
        builder_.AddFloats("normalization.std", {1, c, 1, 1}, norm.std);
    const std::string centred = builder_.Unique("normalization.centred");
    builder_.AddNode("Sub", "normalization.sub", {flow_.name, mean}, centred);
    const std::string scaled = builder_.Unique("normalized");
    builder_.AddNode("Div", "normalization.div", {centred, std}, scaled);
    flow_.name = scaled;
    return absl::OkStatus();
  }

  // A flat [N, features] tensor back to NCHW [N, features, 1, 1].
  void MakeSpatial(const LayerInfo& layer) {
    if (flow_.spatial) return;
    const std::string shape =
        builder_.AddInt64s(layer.name + ".shape", {0, flow_.shape.c, 1, 1});
    const std::string out = builder_.Unique(layer.name + ".reshaped");
    builder_.AddNode("Reshape", layer.name + ".reshape", {flow_.name, shape},
                     out);
    flow_.name = out;
    flow_.spatial = true;
  }

  void MakeFlat(const LayerInfo& layer) {
    if (!flow_.spatial) return;
    const std::string out = builder_.Unique(layer.name + ".flat");
    SetInt(
        builder_.AddNode("Flatten", layer.name + ".flatten", {flow_.name}, out),
        "axis", 1);
    flow_.name = out;
    flow_.spatial = false;
  }

  // Adds `op_type` with inputs (the flow first), which becomes the flow.
  onnx::NodeProto* Node(const std::string& op_type, const LayerInfo& layer,
                        std::vector<std::string> inputs) {
    inputs.insert(inputs.begin(), flow_.name);
    const std::string out = builder_.Unique(layer.name);
    onnx::NodeProto* node = builder_.AddNode(op_type, layer.name, inputs, out);
    flow_.name = out;
    return node;
  }

  absl::Status AddLayer(const LayerInfo& layer) {
    const std::string& type = layer.spec.type();
    if (layer.in.size() != flow_.shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(layer), ": input ",
                                                     layer.in.ToString(),
                                                     " but the layer "
                                                     "before yields ",
                                                     flow_.shape.ToString()));
    }
    if (type == "conv") {
      if (absl::Status s = AddConv(layer); !s.ok()) return s;
    } else if (type == "fc") {
      if (absl::Status s = AddFc(layer); !s.ok()) return s;
    } else if (type == "batchnorm") {
      if (absl::Status s = AddBatchNorm(layer); !s.ok()) return s;
    } else if (type == "relu") {
      Node("Relu", layer, {});
    } else if (type == "leakyrelu") {
      const float alpha =
          layer.spec.alpha() != 0 ? layer.spec.alpha() : kDefaultLeakyAlpha;
      SetFloat(Node("LeakyRelu", layer, {}), "alpha", alpha);
    } else if (type == "maxpool" || type == "avgpool") {
      MakeSpatial(layer);
      onnx::NodeProto* node =
          Node(type == "maxpool" ? "MaxPool" : "AveragePool", layer, {});
      SetWindow(layer, node);
      if (type == "avgpool") SetInt(node, "count_include_pad", 0);
    } else if (type == "globalavgpool") {
      MakeSpatial(layer);
      Node("GlobalAveragePool", layer, {});
    } else if (type == "gelu") {
      AddGelu(layer);
    } else if (type == "dropout") {
      Node("Identity", layer, {});  // inference: dropout is the identity
    } else if (type == "softmax") {
      MakeFlat(layer);
      SetInt(Node("Softmax", layer, {}), "axis", 1);
    } else {
      return absl::UnimplementedError(
          absl::StrCat(Where(layer), ": no ONNX export for this layer type"));
    }
    flow_.shape = layer.out;
    return absl::OkStatus();
  }

  // x * (erf(x / sqrt 2) + 1) * 0.5, each constant a scalar initializer.
  void AddGelu(const LayerInfo& layer) {
    const std::string x = flow_.name;
    const std::string root2 =
        builder_.AddFloats(layer.name + ".sqrt2", {}, {1.41421356237f});
    const std::string one = builder_.AddFloats(layer.name + ".one", {}, {1});
    const std::string half =
        builder_.AddFloats(layer.name + ".half", {}, {0.5f});
    auto step = [&](const char* op, const std::string& suffix,
                    std::vector<std::string> inputs) {
      const std::string out = builder_.Unique(layer.name + "." + suffix);
      builder_.AddNode(op, out, inputs, out);
      return out;
    };
    const std::string scaled = step("Div", "scaled", {x, root2});
    const std::string erf = step("Erf", "erf", {scaled});
    const std::string shifted = step("Add", "shifted", {erf, one});
    const std::string product = step("Mul", "product", {x, shifted});
    flow_.name = product;
    Node("Mul", layer, {half});
  }

  // add and concat over `flows`, spatial ones all NCHW (a flat [N, c] one
  // is reshaped to [N, c, 1, 1] where another is spatial).
  absl::Status AddJoin(const LayerInfo& layer, std::vector<Flow> flows) {
    const bool spatial = std::any_of(flows.begin(), flows.end(),
                                     [](const Flow& f) { return f.spatial; });
    std::vector<std::string> names;
    for (Flow& f : flows) {
      flow_ = f;
      if (spatial) MakeSpatial(layer);
      names.push_back(flow_.name);
      if (layer.spec.type() == "add" ? f.shape != flows[0].shape
                                     : f.shape.h != flows[0].shape.h ||
                                           f.shape.w != flows[0].shape.w) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(layer), ": inputs ", flows[0].shape.ToString(),
                         " and ", f.shape.ToString(), " do not fit"));
      }
    }
    if (layer.spec.type() == "concat") {
      const std::string out = builder_.Unique(layer.name);
      SetInt(builder_.AddNode("Concat", layer.name, names, out), "axis", 1);
      flow_.name = out;
    } else {
      std::string sum = names[0];
      for (size_t k = 1; k < names.size(); ++k) {
        const std::string out = builder_.Unique(
            k + 1 == names.size() ? layer.name
                                  : absl::StrCat(layer.name, ".partial", k));
        builder_.AddNode("Add", out, {sum, names[k]}, out);
        sum = out;
      }
      flow_.name = sum;
    }
    flow_.spatial = spatial;
    flow_.shape = layer.out;
    return absl::OkStatus();
  }

  absl::Status AddConv(const LayerInfo& layer) {
    const Shape& in = layer.in;
    const int filters = layer.out.c;
    const int64_t per_filter = int64_t{layer.kh} * layer.kw * in.c;
    absl::StatusOr<std::vector<float>> w =
        params_.Read(layer, layer.params, {".weight"}, 0, filters * per_filter);
    if (!w.ok()) return w.status();
    absl::StatusOr<std::vector<float>> b =
        params_.Read(layer, layer.params, {".bias"}, 1, filters);
    if (!b.ok()) return b.status();
    // OHWI -> OIHW.
    std::vector<float> oihw(w->size());
    for (int o = 0; o < filters; ++o) {
      for (int y = 0; y < layer.kh; ++y) {
        for (int x = 0; x < layer.kw; ++x) {
          for (int i = 0; i < in.c; ++i) {
            oihw[((int64_t{o} * in.c + i) * layer.kh + y) * layer.kw + x] =
                (*w)[((int64_t{o} * layer.kh + y) * layer.kw + x) * in.c + i];
          }
        }
      }
    }
    MakeSpatial(layer);
    const std::string wn = builder_.AddFloats(
        layer.name + ".weight", {filters, in.c, layer.kh, layer.kw}, oihw);
    const std::string bn =
        builder_.AddFloats(layer.name + ".bias", {filters}, *b);
    SetWindow(layer, Node("Conv", layer, {wn, bn}));
    return absl::OkStatus();
  }

  absl::Status AddFc(const LayerInfo& layer) {
    const Shape& in = layer.in;
    const int units = static_cast<int>(layer.out.size());
    absl::StatusOr<std::vector<float>> w = params_.Read(
        layer, layer.params, {".weight"}, 0, int64_t{units} * in.size());
    if (!w.ok()) return w.status();
    absl::StatusOr<std::vector<float>> b =
        params_.Read(layer, layer.params, {".bias"}, 1, units);
    if (!b.ok()) return b.status();
    std::vector<float> weight = std::move(*w);
    if (flow_.spatial && in.h * in.w > 1) {
      // Columns in NHWC order (h, w, c) -> Flatten's NCHW order (c, h, w).
      std::vector<float> permuted(weight.size());
      const int64_t n = in.size();
      for (int u = 0; u < units; ++u) {
        for (int y = 0; y < in.h; ++y) {
          for (int x = 0; x < in.w; ++x) {
            for (int c = 0; c < in.c; ++c) {
              permuted[u * n + (int64_t{c} * in.h + y) * in.w + x] =
                  weight[u * n + (int64_t{y} * in.w + x) * in.c + c];
            }
          }
        }
      }
      weight = std::move(permuted);
    }
    MakeFlat(layer);
    const std::string wn =
        builder_.AddFloats(layer.name + ".weight", {units, in.size()}, weight);
    const std::string bn =
        builder_.AddFloats(layer.name + ".bias", {units}, *b);
    SetInt(Node("Gemm", layer, {wn, bn}), "transB", 1);
    return absl::OkStatus();
  }

  absl::Status AddBatchNorm(const LayerInfo& layer) {
    const int c = layer.in.c;
    absl::StatusOr<std::vector<float>> scale =
        params_.Read(layer, layer.params, {".scale", ".gamma"}, 0, c);
    if (!scale.ok()) return scale.status();
    absl::StatusOr<std::vector<float>> offset =
        params_.Read(layer, layer.params, {".offset", ".beta", ".bias"}, 1, c);
    if (!offset.ok()) return offset.status();
    absl::StatusOr<std::vector<float>> mean =
        state_.Read(layer, layer.state, {".running_mean", ".mean"}, 0, c);
    if (!mean.ok()) return mean.status();
    absl::StatusOr<std::vector<float>> var = state_.Read(
        layer, layer.state, {".running_var", ".var", ".variance"}, 1, c);
    if (!var.ok()) return var.status();
    const std::string s =
        builder_.AddFloats(layer.name + ".scale", {c}, *scale);
    const std::string o =
        builder_.AddFloats(layer.name + ".offset", {c}, *offset);
    const std::string m =
        builder_.AddFloats(layer.name + ".running_mean", {c}, *mean);
    const std::string v =
        builder_.AddFloats(layer.name + ".running_var", {c}, *var);
    const float epsilon =
        layer.spec.epsilon() != 0 ? layer.spec.epsilon() : kDefaultEpsilon;
    SetFloat(Node("BatchNormalization", layer, {s, o, m, v}), "epsilon",
             epsilon);
    return absl::OkStatus();
  }

  const ModelForExport& model_;
  onnx::ModelProto proto_;
  onnx::GraphProto* graph_;
  GraphBuilder builder_;
  ParamReader params_, state_;
  Flow flow_;
  std::vector<Flow> outputs_;  // per layer, its output's tensor
};

}  // namespace

absl::StatusOr<std::string> ExportOnnx(const ModelForExport& model) {
  return Exporter(model).Run();
}

}  // namespace dlbatch::trainer
