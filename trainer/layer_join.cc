// add (element-wise sum of inputs of one shape: MATLAB's additionLayer,
// Caffe's Eltwise SUM) and concat (along channels: depthConcatenationLayer,
// Caffe's Concat). Both take two or more inputs and have no parameters;
// the gradient of each input is the output's (add) or its channels of it
// (concat).
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

// With a relu folded in (`relu`), the last sum applies it, and backward
// masks dy by the output once, into one dx, which the others copy. With
// `last_bf16`, the last input and its gradient are bf16 (a batch norm's:
// Backend::AddBf16).
class AddLayer final : public Layer {
 public:
  AddLayer(Backend* backend, int64_t sample_size, bool relu, bool last_bf16)
      : backend_(backend),
        sample_size_(sample_size),
        relu_(relu),
        last_bf16_(last_bf16) {}

  void ForwardInputs(int n, absl::Span<const float* const> x, float* y,
                     bool /*training*/, uint64_t /*dropout_salt*/) override {
    const int64_t count = n * sample_size_;
    const size_t floats = last_bf16_ ? x.size() - 1 : x.size();
    const float* sum = x[0];
    for (size_t i = 1; i < floats; ++i) {
      if (relu_ && !last_bf16_ && i + 1 == x.size()) {
        backend_->AddActivation(ActivationDesc{}, count, sum, x[i], y);
      } else {
        backend_->Add(count, sum, x[i], y);
      }
      sum = y;
    }
    if (last_bf16_) backend_->AddBf16(relu_, count, sum, x.back(), y);
  }
  // An input's dx may be dy itself (the network gives one input the add's
  // gradient buffer): it is left as it is, or masked in place.
  void BackwardInputs(int n, absl::Span<const float* const> /*x*/,
                      const float* y, const float* dy,
                      absl::Span<float* const> dx) override {
    const int64_t count = n * sample_size_;
    const absl::Span<float* const> floats =
        last_bf16_ ? dx.first(dx.size() - 1) : dx;
    const float* grad = dy;  // every input's gradient, once made
    if (relu_) {
      float* into = nullptr;
      for (float* d : floats) {
        if (d != nullptr && (into == nullptr || d == dy)) into = d;
      }
      if (into != nullptr) {
        // relu's gradient from its output: y > 0 exactly where its input
        // was.
        backend_->ActivationBackward(ActivationDesc{}, count, y, dy, into);
        grad = into;
      }
    }
    for (float* d : floats) {
      if (d != nullptr && d != grad) {
        backend_->CopyOnDevice(d, grad, count * sizeof(float));
      }
    }
    if (last_bf16_ && dx.back() != nullptr) {
      const bool masked = !relu_ || grad != dy;
      backend_->GradientToBf16(count, masked ? nullptr : y, grad, dx.back());
    }
  }

 private:
  Backend* backend_;
  int64_t sample_size_;
  bool relu_;
  bool last_bf16_;
};

class ConcatLayer final : public Layer {
 public:
  // `channels`: each input's; positions: h * w of every input.
  ConcatLayer(Backend* backend, std::vector<int> channels, int64_t positions)
      : backend_(backend),
        channels_(std::move(channels)),
        positions_(positions) {
    for (int c : channels_) total_ += c;
  }

  void ForwardInputs(int n, absl::Span<const float* const> x, float* y,
                     bool /*training*/, uint64_t /*dropout_salt*/) override {
    const int64_t rows = n * positions_;
    int offset = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      backend_->CopyStrided(rows, channels_[i], x[i], channels_[i], y + offset,
                            total_);
      offset += channels_[i];
    }
  }
  void BackwardInputs(int n, absl::Span<const float* const> /*x*/,
                      const float* /*y*/, const float* dy,
                      absl::Span<float* const> dx) override {
    const int64_t rows = n * positions_;
    int offset = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      if (dx[i] != nullptr) {
        backend_->CopyStrided(rows, channels_[i], dy + offset, total_, dx[i],
                              channels_[i]);
      }
      offset += channels_[i];
    }
  }

 private:
  Backend* backend_;
  std::vector<int> channels_;
  int64_t positions_;
  int total_ = 0;
};

}  // namespace

absl::StatusOr<LayerPlan> MakeJoinLayer(const LayerContext& ctx) {
  // The inputs agree (InferLayerShape): add's in shape, concat's in height
  // and width.
  LayerPlan plan = ctx.Plan();
  if (ctx.spec->type() == "add") {
    plan.folds_relu = ctx.relu_follows;
    plan.layer = std::make_unique<AddLayer>(ctx.backend, ctx.ins[0].size(),
                                            plan.folds_relu, ctx.bf16_input);
    return plan;
  }
  std::vector<int> channels;
  for (const Shape& s : ctx.ins) channels.push_back(s.c);
  plan.layer =
      std::make_unique<ConcatLayer>(ctx.backend, std::move(channels),
                                    int64_t{ctx.shape.out.h} * ctx.shape.out.w);
  return plan;
}

}  // namespace dlbatch::trainer
