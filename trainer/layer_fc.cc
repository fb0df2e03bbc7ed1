// fc: fully connected over a sample's NHWC elements, flattened; weights
// [units, in] and a bias per unit. Output (1, 1, units).
#include <memory>
#include <utility>

#include "trainer/layers.h"

namespace dlbatch::trainer {

absl::StatusOr<LayerPlan> MakeFcLayer(const LayerContext& ctx) {
  const v1::LayerSpec& spec = *ctx.spec;
  LayerPlan plan = ctx.Plan();

  FcDesc desc;
  desc.in = ctx.in.size();
  desc.units = spec.units();
  auto kernel = ctx.backend->MakeFc(desc, ctx.max_batch);
  if (!kernel.ok()) return ctx.Error(kernel.status());
  plan.layer = std::make_unique<WeightedLayer<FcKernel>>(*std::move(kernel));

  ParamRequest weight;
  weight.suffix = "weight";
  weight.dims = {spec.units(), desc.in};
  weight.decayed = true;
  weight.init = ParamInit::kGlorotUniform;
  weight.fan_in = desc.in;
  weight.fan_out = spec.units();
  ParamRequest bias;
  bias.suffix = "bias";
  bias.dims = {spec.units()};
  plan.params = {weight, bias};
  return plan;
}

}  // namespace dlbatch::trainer
