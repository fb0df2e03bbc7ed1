// Convolution in bf16 or fp16 on the GPU (precision: bf16 | fp16): the
// backend's tensors stay float32 (backend.h), so each call casts what it
// reads into low-precision copies of this kernel's (gpu_cast_kernels.cu),
// runs cuDNN on them with float32 accumulation (its PSEUDO_HALF and
// PSEUDO_BFLOAT16 configurations: low-precision x, w and y, a float
// compute type) on tensor cores, and casts the result back into float32,
// adding the bias on the way.
//
// Channels are padded to multiples of 8, both the input's and the
// filters': tensor cores take NHWC operands in 16-byte groups of channels,
// and cuDNN's kernels for other counts either pad internally, each call,
// or fall back to slower ones (LeNet's first layer has one input channel).
// The casts pad for free, as they write every element anyway; the padded
// channels are zeros, so they add nothing, and their gradients are cropped
// away. A layer whose spatial padding is asymmetric gets it from the cast
// too (cuDNN pads symmetrically, gpu_conv.cc).
//
// Casts happen once per step where they can: Forward always casts the
// weights and x (a step's new batch and weights sit where the last ones
// did), BackwardWeights reuses x's where it is given the same x of the same
// batch size (and casts dy), BackwardData reuses the weights' and dy's. The
// network calls BackwardWeights before BackwardData, and nothing changes x, w
// or dy in between within a step (the float32 path reads them there too). The
// pointers and batch size identify what a copy holds; what is fixed when a
// step is recorded (CUDA graphs) is the sequence of calls, so a replay
// casts where the recorded step did. dx's copy reuses x's (which
// BackwardData therefore marks stale), y's reuses dy's (Forward comes first
// in a step).
//
// Algorithms are cuDNN's fastest by timing, with tensor-op math, chosen
// per batch size and kept in the tuning as gpu_conv.cc keeps its own. No
// lowered form: cuBLAS in low precision would need the patches cast too.
#include <cudnn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

// Channel counts of the low-precision copies: multiples of 8.
int PadChannels(int c) { return (c + 7) / 8 * 8; }

cudnnDataType_t CudnnType(LowType t) {
  return t == LowType::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

const char* LowName(LowType t) { return t == LowType::kBf16 ? "bf16" : "fp16"; }

// The fastest of cudnnFind*'s results (fastest first) that ran,
// deterministic where `deterministic`; else the fastest that ran; -1 if
// none did.
template <typename Perf>
int PickFastest(const Perf* perf, int returned, bool deterministic) {
  int fallback = -1;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (fallback < 0) fallback = static_cast<int>(perf[i].algo);
    if (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC) {
      return static_cast<int>(perf[i].algo);
    }
  }
  return fallback;
}

enum Direction { kFwd = 0, kData = 1, kFilter = 2 };
constexpr const char* kDirectionNames[] = {"fwd", "bwd_data", "bwd_filter"};

class GpuLowConv final : public ConvKernel {
 public:
  GpuLowConv(Context* ctx, const ConvDesc& d, int max_batch)
      : ctx_(ctx),
        d_(d),
        type_(ctx->low),
        name_(absl::StrCat(
            "convolution ", d.in.ToString(), " -> ", d.out.ToString(), " (",
            d.kh, "x", d.kw, ", stride ", d.stride_h, "x", d.stride_w, ", pad ",
            d.pad.top, ",", d.pad.left,
            !d.pad.symmetric()
                ? absl::StrCat(",", d.pad.bottom, ",", d.pad.right)
                : "",
            ")")),
        padded_(!d.pad.symmetric()),
        pc_(PadChannels(d.in.c)),
        pk_(PadChannels(d.filters)),
        x_shape_{padded_ ? d.in.h + d.pad.top + d.pad.bottom : d.in.h,
                 padded_ ? d.in.w + d.pad.left + d.pad.right : d.in.w, pc_},
        y_shape_{d.out.h, d.out.w, pk_},
        max_batch_(max_batch),
        plans_(max_batch + 1) {}
  ~GpuLowConv() override {
    // Best effort.
    for (void* p : {x_low_, y_low_, w_low_, dw_low_}) {
      if (p != nullptr) cudaFree(p);
    }
    if (bias_partial_ != nullptr) cudaFree(bias_partial_);
  }

  absl::Status Prepare() {
    if (d_.pad.negative()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": negative padding"));
    }
    const cudnnDataType_t type = CudnnType(type_);
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(
        filter_.get(), type, CUDNN_TENSOR_NHWC, pk_, pc_, d_.kh, d_.kw));
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
        conv_.get(), padded_ ? 0 : d_.pad.top, padded_ ? 0 : d_.pad.left,
        d_.stride_h, d_.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    DLBATCH_CUDNN_RETURN_IF_ERROR(
        cudnnSetConvolutionMathType(conv_.get(), CUDNN_TENSOR_OP_MATH));
    const size_t kLow = 2;  // bytes of a bf16 or fp16
    const size_t weights = size_t{1} * pk_ * d_.kh * d_.kw * pc_;
    for (const auto& [data, bytes] :
         {std::pair<void**, size_t>{&x_low_,
                                    kLow * max_batch_ * x_shape_.size()},
          {&y_low_, kLow * max_batch_ * y_shape_.size()},
          {&w_low_, kLow * weights},
          {&dw_low_, kLow * weights}}) {
      RETURN_IF_ERROR(DeviceAlloc(data, bytes, ctx_->device, name_));
    }
    RETURN_IF_ERROR(DeviceAlloc(
        &bias_partial_, sizeof(double) * kBiasGradMaxChunks * d_.filters,
        ctx_->device, name_));
    int n = 0, c = 0, h = 0, w = 0;
    TensorDescriptor x;
    if (absl::Status s = SetNhwc(x, 1, x_shape_, type); !s.ok()) return s;
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnGetConvolution2dForwardOutputDim(
        conv_.get(), x.get(), filter_.get(), &n, &c, &h, &w));
    if (c != pk_ || h != d_.out.h || w != d_.out.w) {
      return absl::InternalError(
          absl::StrCat(name_, ": cuDNN computes an output of [", h, ", ", w,
                       ", ", c, "], not ", y_shape_.ToString()));
    }
    return MakePlan(max_batch_).status();
  }

  void Forward(int n, const float* x, const float* w, const float* b,
               float* y) override {
    const Plan& p = PlanFor(n);
    CastWeights(w);
    CastInput(n, x, /*again=*/true);  // a new batch, maybe in the same place
    dy_of_ = nullptr;                 // y's copy is dy's
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionForward(
        ctx_->cudnn, &one, p.x.get(), x_low_, filter_.get(), w_low_,
        conv_.get(), static_cast<cudnnConvolutionFwdAlgo_t>(p.algo[kFwd]),
        ctx_->Workspace(p.workspace), p.workspace, &zero, p.y.get(), y_low_));
    LaunchFromLow(ctx_->stream, type_, n, OutputGeometry(), y_low_, b, y);
  }

  void BackwardData(int n, const float* dy, const float* w,
                    float* dx) override {
    if (!d_.input_grad) NoBackwardData(name_);
    const Plan& p = PlanFor(n);
    if (w != weights_of_) CastWeights(w);
    CastGradient(n, dy);
    const float one = 1, zero = 0;
    // dx's copy is x's: the cast of x is gone.
    input_of_ = nullptr;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionBackwardData(
        ctx_->cudnn, &one, filter_.get(), w_low_, p.y.get(), y_low_,
        conv_.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo[kData]),
        ctx_->Workspace(p.workspace), p.workspace, &zero, p.x.get(), x_low_));
    LaunchFromLow(ctx_->stream, type_, n, InputGeometry(), x_low_, nullptr, dx);
  }

  void BackwardWeights(int n, const float* x, const float* dy, float* dw,
                       float* db) override {
    const Plan& p = PlanFor(n);
    CastInput(n, x, /*again=*/false);
    CastGradient(n, dy);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        ctx_->cudnn, &one, p.x.get(), x_low_, p.y.get(), y_low_, conv_.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo[kFilter]),
        ctx_->Workspace(p.workspace), p.workspace, &zero, filter_.get(),
        dw_low_));
    LaunchFromLow(ctx_->stream, type_, d_.filters, WeightGeometry(), dw_low_,
                  nullptr, dw);
    LaunchBiasGradRows(ctx_->stream, int64_t{n} * d_.out.h * d_.out.w,
                       d_.filters, dy, bias_partial_, db);
  }

 private:
  struct Plan {
    TensorDescriptor x, y;
    int algo[3] = {0, 0, 0};
    size_t workspace = 0;
  };

  // x (float, d_.in) in its copy (x_shape_), at the padding's offset where
  // the cast pads.
  CastGeometry InputGeometry() const {
    return {d_.in.h,
            d_.in.w,
            d_.in.c,
            x_shape_.h,
            x_shape_.w,
            pc_,
            padded_ ? d_.pad.top : 0,
            padded_ ? d_.pad.left : 0};
  }
  CastGeometry OutputGeometry() const {
    return {d_.out.h, d_.out.w, d_.filters, d_.out.h, d_.out.w, pk_};
  }
  // Weights as samples: a filter each, kh x kw x in.c; pk_ - filters more
  // of zeros.
  CastGeometry WeightGeometry() const {
    return {d_.kh, d_.kw, d_.in.c, d_.kh, d_.kw, pc_};
  }

  void CastWeights(const float* w) {
    LaunchToLow(ctx_->stream, type_, d_.filters, pk_, WeightGeometry(), w,
                w_low_);
    weights_of_ = w;
  }
  // x's copy, unless it holds this x of n samples already and not `again`.
  void CastInput(int n, const float* x, bool again) {
    if (!again && x == input_of_ && n == input_n_) return;
    LaunchToLow(ctx_->stream, type_, n, n, InputGeometry(), x, x_low_);
    input_of_ = x;
    input_n_ = n;
  }
  void CastGradient(int n, const float* dy) {
    if (dy == dy_of_ && n == dy_n_) return;
    LaunchToLow(ctx_->stream, type_, n, n, OutputGeometry(), dy, y_low_);
    dy_of_ = dy;
    dy_n_ = n;
  }

  const Plan& PlanFor(int n) {
    if (n < 1 || n > max_batch_) {
      Die(name_.c_str(), __FILE__, __LINE__,
          absl::StrCat("batch size ", n, " outside [1, ", max_batch_, "]")
              .c_str());
    }
    if (plans_[n] == nullptr) {
      absl::StatusOr<Plan*> plan = MakePlan(n);
      if (!plan.ok()) {
        Die(name_.c_str(), __FILE__, __LINE__,
            std::string(plan.status().message()).c_str());
      }
    }
    return *plans_[n];
  }

  std::string Key(Direction dir, int n) const {
    return absl::StrCat("cuda ", kDirectionNames[dir], " ", name_, " n=", n,
                        " ", LowName(type_));
  }

  cudnnStatus_t CudnnBytes(const Plan& p, Direction dir, int algo,
                           size_t* bytes) const {
    cudnnHandle_t h = ctx_->cudnn;
    switch (dir) {
      case kFwd:
        return cudnnGetConvolutionForwardWorkspaceSize(
            h, p.x.get(), filter_.get(), conv_.get(), p.y.get(),
            static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
      case kData:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, filter_.get(), p.y.get(), conv_.get(), p.x.get(),
            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
      case kFilter:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, p.x.get(), p.y.get(), conv_.get(), filter_.get(),
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
    }
    return CUDNN_STATUS_BAD_PARAM;
  }

  absl::StatusOr<int> Find(const Plan& p, Direction dir) {
    cudnnHandle_t h = ctx_->cudnn;
    int returned = 0;
    switch (dir) {
      case kFwd: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithm(
            h, p.x.get(), filter_.get(), conv_.get(), p.y.get(),
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
        return PickFastest(perf, returned, deterministic_);
      }
      case kData: {
        cudnnConvolutionBwdDataAlgoPerf_t
            perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardDataAlgorithm(
            h, filter_.get(), p.y.get(), conv_.get(), p.x.get(),
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
        return PickFastest(perf, returned, deterministic_);
      }
      case kFilter: {
        cudnnConvolutionBwdFilterAlgoPerf_t
            perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        DLBATCH_CUDNN_RETURN_IF_ERROR(
            cudnnFindConvolutionBackwardFilterAlgorithm(
                h, p.x.get(), p.y.get(), conv_.get(), filter_.get(),
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf));
        return PickFastest(perf, returned, deterministic_);
      }
    }
    return -1;
  }

  // Each direction's algorithm for batches of n: the tuning's where it
  // still holds, else cuDNN's fastest by timing; recorded in the tuning.
  absl::StatusOr<Plan*> MakePlan(int n) {
    auto plan = std::make_unique<Plan>();
    Plan& p = *plan;
    const cudnnDataType_t type = CudnnType(type_);
    if (absl::Status s = SetNhwc(p.x, n, x_shape_, type); !s.ok()) return s;
    if (absl::Status s = SetNhwc(p.y, n, y_shape_, type); !s.ok()) return s;
    for (Direction dir : {kFwd, kData, kFilter}) {
      if (dir == kData && !d_.input_grad) continue;  // never asked for
      const std::string key = Key(dir, n);
      size_t bytes = 0;
      if (auto it = ctx_->tuning.find(key);
          it != ctx_->tuning.end() &&
          CudnnBytes(p, dir, it->second, &bytes) == CUDNN_STATUS_SUCCESS) {
        p.algo[dir] = it->second;
      } else {
        absl::StatusOr<int> found = Find(p, dir);
        if (!found.ok()) return found.status();
        if (*found < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              key, ": cuDNN has no ", LowName(type_),
              " algorithm for this shape; use precision: fp32 or tf32"));
        }
        p.algo[dir] = *found;
        DLBATCH_CUDNN_RETURN_IF_ERROR(CudnnBytes(p, dir, *found, &bytes));
      }
      p.workspace = std::max(p.workspace, bytes);
      ctx_->tuning[key] = p.algo[dir];
    }
    if (absl::Status s = ctx_->ReserveWorkspace(p.workspace); !s.ok()) {
      return s;
    }
    plans_[n] = std::move(plan);
    return plans_[n].get();
  }

  Context* ctx_;
  const ConvDesc d_;
  const LowType type_;
  const std::string name_;
  const bool padded_;  // asymmetric: the casts pad, cuDNN does not
  const int pc_, pk_;  // channels and filters, padded to multiples of 8
  const Shape x_shape_, y_shape_;  // of the low-precision copies
  const int max_batch_;
  const bool deterministic_ = [] {
    const char* env = std::getenv("DLBATCH_CUDNN_DETERMINISTIC");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  FilterDescriptor filter_;
  ConvolutionDescriptor conv_;
  // Device copies, 2 bytes an element: x's (and dx's), y's (and dy's) for
  // max_batch_ samples; the weights' and their gradient's.
  void* x_low_ = nullptr;
  void* y_low_ = nullptr;
  void* w_low_ = nullptr;
  void* dw_low_ = nullptr;
  double* bias_partial_ = nullptr;  // LaunchBiasGradRows' scratch
  // What the copies hold (null: nothing reusable).
  const float* weights_of_ = nullptr;
  const float* input_of_ = nullptr;
  int input_n_ = 0;
  const float* dy_of_ = nullptr;
  int dy_n_ = 0;
  std::vector<std::unique_ptr<Plan>> plans_;  // by batch size
};

}  // namespace

absl::StatusOr<std::unique_ptr<ConvKernel>> MakeLowConv(Context* ctx,
                                                        const ConvDesc& desc,
                                                        int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("convolution: max_batch must be >= 1, not ", max_batch));
  }
  auto kernel = std::make_unique<GpuLowConv>(ctx, desc, max_batch);
  if (absl::Status s = kernel->Prepare(); !s.ok()) return s;
  return kernel;
}

}  // namespace dlbatch::trainer::gpu
