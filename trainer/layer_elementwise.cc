// relu, leakyrelu (alpha, default 0.01), gelu (exact), dropout (probability,
// default 0.5; inverted, so inference is the identity) and softmax (the last
// layer; its gradient together with the cross-entropy is the network's, in
// Backward).
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

constexpr float kDefaultLeakyAlpha = 0.01f;
constexpr float kDefaultDropout = 0.5f;

class ActivationLayer final : public OneInputLayer {
 public:
  ActivationLayer(Backend* backend, ActivationDesc desc, int64_t sample_size)
      : backend_(backend), desc_(desc), sample_size_(sample_size) {}

  void Forward(int n, const float* x, float* y, bool /*training*/,
               uint64_t /*dropout_salt*/) override {
    backend_->ActivationForward(desc_, n * sample_size_, x, y);
  }
  void Backward(int n, const float* x, const float* /*y*/, const float* dy,
                float* dx) override {
    if (dx == nullptr) return;
    backend_->ActivationBackward(desc_, n * sample_size_, x, dy, dx);
  }

 private:
  Backend* backend_;
  ActivationDesc desc_;
  int64_t sample_size_;
};

class DropoutLayer final : public OneInputLayer {
 public:
  DropoutLayer(Backend* backend, float p, int64_t sample_size, Buffer mask)
      : backend_(backend),
        p_(p),
        sample_size_(sample_size),
        mask_(std::move(mask)) {}

  void Forward(int n, const float* x, float* y, bool training,
               uint64_t dropout_salt) override {
    const int64_t count = n * sample_size_;
    if (training) {
      backend_->DropoutForward(p_, dropout_salt, count, x, mask_.f32(), y);
    } else {
      backend_->CopyOnDevice(y, x, count * sizeof(float));
    }
  }
  void Backward(int n, const float* /*x*/, const float* /*y*/, const float* dy,
                float* dx) override {
    if (dx == nullptr) return;
    backend_->Multiply(n * sample_size_, dy, mask_.f32(), dx);
  }

 private:
  Backend* backend_;
  float p_;
  int64_t sample_size_;
  Buffer mask_;
};

class SoftmaxLayer final : public OneInputLayer {
 public:
  SoftmaxLayer(Backend* backend, int classes, Buffer scratch)
      : backend_(backend), classes_(classes), scratch_(std::move(scratch)) {}

  // Softmax through the backend's softmax cross-entropy against labels of
  // 0, whose statistics go to a scratch buffer nobody reads.
  void Forward(int n, const float* x, float* y, bool /*training*/,
               uint64_t /*dropout_salt*/) override {
    backend_->SoftmaxCrossEntropy(n, classes_, x, scratch_.as<int32_t>() + 2,
                                  /*smoothing=*/0, y, scratch_.f32());
  }
  // The network computes softmax's and the loss's gradient in one.
  void Backward(int, const float*, const float*, const float*,
                float*) override {}

 private:
  Backend* backend_;
  int classes_;
  Buffer scratch_;  // float stats[2], then int32 zero labels[max_batch]
};

}  // namespace

absl::StatusOr<LayerPlan> MakeElementwiseLayer(const LayerContext& ctx) {
  const v1::LayerSpec& spec = *ctx.spec;
  const std::string& type = spec.type();
  LayerPlan plan = ctx.Plan();
  const int64_t sample = ctx.in.size();
  if (type == "relu" || type == "leakyrelu" || type == "gelu") {
    ActivationDesc desc;
    if (type == "leakyrelu") {
      desc.alpha = spec.alpha() != 0 ? spec.alpha() : kDefaultLeakyAlpha;
    }
    if (type == "gelu") desc.kind = ActivationKind::kGelu;
    plan.layer = std::make_unique<ActivationLayer>(ctx.backend, desc, sample);
  } else if (type == "dropout") {
    const float p =
        spec.probability() != 0 ? spec.probability() : kDefaultDropout;
    if (!(p >= 0 && p < 1)) {
      return ctx.Error(absl::StrCat("probability must be in [0, 1), not ",
                                    spec.probability()));
    }
    auto mask = ctx.backend->Allocate(ctx.max_batch * sample * sizeof(float));
    if (!mask.ok()) return ctx.Error(mask.status());
    plan.layer = std::make_unique<DropoutLayer>(ctx.backend, p, sample,
                                                *std::move(mask));
  } else {  // softmax, of [1, 1, classes] (InferLayerShape)
    auto scratch = ctx.backend->Allocate((2 + ctx.max_batch) * 4);
    if (!scratch.ok()) return ctx.Error(scratch.status());
    plan.layer = std::make_unique<SoftmaxLayer>(ctx.backend, ctx.in.c,
                                                *std::move(scratch));
  }
  return plan;
}

}  // namespace dlbatch::trainer
