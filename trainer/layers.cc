// What the layer families share: error messages, plans, the dispatch by
// type.
#include "trainer/layers.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dlbatch::trainer {

bool SyncsOverRanks(const v1::LayerSpec& spec,
                    const Communicator* communicator) {
  return communicator != nullptr && communicator->size() > 1 &&
         (spec.sync() || communicator->splits_batch());
}

bool SpansRanks(const v1::LayerSpec& spec, const Communicator* communicator,
                const Backend& backend) {
  return SyncsOverRanks(spec, communicator) && communicator->splits_batch() &&
         backend.batch_norm_spans_ranks();
}

absl::Status LayerContext::Error(absl::string_view message) const {
  return Error(absl::InvalidArgumentError(message));
}

absl::Status LayerContext::Error(const absl::Status& cause) const {
  return absl::Status(cause.code(),
                      absl::StrCat("layers[", index, "] (", spec->type(), " '",
                                   name, "'): ", cause.message()));
}

LayerPlan LayerContext::Plan() const {
  LayerPlan plan;
  plan.info.index = index;
  plan.info.name = name;
  plan.info.spec = *spec;
  plan.info.in = in;
  plan.info.ins = ins;
  plan.info.out = shape.out;
  plan.info.kh = shape.kh;
  plan.info.kw = shape.kw;
  plan.info.stride_h = shape.stride_h;
  plan.info.stride_w = shape.stride_w;
  plan.info.pad = shape.pad;
  return plan;
}

absl::StatusOr<LayerPlan> MakeLayer(const LayerContext& ctx) {
  const std::string& type = ctx.spec->type();
  if (type == "add" || type == "concat") return MakeJoinLayer(ctx);
  if (type == "conv") return MakeConvLayer(ctx);
  if (type == "fc") return MakeFcLayer(ctx);
  if (type == "maxpool" || type == "avgpool" || type == "globalavgpool") {
    return MakePoolLayer(ctx);
  }
  if (type == "batchnorm") return MakeBatchNormLayer(ctx);
  if (type == "relu" || type == "leakyrelu" || type == "gelu" ||
      type == "dropout" || type == "softmax") {
    return MakeElementwiseLayer(ctx);
  }
  return ctx.Error(absl::StrCat(
      "unknown layer type '", type,
      "'; expected conv, batchnorm, relu, leakyrelu, gelu, maxpool, avgpool, "
      "globalavgpool, fc, dropout, add, concat or softmax"));
}

}  // namespace dlbatch::trainer
