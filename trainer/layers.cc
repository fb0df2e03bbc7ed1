// What the layer families share: error messages, windows, the dispatch by
// type.
#include "trainer/layers.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
  return plan;
}

void SamePadding(int in, int k, int stride, int* before, int* after, int* out) {
  *out = (in + stride - 1) / stride;
  const int total = std::max((*out - 1) * stride + k - in, 0);
  *before = total / 2;
  *after = total - *before;
}

absl::StatusOr<Window> ResolveWindow(const LayerContext& ctx,
                                     int default_stride) {
  const v1::LayerSpec& spec = *ctx.spec;
  if (spec.size() <= 0) {
    return ctx.Error(absl::StrCat("size must be > 0, not ", spec.size()));
  }
  if (spec.stride() < 0) {
    return ctx.Error(absl::StrCat("stride must be >= 0, not ", spec.stride(),
                                  " (0: the default)"));
  }
  if (spec.padding() < 0) {
    return ctx.Error(
        absl::StrCat("padding must be >= 0, not ", spec.padding()));
  }
  if (spec.padding_same() && spec.padding() > 0) {
    return ctx.Error("give either padding or padding_same, not both");
  }
  Window win;
  win.kh = win.kw = spec.size();
  win.stride_h = win.stride_w =
      spec.stride() > 0 ? spec.stride() : default_stride;
  win.out.c = ctx.in.c;
  if (spec.padding_same()) {
    SamePadding(ctx.in.h, win.kh, win.stride_h, &win.pad.top, &win.pad.bottom,
                &win.out.h);
    SamePadding(ctx.in.w, win.kw, win.stride_w, &win.pad.left, &win.pad.right,
                &win.out.w);
    return win;
  }
  const int p = spec.padding();
  win.pad = Padding{p, p, p, p};
  const int padded_h = ctx.in.h + 2 * p, padded_w = ctx.in.w + 2 * p;
  if (win.kh > padded_h || win.kw > padded_w) {
    return ctx.Error(absl::StrCat(
        "window [", win.kh, ", ", win.kw, "] is larger than its input ",
        ctx.in.ToString(), " padded to [", padded_h, ", ", padded_w,
        "]; use a smaller size, padding or padding_same"));
  }
  win.out.h = (padded_h - win.kh) / win.stride_h + 1;
  win.out.w = (padded_w - win.kw) / win.stride_w + 1;
  return win;
}

absl::StatusOr<LayerPlan> MakeLayer(const LayerContext& ctx) {
  const std::string& type = ctx.spec->type();
  const bool joins = type == "add" || type == "concat";
  if (!joins && ctx.ins.size() != 1) {
    return ctx.Error(
        absl::StrCat("takes one input, not ", ctx.ins.size(), " (",
                     absl::StrJoin(ctx.in_names, ", "),
                     "); join them first with an add or concat layer"));
  }
  if (joins) return MakeJoinLayer(ctx);
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
