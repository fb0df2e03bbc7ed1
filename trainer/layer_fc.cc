// fc: fully connected over a sample's NHWC elements, flattened; weights
// [units, in] and a bias per unit. Output (1, 1, units).
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

class FcLayer final : public Layer {
 public:
  explicit FcLayer(std::unique_ptr<FcKernel> kernel)
      : kernel_(std::move(kernel)) {}

  void Forward(int n, const float* x, float* y, bool /*training*/,
               uint64_t /*dropout_seed*/) override {
    kernel_->Forward(n, x, buffers_.params[0], buffers_.params[1], y);
  }

  void Backward(int n, const float* x, const float* /*y*/, const float* dy,
                float* dx) override {
    kernel_->BackwardWeights(n, x, dy, buffers_.grads[0], buffers_.grads[1]);
    if (dx != nullptr) kernel_->BackwardData(n, dy, buffers_.params[0], dx);
  }

 private:
  std::unique_ptr<FcKernel> kernel_;
};

}  // namespace

absl::StatusOr<LayerPlan> MakeFcLayer(const LayerContext& ctx) {
  const v1::LayerSpec& spec = *ctx.spec;
  if (spec.units() <= 0) {
    return ctx.Error(absl::StrCat("units must be > 0, not ", spec.units()));
  }
  LayerPlan plan = ctx.Plan();
  plan.info.out = Shape{1, 1, spec.units()};

  FcDesc desc;
  desc.in = ctx.in.size();
  desc.units = spec.units();
  auto kernel = ctx.backend->MakeFc(desc, ctx.max_batch);
  if (!kernel.ok()) return ctx.Error(kernel.status().message());
  plan.layer = std::make_unique<FcLayer>(*std::move(kernel));

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
