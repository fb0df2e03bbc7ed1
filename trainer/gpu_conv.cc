// Convolution on the GPU: cuDNN's forward, backward-data and
// backward-filter over NHWC activations and OHWI (cuDNN's NHWC filter,
// KRSC) weights; the bias by our kernels (gpu_layer_kernels.cu: cuDNN's
// bias gradient took 2.3 ms of LeNet's 5 ms step at batch 1024 on an H100).
//
// Algorithms are chosen per batch size by timing (cudnnFind*): the fastest
// in float32 arithmetic (tensor-op math only with precision: tf32), as
// PyTorch's cudnn.benchmark and Caffe choose. Some of those add with
// atomics, so two runs of a step may differ in the last bits; with
// DLBATCH_CUDNN_DETERMINISTIC=1 in the environment only deterministic
// algorithms are taken (slower: LeNet's filter gradient took 819 instead of
// about 150 us). The choices go to the Context's tuning under a key naming
// the shapes, so a resumed run reuses them (LoadTuning) instead of timing
// again.
//
// cuDNN pads symmetrically. A layer whose padding is not (`same` with an
// even window, or a stride over an even input: the extra row and column at
// the bottom and right) runs cuDNN without padding on a zero-padded copy
// of x in a scratch buffer of this kernel (max_batch samples): forward pads
// into it; backward data has cuDNN write the padded input's gradient there
// and crops its interior into dx; backward weights pads x again (backward
// data may have overwritten the copy, in either order of the two calls).
// Symmetric layers take cuDNN's padding and copy nothing.
//
// cuDNN 9 marks this (its "legacy") API deprecated but keeps it; the graph
// API is the way forward once it pays (fused bias and activation).
#include <cudnn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/backend_cuda_internal.h"
#include "trainer/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

bool DeterministicOnly() {
  const char* env = std::getenv("DLBATCH_CUDNN_DETERMINISTIC");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

// Picks from cudnnFind*'s results (fastest first): the fastest that ran
// without tensor-op math (unless tf32), deterministic where
// `deterministic`; else the fastest that ran. -1 if none did.
template <typename Perf>
int PickAlgorithm(const Perf* perf, int returned, bool tf32,
                  bool deterministic) {
  int fallback = -1;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (!tf32 && (perf[i].mathType == CUDNN_TENSOR_OP_MATH ||
                  perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
      continue;
    }
    if (fallback < 0) fallback = static_cast<int>(perf[i].algo);
    if (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC) {
      return static_cast<int>(perf[i].algo);
    }
  }
  return fallback;
}

class GpuConv final : public ConvKernel {
 public:
  GpuConv(Context* ctx, const ConvDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat("convolution ", desc.in.ToString(), " -> ",
                           desc.out.ToString(), " (", desc.kh, "x", desc.kw,
                           ", stride ", desc.stride_h, "x", desc.stride_w,
                           ", pad ", desc.pad.top, ",", desc.pad.left,
                           !desc.pad.symmetric()
                               ? absl::StrCat(",", desc.pad.bottom, ",",
                                              desc.pad.right)
                               : "",
                           ")")),
        padded_(!desc.pad.symmetric()),
        x_shape_(padded_ ? Shape{desc.in.h + desc.pad.top + desc.pad.bottom,
                                 desc.in.w + desc.pad.left + desc.pad.right,
                                 desc.in.c}
                         : desc.in),
        plans_(max_batch + 1) {}
  ~GpuConv() override {
    // Best effort.
    if (bias_partial_ != nullptr) cudaFree(bias_partial_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  absl::Status Prepare(int max_batch) {
    if (padded_ && d_.pad.negative()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": negative padding"));
    }
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(
        filter_.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, d_.filters,
        d_.in.c, d_.kh, d_.kw));
    // Padded: cuDNN sees the padded copy (x_shape_) and pads nothing.
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
        conv_.get(), padded_ ? 0 : d_.pad.top, padded_ ? 0 : d_.pad.left,
        d_.stride_h, d_.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    // FMA math: cuDNN's default would allow TF32 on Ampere and later.
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        conv_.get(), ctx_->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaMalloc(
        &bias_partial_, sizeof(double) * kBiasGradMaxChunks * d_.filters));
    if (padded_) {
      DLBATCH_CUDA_RETURN_IF_ERROR(cudaMalloc(
          &scratch_, sizeof(float) * max_batch * x_shape_.size()));
    }
    int n = 0, c = 0, h = 0, w = 0;
    TensorDescriptor x;
    if (absl::Status s = SetNhwc(x, 1, x_shape_); !s.ok()) return s;
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnGetConvolution2dForwardOutputDim(
        conv_.get(), x.get(), filter_.get(), &n, &c, &h, &w));
    if (c != d_.filters || h != d_.out.h || w != d_.out.w) {
      return absl::InternalError(absl::StrCat(
          name_, ": cuDNN computes an output of [", h, ", ", w, ", ", c,
          "], not ", d_.out.ToString()));
    }
    absl::StatusOr<Plan*> plan = MakePlan(max_batch);
    return plan.status();
  }

  void Forward(int n, const float* x, const float* w, const float* b,
               float* y) override {
    Plan& p = PlanFor(n);
    if (padded_) x = Pad(n, x);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionForward(
        ctx_->cudnn, &one, p.x.get(), x, filter_.get(), w, conv_.get(), p.fwd,
        ctx_->Workspace(p.workspace), p.workspace, &zero, p.y.get(), y));
    LaunchAddBiasRows(ctx_->stream, Rows(n), d_.filters, b, y);
  }

  void BackwardData(int n, const float* dy, const float* w,
                    float* dx) override {
    Plan& p = PlanFor(n);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionBackwardData(
        ctx_->cudnn, &one, filter_.get(), w, p.y.get(), dy, conv_.get(),
        p.bwd_data, ctx_->Workspace(p.workspace), p.workspace, &zero,
        p.x.get(), padded_ ? scratch_ : dx));
    if (padded_) {
      LaunchCropNhwc(ctx_->stream, n, d_.in.h, d_.in.w, d_.in.c, d_.pad.top,
                     d_.pad.left, x_shape_.h, x_shape_.w, scratch_, dx);
    }
  }

  void BackwardWeights(int n, const float* x, const float* dy, float* dw,
                       float* db) override {
    Plan& p = PlanFor(n);
    if (padded_) x = Pad(n, x);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        ctx_->cudnn, &one, p.x.get(), x, p.y.get(), dy, conv_.get(),
        p.bwd_filter, ctx_->Workspace(p.workspace), p.workspace, &zero,
        filter_.get(), dw));
    LaunchBiasGradRows(ctx_->stream, Rows(n), d_.filters, dy, bias_partial_,
                       db);
  }

 private:
  // Descriptors and algorithms for one batch size.
  struct Plan {
    TensorDescriptor x, y;
    cudnnConvolutionFwdAlgo_t fwd{};
    cudnnConvolutionBwdDataAlgo_t bwd_data{};
    cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
    size_t workspace = 0;
  };

  Plan& PlanFor(int n) {
    if (n < 1 || n >= static_cast<int>(plans_.size())) {
      Die(name_.c_str(), __FILE__, __LINE__,
          absl::StrCat("batch size ", n, " outside [1, ", plans_.size() - 1,
                       "]")
              .c_str());
    }
    if (plans_[n] == nullptr) {
      // A batch size first seen while running (the last validation batch).
      absl::StatusOr<Plan*> plan = MakePlan(n);
      if (!plan.ok()) {
        Die(name_.c_str(), __FILE__, __LINE__,
            std::string(plan.status().message()).c_str());
      }
    }
    return *plans_[n];
  }

  int64_t Rows(int n) const { return int64_t{n} * d_.out.h * d_.out.w; }

  // Queues the zero-padded copy of x's n samples into scratch_; returns it.
  const float* Pad(int n, const float* x) {
    LaunchPadNhwc(ctx_->stream, n, d_.in.h, d_.in.w, d_.in.c, d_.pad.top,
                  d_.pad.left, x_shape_.h, x_shape_.w, x, scratch_);
    return scratch_;
  }

  std::string Key(const char* what, int n) const {
    return absl::StrCat("cuda ", what, " ", name_, " n=", n,
                        ctx_->tf32 ? " tf32" : "");
  }

  // The algorithm tuned for `key` if LoadTuning gave one that cuDNN accepts
  // here (its workspace size query succeeds), else the one `find` picks.
  template <typename Algo, typename SizeQuery, typename Find>
  absl::StatusOr<Algo> Choose(const std::string& key, const SizeQuery& size,
                              const Find& find, size_t* bytes) {
    if (auto it = ctx_->tuning.find(key); it != ctx_->tuning.end()) {
      const Algo algo = static_cast<Algo>(it->second);
      if (size(algo, bytes) == CUDNN_STATUS_SUCCESS) return algo;
    }
    absl::StatusOr<int> found = find();
    if (!found.ok()) return found.status();
    if (*found < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": cuDNN has no algorithm for this shape"));
    }
    const Algo algo = static_cast<Algo>(*found);
    DLBATCH_CUDNN_RETURN_IF_ERROR(size(algo, bytes));
    ctx_->tuning[key] = *found;
    return algo;
  }

  absl::StatusOr<Plan*> MakePlan(int n) {
    auto plan = std::make_unique<Plan>();
    Plan& p = *plan;
    if (absl::Status s = SetNhwc(p.x, n, x_shape_); !s.ok()) return s;
    if (absl::Status s = SetNhwc(p.y, n, d_.out); !s.ok()) return s;
    cudnnHandle_t h = ctx_->cudnn;
    const bool tf32 = ctx_->tf32;
    size_t fwd_bytes = 0, data_bytes = 0, filter_bytes = 0;

    absl::StatusOr<cudnnConvolutionFwdAlgo_t> fwd =
        Choose<cudnnConvolutionFwdAlgo_t>(
            Key("fwd", n),
            [&](cudnnConvolutionFwdAlgo_t a, size_t* bytes) {
              return cudnnGetConvolutionForwardWorkspaceSize(
                  h, p.x.get(), filter_.get(), conv_.get(), p.y.get(), a,
                  bytes);
            },
            [&]() -> absl::StatusOr<int> {
              cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
              int returned = 0;
              DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithm(
                  h, p.x.get(), filter_.get(), conv_.get(), p.y.get(),
                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
              return PickAlgorithm(perf, returned, tf32, deterministic_);
            },
            &fwd_bytes);
    if (!fwd.ok()) return fwd.status();

    absl::StatusOr<cudnnConvolutionBwdDataAlgo_t> data =
        Choose<cudnnConvolutionBwdDataAlgo_t>(
            Key("bwd_data", n),
            [&](cudnnConvolutionBwdDataAlgo_t a, size_t* bytes) {
              return cudnnGetConvolutionBackwardDataWorkspaceSize(
                  h, filter_.get(), p.y.get(), conv_.get(), p.x.get(), a,
                  bytes);
            },
            [&]() -> absl::StatusOr<int> {
              cudnnConvolutionBwdDataAlgoPerf_t
                  perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
              int returned = 0;
              DLBATCH_CUDNN_RETURN_IF_ERROR(
                  cudnnFindConvolutionBackwardDataAlgorithm(
                      h, filter_.get(), p.y.get(), conv_.get(), p.x.get(),
                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
              return PickAlgorithm(perf, returned, tf32, deterministic_);
            },
            &data_bytes);
    if (!data.ok()) return data.status();

    absl::StatusOr<cudnnConvolutionBwdFilterAlgo_t> filter =
        Choose<cudnnConvolutionBwdFilterAlgo_t>(
            Key("bwd_filter", n),
            [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* bytes) {
              return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                  h, p.x.get(), p.y.get(), conv_.get(), filter_.get(), a,
                  bytes);
            },
            [&]() -> absl::StatusOr<int> {
              cudnnConvolutionBwdFilterAlgoPerf_t
                  perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
              int returned = 0;
              DLBATCH_CUDNN_RETURN_IF_ERROR(
                  cudnnFindConvolutionBackwardFilterAlgorithm(
                      h, p.x.get(), p.y.get(), conv_.get(), filter_.get(),
                      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned,
                      perf));
              return PickAlgorithm(perf, returned, tf32, deterministic_);
            },
            &filter_bytes);
    if (!filter.ok()) return filter.status();

    p.fwd = *fwd;
    p.bwd_data = *data;
    p.bwd_filter = *filter;
    p.workspace = std::max({fwd_bytes, data_bytes, filter_bytes});
    if (absl::Status s = ctx_->ReserveWorkspace(p.workspace); !s.ok()) {
      return s;
    }
    plans_[n] = std::move(plan);
    return plans_[n].get();
  }

  Context* ctx_;
  const ConvDesc d_;
  const std::string name_;
  FilterDescriptor filter_;
  ConvolutionDescriptor conv_;
  const bool deterministic_ = DeterministicOnly();
  // Asymmetric padding: cuDNN runs on a zero-padded copy of x (see the top)
  // of shape x_shape_ in scratch_ (device, max_batch samples); else
  // x_shape_ is d_.in and scratch_ null.
  const bool padded_;
  const Shape x_shape_;
  float* scratch_ = nullptr;
  double* bias_partial_ = nullptr;  // device: LaunchBiasGradRows' scratch
  std::vector<std::unique_ptr<Plan>> plans_;  // by batch size
};

}  // namespace

absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(Context* ctx,
                                                     const ConvDesc& desc,
                                                     int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("convolution: max_batch must be >= 1, not ", max_batch));
  }
  auto kernel = std::make_unique<GpuConv>(ctx, desc, max_batch);
  if (absl::Status s = kernel->Prepare(max_batch); !s.ok()) return s;
  return kernel;
}

}  // namespace dlbatch::trainer::gpu
