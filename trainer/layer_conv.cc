// conv: a 2-D convolution with OHWI weights and a bias per filter.
#include <memory>
#include <utility>

#include "trainer/layers.h"

namespace dlbatch::trainer {

absl::StatusOr<LayerPlan> MakeConvLayer(const LayerContext& ctx) {
  const v1::LayerSpec& spec = *ctx.spec;
  const LayerShape& win = ctx.shape;
  LayerPlan plan = ctx.Plan();

  ConvDesc desc;
  desc.in = ctx.in;
  desc.filters = spec.filters();
  desc.kh = win.kh;
  desc.kw = win.kw;
  desc.stride_h = win.stride_h;
  desc.stride_w = win.stride_w;
  desc.pad = win.pad;
  desc.out = win.out;
  desc.bf16_out = ctx.bf16_output;
  desc.bf16_in = ctx.bf16_input;
  desc.input_grad = ctx.input_grad;
  plan.bf16_output = desc.bf16_out;
  auto kernel = ctx.backend->MakeConv(desc, ctx.max_batch);
  if (!kernel.ok()) return ctx.Error(kernel.status());
  plan.layer = std::make_unique<WeightedLayer<ConvKernel>>(*std::move(kernel));

  const int64_t window = int64_t{win.kh} * win.kw;
  ParamRequest weight;
  weight.suffix = "weight";
  weight.dims = {spec.filters(), win.kh, win.kw, ctx.in.c};
  weight.decayed = true;
  weight.init = ParamInit::kGlorotUniform;
  weight.fan_in = window * ctx.in.c;
  weight.fan_out = window * spec.filters();
  ParamRequest bias;
  bias.suffix = "bias";
  bias.dims = {spec.filters()};
  plan.params = {weight, bias};
  return plan;
}

}  // namespace dlbatch::trainer
