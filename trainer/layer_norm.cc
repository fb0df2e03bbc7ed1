// batchnorm: per-channel batch normalisation with a learnt scale and
// offset; running statistics (state) move with momentum 0.1.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

// running = 0.9 * running + 0.1 * batch, as PyTorch and Caffe2 default.
constexpr float kMomentum = 0.1f;
constexpr float kDefaultEpsilon = 1e-5f;

class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(std::unique_ptr<BatchNormKernel> kernel, Buffer saved)
      : kernel_(std::move(kernel)), saved_(std::move(saved)) {}

  void Forward(int n, const float* x, float* y, bool training,
               uint64_t /*dropout_seed*/) override {
    const float* gamma = buffers_.params[0];
    const float* beta = buffers_.params[1];
    float* running_mean = buffers_.state[0];
    float* running_var = buffers_.state[1];
    if (training) {
      kernel_->ForwardTraining(n, x, gamma, beta, y, SavedMean(), SavedVar(),
                               running_mean, running_var, kMomentum);
    } else {
      kernel_->ForwardInference(n, x, gamma, beta, running_mean, running_var,
                                y);
    }
  }

  void Backward(int n, const float* x, const float* /*y*/, const float* dy,
                float* dx) override {
    kernel_->Backward(n, x, dy, buffers_.params[0], SavedMean(), SavedVar(), dx,
                      buffers_.grads[0], buffers_.grads[1]);
  }

  bool can_skip_dx() const override { return false; }

 private:
  float* SavedMean() const { return saved_.f32(); }
  float* SavedVar() const {
    return saved_.f32() + saved_.bytes() / sizeof(float) / 2;
  }

  std::unique_ptr<BatchNormKernel> kernel_;
  Buffer saved_;  // this batch's mean, then its variance
};

}  // namespace

absl::StatusOr<LayerPlan> MakeBatchNormLayer(const LayerContext& ctx) {
  const v1::LayerSpec& spec = *ctx.spec;
  if (spec.epsilon() < 0) {
    return ctx.Error(
        absl::StrCat("epsilon must be >= 0, not ", spec.epsilon()));
  }
  LayerPlan plan = ctx.Plan();
  plan.info.out = ctx.in;

  BatchNormDesc desc;
  desc.in = ctx.in;
  desc.epsilon = spec.epsilon() > 0 ? spec.epsilon() : kDefaultEpsilon;
  auto kernel = ctx.backend->MakeBatchNorm(desc, ctx.max_batch);
  if (!kernel.ok()) return ctx.Error(kernel.status().message());
  auto saved = ctx.backend->Allocate(2 * ctx.in.c * sizeof(float));
  if (!saved.ok()) return ctx.Error(saved.status().message());
  plan.layer =
      std::make_unique<BatchNormLayer>(*std::move(kernel), *std::move(saved));

  const int64_t c = ctx.in.c;
  ParamRequest scale{"scale", {c}, false, ParamInit::kOnes, 0, 0};
  ParamRequest offset{"offset", {c}, false, ParamInit::kZeros, 0, 0};
  plan.params = {scale, offset};
  ParamRequest mean{"running_mean", {c}, false, ParamInit::kZeros, 0, 0};
  ParamRequest var{"running_var", {c}, false, ParamInit::kOnes, 0, 0};
  plan.state = {mean, var};
  return plan;
}

}  // namespace dlbatch::trainer
