// maxpool, avgpool (padding excluded from the average) and globalavgpool (a
// window of the whole input, output (1, 1, c)).
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
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
  const v1::LayerSpec& spec = *ctx.spec;
  LayerPlan plan = ctx.Plan();
  PoolDesc desc;
  desc.in = ctx.in;
  if (spec.type() == "globalavgpool") {
    desc.kind = PoolKind::kAverage;
    desc.kh = ctx.in.h;
    desc.kw = ctx.in.w;
    desc.out = Shape{1, 1, ctx.in.c};
  } else {
    absl::StatusOr<Window> win = ResolveWindow(ctx, spec.size());
    if (!win.ok()) return win.status();
    desc.kind = spec.type() == "maxpool" ? PoolKind::kMax : PoolKind::kAverage;
    desc.kh = win->kh;
    desc.kw = win->kw;
    desc.stride_h = win->stride_h;
    desc.stride_w = win->stride_w;
    desc.pad = win->pad;
    desc.out = win->out;
  }
  plan.info.out = desc.out;
  plan.info.kh = desc.kh;
  plan.info.kw = desc.kw;
  plan.info.stride_h = desc.stride_h;
  plan.info.stride_w = desc.stride_w;
  plan.info.pad = desc.pad;

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
