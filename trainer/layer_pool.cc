// maxpool, avgpool (padding excluded from the average) and globalavgpool (a
// window of the whole input, output (1, 1, c)).
#include <memory>
#include <utility>

#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

class PoolLayer final : public OneInputLayer {
 public:
  PoolLayer(std::unique_ptr<PoolKernel> kernel, Buffer workspace)
      : kernel_(std::move(kernel)), workspace_(std::move(workspace)) {}

  void Forward(int n, const float* x, float* y, bool training,
               uint64_t /*dropout_salt*/) override {
    kernel_->Forward(n, x, y, training ? workspace_.as<void>() : nullptr);
  }

  void Backward(int n, const float* x, const float* y, const float* dy,
                float* dx) override {
    if (dx == nullptr) return;  // nothing to learn here
    kernel_->Backward(n, x, y, dy, workspace_.as<void>(), dx);
  }

 private:
  std::unique_ptr<PoolKernel> kernel_;
  Buffer workspace_;
};

}  // namespace

absl::StatusOr<LayerPlan> MakePoolLayer(const LayerContext& ctx) {
  const LayerShape& win = ctx.shape;  // globalavgpool: the whole input
  LayerPlan plan = ctx.Plan();
  PoolDesc desc;
  desc.in = ctx.in;
  desc.kind =
      ctx.spec->type() == "maxpool" ? PoolKind::kMax : PoolKind::kAverage;
  desc.kh = win.kh;
  desc.kw = win.kw;
  desc.stride_h = win.stride_h;
  desc.stride_w = win.stride_w;
  desc.pad = win.pad;
  desc.out = win.out;

  auto kernel = ctx.backend->MakePool(desc, ctx.max_batch);
  if (!kernel.ok()) return ctx.Error(kernel.status());
  Buffer workspace;
  if (const size_t bytes = (*kernel)->WorkspaceBytes(ctx.max_batch);
      bytes > 0) {
    auto buffer = ctx.backend->Allocate(bytes);
    if (!buffer.ok()) return ctx.Error(buffer.status());
    workspace = *std::move(buffer);
  }
  plan.layer =
      std::make_unique<PoolLayer>(*std::move(kernel), std::move(workspace));
  return plan;
}

}  // namespace dlbatch::trainer
