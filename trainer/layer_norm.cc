// batchnorm: per-channel batch normalisation with a learnt scale and
// offset; running statistics (state) move with momentum 0.1. With `sync`
// and more than one rank, a training pass takes its statistics over the
// global mini-batch (as PyTorch's SyncBatchNorm); otherwise over this
// rank's slice (as DDP does).
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "trainer/layers.h"

namespace dlbatch::trainer {
namespace {

// running = 0.9 * running + 0.1 * batch, as PyTorch and Caffe2 default.
constexpr float kMomentum = 0.1f;
constexpr float kDefaultEpsilon = 1e-5f;

class BatchNormLayer final : public OneInputLayer {
 public:
  BatchNormLayer(std::unique_ptr<BatchNormKernel> kernel, Buffer saved)
      : kernel_(std::move(kernel)), saved_(std::move(saved)) {}

  void Forward(int n, const float* x, float* y, bool training,
               uint64_t /*dropout_salt*/) override {
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

// What the batch norms whose statistics span ranks share: per pass, one
// allreduce of 2c + 1 floats (this rank's per-channel sums and its sample
// count, summed over the ranks), the batch's statistics kept for the
// backward, and inference with the running ones by `kernel_`.
//
// Why 1 rank and N ranks compute the same step: the trainer scales the loss
// gradient by 1 / global batch on every rank and sums the ranks' parameter
// gradients, so dy here is already the gradient of the global mean loss.
// The forward statistics are the global batch's; backward totals the ranks'
// sums of dy and dy * xhat before dx, and leaves dgamma and dbeta as this
// rank's share, which the trainer's allreduce adds up.
//
// The forward sums are shifted by the running mean: the same on every rank
// (it moves by the same global statistics everywhere, and the trainer's
// averaging of state keeps it so), near the batch mean once training runs.
class RanksBatchNormLayer : public OneInputLayer {
 public:
  RanksBatchNormLayer(std::unique_ptr<BatchNormKernel> kernel,
                      Communicator* communicator, int channels, Buffer saved,
                      Buffer sums)
      : kernel_(std::move(kernel)),
        communicator_(communicator),
        channels_(channels),
        saved_(std::move(saved)),
        sums_(std::move(sums)) {}

 protected:
  // Outside training: normalises with the running statistics and returns
  // true.
  bool Inferred(int n, const float* x, float* y, bool training) {
    if (training) return false;
    kernel_->ForwardInference(n, x, Gamma(), Beta(), RunningMean(),
                              RunningVar(), y);
    return true;
  }
  // The sums of every rank, in place, started and waited for as gradient
  // buckets are: on GPUs the compute stream waits for them on the device
  // (no host wait inside the step; NCCL runs them after any buckets already
  // started, which the rest of the step then follows too); on CPUs the
  // wait is the host's. A failure is kept by the network
  // (LayerContext::communicator), which ends the step.
  void SumOverRanks() {
    const int64_t count = 2 * int64_t{channels_} + 1;
    if (communicator_->StartAllreduceSum(Sums(), count).ok()) {
      communicator_->WaitAll().IgnoreError();
    }
  }
  const float* Gamma() const { return buffers_.params[0]; }
  const float* Beta() const { return buffers_.params[1]; }
  float* RunningMean() const { return buffers_.state[0]; }
  float* RunningVar() const { return buffers_.state[1]; }
  float* Sums() const { return sums_.f32(); }
  float* SavedMean() const { return saved_.f32(); }
  float* SavedVar() const { return saved_.f32() + channels_; }

  std::unique_ptr<BatchNormKernel> kernel_;

 private:
  Communicator* communicator_;
  const int channels_;
  Buffer saved_;  // this batch's mean, then its variance
  Buffer sums_;   // [2c + 1], see SyncBatchNormKernel
};

// Statistics over every rank's samples by the backend's SyncBatchNormKernel
// (ranks of processes with `sync: true`; a GPU's).
class SyncBatchNormLayer final : public RanksBatchNormLayer {
 public:
  SyncBatchNormLayer(std::unique_ptr<BatchNormKernel> inference,
                     std::unique_ptr<SyncBatchNormKernel> sync,
                     Communicator* communicator, int channels, Buffer saved,
                     Buffer sums)
      : RanksBatchNormLayer(std::move(inference), communicator, channels,
                            std::move(saved), std::move(sums)),
        sync_(std::move(sync)) {}

  void Forward(int n, const float* x, float* y, bool training,
               uint64_t /*dropout_salt*/) override {
    if (Inferred(n, x, y, training)) return;
    sync_->ForwardSums(n, x, RunningMean(), Sums());
    SumOverRanks();
    sync_->ForwardNormalize(n, x, Gamma(), Beta(), RunningMean(), Sums(), y,
                            SavedMean(), SavedVar(), RunningMean(),
                            RunningVar(), kMomentum);
  }

  void Backward(int n, const float* x, const float* /*y*/, const float* dy,
                float* dx) override {
    sync_->BackwardSums(n, x, dy, SavedMean(), SavedVar(), buffers_.grads[0],
                        buffers_.grads[1], Sums());
    // Every rank skips dx alike (the same network), so the collectives
    // still match.
    if (dx == nullptr) return;
    SumOverRanks();
    sync_->BackwardData(n, x, dy, Gamma(), SavedMean(), SavedVar(), Sums(), dx);
  }

 private:
  std::unique_ptr<SyncBatchNormKernel> sync_;
};

// Statistics over the ranks that split one mini-batch, with the backend's
// own batch norm (Backend::batch_norm_spans_ranks): SyncBatchNormLayer's
// passes and sums, while its folded relu and bf16 tensors stay. Forward:
// this rank's sums, summed over the ranks, then the normalisation with the
// totals' statistics. Backward: dx as if they were constants and this
// rank's dgamma and dbeta, whose totals then add the statistics' terms.
class SpanningBatchNormLayer final : public RanksBatchNormLayer {
 public:
  using RanksBatchNormLayer::RanksBatchNormLayer;

  void Forward(int n, const float* x, float* y, bool training,
               uint64_t /*dropout_salt*/) override {
    if (Inferred(n, x, y, training)) return;
    kernel_->SpanSums(n, x, RunningMean(), Sums());
    SumOverRanks();
    kernel_->SpanForward(n, x, Gamma(), Beta(), RunningMean(), Sums(), y,
                         SavedMean(), SavedVar(), RunningMean(), RunningVar(),
                         kMomentum);
  }

  void Backward(int n, const float* x, const float* /*y*/, const float* dy,
                float* dx) override {
    kernel_->SpanBackward(n, x, dy, Gamma(), SavedMean(), SavedVar(), dx,
                          buffers_.grads[0], buffers_.grads[1], Sums());
    SumOverRanks();
    kernel_->SpanFinish(n, x, Gamma(), SavedMean(), SavedVar(), Sums(), dx);
  }

  bool can_skip_dx() const override { return false; }
};

}  // namespace

absl::StatusOr<LayerPlan> MakeBatchNormLayer(const LayerContext& ctx) {
  const v1::LayerSpec& spec = *ctx.spec;
  if (spec.epsilon() < 0) {
    return ctx.Error(
        absl::StrCat("epsilon must be >= 0, not ", spec.epsilon()));
  }
  LayerPlan plan = ctx.Plan();

  BatchNormDesc desc;
  desc.in = ctx.in;
  desc.epsilon = spec.epsilon() > 0 ? spec.epsilon() : kDefaultEpsilon;
  const bool spans = SpansRanks(spec, ctx.communicator, *ctx.backend);
  const bool sync = SyncsOverRanks(spec, ctx.communicator) && !spans;
  // The synchronised passes are the backend's own sums: no relu in them.
  desc.relu = ctx.relu_follows && !sync;
  plan.folds_relu = desc.relu;
  desc.bf16_in = ctx.bf16_input && !sync;
  desc.bf16_out = desc.bf16_in && ctx.bf16_output;
  desc.spans_ranks = spans;
  plan.bf16_output = desc.bf16_out;
  auto kernel = ctx.backend->MakeBatchNorm(desc, ctx.max_batch);
  if (!kernel.ok()) return ctx.Error(kernel.status());
  auto saved = ctx.backend->Allocate(2 * ctx.in.c * sizeof(float));
  if (!saved.ok()) return ctx.Error(saved.status());
  if (spans) {
    auto sums = ctx.backend->Allocate((2 * ctx.in.c + 1) * sizeof(float));
    if (!sums.ok()) return ctx.Error(sums.status());
    plan.layer = std::make_unique<SpanningBatchNormLayer>(
        *std::move(kernel), ctx.communicator, ctx.in.c, *std::move(saved),
        *std::move(sums));
  } else if (sync) {
    auto sync = ctx.backend->MakeSyncBatchNorm(desc, ctx.max_batch);
    if (!sync.ok()) return ctx.Error(sync.status());
    auto sums = ctx.backend->Allocate((2 * ctx.in.c + 1) * sizeof(float));
    if (!sums.ok()) return ctx.Error(sums.status());
    plan.layer = std::make_unique<SyncBatchNormLayer>(
        *std::move(kernel), *std::move(sync), ctx.communicator, ctx.in.c,
        *std::move(saved), *std::move(sums));
  } else {
    // One rank: its batch is the global one, and oneDNN's fused primitive
    // computes the same statistics faster.
    plan.layer =
        std::make_unique<BatchNormLayer>(*std::move(kernel), *std::move(saved));
  }

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
