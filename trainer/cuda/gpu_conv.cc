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
// Each direction may instead run lowered: unfolded patches and one cuBLAS
// product per chunk of samples (conv_lowering.h). cuDNN's pick for LeNet's
// second convolution's backward data took 0.5 ms of a 1.8 ms step at batch
// 1024 on an H100, about ten times its arithmetic at the FMA rate, where
// the lowered form is a 65536 x 500 x 50 product and one pass over the
// 131 MB of patches. Which is faster depends on the shape and the GPU, so
// the two are timed on the kernel's first plan for a batch size (Race), the
// faster kept, and the choice saved with cuDNN's (kLoweredChoice).
// CudaBackendOptions::lowering (DLBATCH_CONV_LOWERED) forces either way.
// The lowered form adds in a fixed order (no atomics).
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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/cuda/conv_lowering.h"

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

// The tuning value of a direction that runs lowered (conv_lowering.h);
// cuDNN's algorithm enums are small. Backward weights in g groups (at
// most) is kLoweredChoice + g - 1.
constexpr int kLoweredChoice = 1000;
constexpr int kMostGroups = 1024;
// The groups the race tries for lowered backward weights.
constexpr int kGroupChoices[] = {1, 8, 64};

// The three computations of a convolution, each chosen on its own.
enum Direction { kFwd = 0, kData = 1, kFilter = 2 };
constexpr const char* kDirectionNames[] = {"fwd", "bwd_data", "bwd_filter"};

class GpuConv final : public ConvKernel {
 public:
  GpuConv(Context* ctx, const ConvDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat(
            "convolution ", desc.in.ToString(), " -> ", desc.out.ToString(),
            " (", desc.kh, "x", desc.kw, ", stride ", desc.stride_h, "x",
            desc.stride_w, ", pad ", desc.pad.top, ",", desc.pad.left,
            !desc.pad.symmetric()
                ? absl::StrCat(",", desc.pad.bottom, ",", desc.pad.right)
                : "",
            ")")),
        padded_(!desc.pad.symmetric()),
        x_shape_(padded_ ? Shape{desc.in.h + desc.pad.top + desc.pad.bottom,
                                 desc.in.w + desc.pad.left + desc.pad.right,
                                 desc.in.c}
                         : desc.in),
        lowered_(desc, ctx->lowered_bytes),
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
        filter_.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, d_.filters, d_.in.c,
        d_.kh, d_.kw));
    // Padded: cuDNN sees the padded copy (x_shape_) and pads nothing.
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
        conv_.get(), padded_ ? 0 : d_.pad.top, padded_ ? 0 : d_.pad.left,
        d_.stride_h, d_.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    // FMA math: cuDNN's default would allow TF32 on Ampere and later.
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        conv_.get(), ctx_->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
    RETURN_IF_ERROR(DeviceAlloc(
        &bias_partial_, sizeof(double) * kBiasGradMaxChunks * d_.filters,
        ctx_->device, name_));
    if (padded_) {
      RETURN_IF_ERROR(DeviceAlloc(&scratch_,
                                  sizeof(float) * max_batch * x_shape_.size(),
                                  ctx_->device, name_));
    }
    int n = 0, c = 0, h = 0, w = 0;
    TensorDescriptor x;
    if (absl::Status s = SetNhwc(x, 1, x_shape_); !s.ok()) return s;
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnGetConvolution2dForwardOutputDim(
        conv_.get(), x.get(), filter_.get(), &n, &c, &h, &w));
    if (c != d_.filters || h != d_.out.h || w != d_.out.w) {
      return absl::InternalError(
          absl::StrCat(name_, ": cuDNN computes an output of [", h, ", ", w,
                       ", ", c, "], not ", d_.out.ToString()));
    }
    absl::StatusOr<Plan*> plan = MakePlan(max_batch);
    return plan.status();
  }

  void Forward(int n, const float* x, const float* w, const float* b,
               float* y) override {
    Plan& p = PlanFor(n);
    RunForward(p, n, x, w, y, Patches(p, n));
    LaunchAddBiasRows(ctx_->stream, lowered_.Rows64(n), d_.filters, b, y);
  }

  void BackwardData(int n, const float* dy, const float* w,
                    float* dx) override {
    if (!d_.input_grad) NoBackwardData(name_);
    Plan& p = PlanFor(n);
    RunBackwardData(p, n, dy, w, dx, Patches(p, n));
  }

  void BackwardWeights(int n, const float* x, const float* dy, float* dw,
                       float* db) override {
    Plan& p = PlanFor(n);
    float* patches = Patches(p, n);
    RunBackwardWeights(p, n, x, dy, dw, patches, Parts(p, n, patches));
    LaunchBiasGradRows(ctx_->stream, lowered_.Rows64(n), d_.filters, dy,
                       bias_partial_, db);
  }

 private:
  // Descriptors and choices for one batch size: per direction, cuDNN's
  // algorithm (`algo`) or the lowered form (`lowered`).
  struct Plan {
    TensorDescriptor x, y;
    int algo[3] = {0, 0, 0};
    bool lowered[3] = {false, false, false};
    int groups = 1;  // lowered backward weights': the most groups
    size_t workspace = 0;
  };

  // --- running a direction as its plan says (without the bias) ---
  // `patches`: the lowered form's (lowered_.WorkspaceBytes(n) bytes; null
  // where the patches are x).
  void RunForward(const Plan& p, int n, const float* x, const float* w,
                  float* y, float* patches) {
    if (p.lowered[kFwd]) {
      for (int s = 0; s < n; s += lowered_.chunk()) {
        const int samples = std::min(lowered_.chunk(), n - s);
        const float* xs = x + s * d_.in.size();
        if (!lowered_.identity()) {
          LaunchUnfold(ctx_->stream, samples, lowered_.geometry(), xs, patches);
          xs = patches;
        }
        Multiply(lowered_.Forward(samples), w, xs, 0, y + s * d_.out.size());
      }
      return;
    }
    if (padded_) x = Pad(n, x);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionForward(
        ctx_->cudnn, &one, p.x.get(), x, filter_.get(), w, conv_.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(p.algo[kFwd]),
        ctx_->Workspace(p.workspace), p.workspace, &zero, p.y.get(), y));
  }

  void RunBackwardData(const Plan& p, int n, const float* dy, const float* w,
                       float* dx, float* patches) {
    if (p.lowered[kData]) {
      for (int s = 0; s < n; s += lowered_.chunk()) {
        const int samples = std::min(lowered_.chunk(), n - s);
        float* dxs = dx + s * d_.in.size();
        Multiply(lowered_.BackwardData(samples), w, dy + s * d_.out.size(), 0,
                 lowered_.identity() ? dxs : patches);
        if (!lowered_.identity()) {
          LaunchFold(ctx_->stream, samples, lowered_.geometry(), patches, dxs);
        }
      }
      return;
    }
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionBackwardData(
        ctx_->cudnn, &one, filter_.get(), w, p.y.get(), dy, conv_.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo[kData]),
        ctx_->Workspace(p.workspace), p.workspace, &zero, p.x.get(),
        padded_ ? scratch_ : dx));
    if (padded_) {
      LaunchCropNhwc(ctx_->stream, n, d_.in.h, d_.in.w, d_.in.c, d_.pad.top,
                     d_.pad.left, x_shape_.h, x_shape_.w, scratch_, dx);
    }
  }

  // `parts`: PartsBytes(p.groups) bytes for the groups' parts
  // (conv_lowering.h).
  void RunBackwardWeights(const Plan& p, int n, const float* x, const float* dy,
                          float* dw, float* patches, float* parts) {
    if (p.lowered[kFilter]) {
      for (int s = 0; s < n; s += lowered_.chunk()) {
        const int samples = std::min(lowered_.chunk(), n - s);
        const float* xs = x + s * d_.in.size();
        const float* dys = dy + s * d_.out.size();
        if (!lowered_.identity()) {
          LaunchUnfold(ctx_->stream, samples, lowered_.geometry(), xs, patches);
          xs = patches;
        }
        // The first chunk sets dw, the others add to it.
        const int groups = ConvLowering::Groups(samples, p.groups);
        if (groups == 1) {
          Multiply(lowered_.BackwardWeights(samples), xs, dys, s == 0 ? 0 : 1,
                   dw);
          continue;
        }
        const int per = samples / groups;
        const MatrixProduct product = lowered_.BackwardWeights(per);
        const int64_t rows = lowered_.Rows64(per);
        const float one = 1, zero = 0;
        DLBATCH_CUBLAS_CHECK(ctx_->blas->SgemmStridedBatched(
            ctx_->cublas, CUBLAS_OP_N, CUBLAS_OP_T, product.m, product.n,
            product.k, &one, xs, product.lda, rows * product.lda, dys,
            product.ldb, rows * product.ldb, &zero, parts, product.ldc,
            lowered_.FilterElements(), groups));
        LaunchSumParts(ctx_->stream, groups, lowered_.FilterElements(), parts,
                       s > 0, dw);
      }
      return;
    }
    if (padded_) x = Pad(n, x);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        ctx_->cudnn, &one, p.x.get(), x, p.y.get(), dy, conv_.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo[kFilter]),
        ctx_->Workspace(p.workspace), p.workspace, &zero, filter_.get(), dw));
  }

  // c = a b (+ c where beta is 1), as `product` says.
  void Multiply(const MatrixProduct& product, const float* a, const float* b,
                float beta, float* c) {
    const float one = 1;
    DLBATCH_CUBLAS_CHECK(ctx_->blas->Sgemm(
        ctx_->cublas, product.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        product.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, product.m, product.n,
        product.k, &one, a, product.lda, b, product.ldb, &beta, c,
        product.ldc));
  }

  // Backward weights' groups for batches of n given at most `most`: what a
  // full chunk splits into, 1 where the parts would pass the lowered cap.
  int GroupsFor(int n, int most) const {
    const int groups = ConvLowering::Groups(std::min(n, lowered_.chunk()),
                                            std::clamp(most, 1, kMostGroups));
    return lowered_.PartsBytes(groups) <= ctx_->lowered_bytes ? groups : 1;
  }

  // The lowered form's workspace in p: the patches of a chunk (where the
  // patches are not x), then backward weights' parts (in groups).
  size_t LoweredBytes(const Plan& p, int n) const {
    size_t bytes = 0;
    if (p.lowered[kFwd] || p.lowered[kData] || p.lowered[kFilter]) {
      bytes = lowered_.WorkspaceBytes(n);
    }
    if (p.lowered[kFilter]) bytes += lowered_.PartsBytes(p.groups);
    return bytes;
  }
  // The workspace as the patches of a chunk, where p runs a direction
  // lowered (else null).
  float* Patches(const Plan& p, int n) {
    const size_t bytes = LoweredBytes(p, n);
    return bytes == 0 ? nullptr : static_cast<float*>(ctx_->Workspace(bytes));
  }
  // The parts after them.
  float* Parts(const Plan& p, int n, float* patches) {
    if (!p.lowered[kFilter] || p.groups == 1) return nullptr;
    return patches + lowered_.WorkspaceBytes(n) / sizeof(float);
  }

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

  // Queues the zero-padded copy of x's n samples into scratch_; returns it.
  const float* Pad(int n, const float* x) {
    LaunchPadNhwc(ctx_->stream, n, d_.in.h, d_.in.w, d_.in.c, d_.pad.top,
                  d_.pad.left, x_shape_.h, x_shape_.w, x, scratch_);
    return scratch_;
  }

  std::string Key(Direction dir, int n) const {
    return absl::StrCat("cuda ", kDirectionNames[dir], " ", name_, " n=", n,
                        ctx_->tf32 ? " tf32" : "");
  }

  // cuDNN's workspace for `algo` in direction `dir`.
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

  // cuDNN's pick by timing (cudnnFind*, PickAlgorithm); -1 if none runs.
  absl::StatusOr<int> CudnnFind(const Plan& p, Direction dir) {
    cudnnHandle_t h = ctx_->cudnn;
    const bool tf32 = ctx_->tf32;
    int returned = 0;
    switch (dir) {
      case kFwd: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithm(
            h, p.x.get(), filter_.get(), conv_.get(), p.y.get(),
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
        return PickAlgorithm(perf, returned, tf32, deterministic_);
      }
      case kData: {
        cudnnConvolutionBwdDataAlgoPerf_t
            perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardDataAlgorithm(
            h, filter_.get(), p.y.get(), conv_.get(), p.x.get(),
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
        return PickAlgorithm(perf, returned, tf32, deterministic_);
      }
      case kFilter: {
        cudnnConvolutionBwdFilterAlgoPerf_t
            perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        DLBATCH_CUDNN_RETURN_IF_ERROR(
            cudnnFindConvolutionBackwardFilterAlgorithm(
                h, p.x.get(), p.y.get(), conv_.get(), filter_.get(),
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf));
        return PickAlgorithm(perf, returned, tf32, deterministic_);
      }
    }
    return -1;
  }

  // Chooses each direction's computation for batches of n:
  // - lowering kAlways: lowered; kNever: cuDNN's pick (tuned or found);
  // - kTimed: a tuned choice where LoadTuning gave one that still holds,
  //   else cuDNN's pick raced against the lowered form (Race), the faster
  //   taken.
  // The choices go to the tuning (the backend's description names a
  // forced lowering, so a tuning cache holds one mode's).
  absl::StatusOr<Plan*> MakePlan(int n) {
    using Lowering = CudaBackendOptions::Lowering;
    auto plan = std::make_unique<Plan>();
    Plan& p = *plan;
    if (absl::Status s = SetNhwc(p.x, n, x_shape_); !s.ok()) return s;
    if (absl::Status s = SetNhwc(p.y, n, d_.out); !s.ok()) return s;
    const Lowering mode = ctx_->lowering;
    size_t bytes[3] = {0, 0, 0};  // cuDNN's, per direction
    bool race[3] = {false, false, false};
    for (Direction dir : {kFwd, kData, kFilter}) {
      if (dir == kData && !d_.input_grad) continue;  // never asked for
      if (mode == Lowering::kAlways) {
        p.lowered[dir] = true;
        if (dir == kFilter) p.groups = GroupsFor(n, ctx_->lowered_groups);
        continue;
      }
      const std::string key = Key(dir, n);
      if (auto it = ctx_->tuning.find(key); it != ctx_->tuning.end()) {
        if (it->second >= kLoweredChoice) {
          if (mode == Lowering::kTimed) {
            p.lowered[dir] = true;
            if (dir == kFilter) {
              p.groups = GroupsFor(n, it->second - kLoweredChoice + 1);
            }
            continue;
          }
        } else if (CudnnBytes(p, dir, it->second, &bytes[dir]) ==
                   CUDNN_STATUS_SUCCESS) {
          p.algo[dir] = it->second;
          continue;
        }
      }
      absl::StatusOr<int> found = CudnnFind(p, dir);
      if (!found.ok()) return found.status();
      if (*found < 0) {
        if (mode == Lowering::kTimed) {
          p.lowered[dir] = true;
          continue;
        }
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": cuDNN has no algorithm for this shape"));
      }
      p.algo[dir] = *found;
      DLBATCH_CUDNN_RETURN_IF_ERROR(CudnnBytes(p, dir, *found, &bytes[dir]));
      race[dir] = mode == Lowering::kTimed;
    }
    // The workspace of the choices.
    auto workspace = [&] {
      size_t most = 0;
      for (Direction dir : {kFwd, kData, kFilter}) {
        most = std::max(most, p.lowered[dir] ? LoweredBytes(p, n) : bytes[dir]);
      }
      return most;
    };
    if (race[kFwd] || race[kData] || race[kFilter]) {
      // cuDNN's candidates run in the workspace, the lowered ones in
      // patches of the race's own (freed after it: the workspace grows for
      // them only where they win).
      p.workspace = workspace();
      if (absl::Status s = ctx_->ReserveWorkspace(p.workspace); !s.ok()) {
        return s;
      }
      if (absl::Status s = Race(n, p, race); !s.ok()) return s;
    }
    p.workspace = workspace();
    if (absl::Status s = ctx_->ReserveWorkspace(p.workspace); !s.ok()) {
      // Where lowered forms won the race but their patches no longer fit
      // beside the rest, cuDNN's picks (which fitted) run instead.
      bool reverted = false;
      for (Direction dir : {kFwd, kData, kFilter}) {
        if (race[dir] && p.lowered[dir]) {
          p.lowered[dir] = false;
          reverted = true;
        }
      }
      if (!reverted) return s;
      p.workspace = workspace();
      if (absl::Status again = ctx_->ReserveWorkspace(p.workspace);
          !again.ok()) {
        return again;
      }
    }
    for (Direction dir : {kFwd, kData, kFilter}) {
      if (dir == kData && !d_.input_grad) continue;
      ctx_->tuning[Key(dir, n)] = !p.lowered[dir] ? p.algo[dir]
                                  : dir == kFilter
                                      ? kLoweredChoice + p.groups - 1
                                      : kLoweredChoice;
    }
    plans_[n] = std::move(plan);
    return plans_[n].get();
  }

  // Times, for each direction marked in `race`, cuDNN's algorithm in `p`
  // (in the workspace, reserved for it) against the lowered form (backward
  // weights in each of kGroupChoices whose parts fit the lowered cap) on n
  // samples of zeros, and sets p.lowered (and p.groups) where that is
  // faster. Where the samples and patches do not fit in memory, keeps
  // cuDNN's.
  absl::Status Race(int n, Plan& p, const bool race[3]) {
    std::vector<int> group_choices;
    size_t parts_bytes = 0;
    for (int g : kGroupChoices) {
      const int groups = GroupsFor(n, g);
      if (race[kFilter] && std::find(group_choices.begin(), group_choices.end(),
                                     groups) == group_choices.end()) {
        group_choices.push_back(groups);
        parts_bytes = std::max(parts_bytes, lowered_.PartsBytes(groups));
      }
    }
    const int64_t in = n * std::max(d_.in.size(), x_shape_.size());
    const int64_t out = n * d_.out.size();
    const int64_t weights = int64_t{d_.filters} * d_.kh * d_.kw * d_.in.c;
    const int64_t patches =
        static_cast<int64_t>(lowered_.WorkspaceBytes(n) / sizeof(float));
    const int64_t parts = static_cast<int64_t>(parts_bytes / sizeof(float));
    // x, dx, y (and dy), w, dw, patches, parts
    float* buffers[7] = {};
    const int64_t counts[7] = {in, in, out, weights, weights, patches, parts};
    auto free_all = [&] {
      for (float* b : buffers) {
        if (b != nullptr) cudaFree(b);  // waits for the device
      }
    };
    for (int i = 0; i < 7; ++i) {
      if (counts[i] == 0) continue;
      if (cudaMalloc(&buffers[i], counts[i] * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it
        free_all();
        return absl::OkStatus();
      }
      if (cudaError_t err = cudaMemsetAsync(
              buffers[i], 0, counts[i] * sizeof(float), ctx_->stream);
          err != cudaSuccess) {
        free_all();
        return CallError(absl::StatusCode::kInternal, "cudaMemsetAsync",
                         __FILE__, __LINE__, cudaGetErrorString(err));
      }
    }
    float *x = buffers[0], *dx = buffers[1], *y = buffers[2], *w = buffers[3],
          *dw = buffers[4], *scratch = buffers[5], *partial = buffers[6];
    absl::Status status;
    for (Direction dir : {kFwd, kData, kFilter}) {
      if (!race[dir]) continue;
      auto run = [&](bool lowered) {
        p.lowered[dir] = lowered;
        switch (dir) {
          case kFwd:
            RunForward(p, n, x, w, y, scratch);
            break;
          case kData:
            RunBackwardData(p, n, y, w, dx, scratch);
            break;
          case kFilter:
            RunBackwardWeights(p, n, x, y, dw, scratch, partial);
            break;
        }
      };
      absl::StatusOr<float> best = TimeOnStream([&] { run(false); });
      // Only backward weights has groups to try; the others run with p's.
      bool lowered = false;
      int groups = p.groups;
      for (int g : dir == kFilter ? group_choices : std::vector<int>{groups}) {
        if (!best.ok()) break;
        p.groups = g;
        absl::StatusOr<float> ms = TimeOnStream([&] { run(true); });
        if (!ms.ok()) {
          best = ms.status();
        } else if (*ms < *best) {
          best = *ms;
          lowered = true;
          groups = g;
        }
      }
      p.lowered[dir] = lowered && best.ok();
      p.groups = dir == kFilter && !p.lowered[dir] ? 1 : groups;
      if (!best.ok()) {
        status = best.status();
        break;
      }
    }
    free_all();
    return status;
  }

  // The mean time of `run`'s work on the stream over a few runs after one
  // more (which loads what a first call loads), in milliseconds.
  absl::StatusOr<float> TimeOnStream(const std::function<void()>& run) {
    constexpr int kRuns = 3;
    cudaEvent_t events[2] = {nullptr, nullptr};
    auto destroy = [&] {
      for (cudaEvent_t e : events) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    };
    for (cudaEvent_t& e : events) {
      if (cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
        destroy();
        return CallError(absl::StatusCode::kInternal, "cudaEventCreate",
                         __FILE__, __LINE__, cudaGetErrorString(err));
      }
    }
    run();
    cudaError_t err = cudaEventRecord(events[0], ctx_->stream);
    for (int i = 0; i < kRuns && err == cudaSuccess; ++i) run();
    if (err == cudaSuccess) err = cudaEventRecord(events[1], ctx_->stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(events[1]);
    float ms = 0;
    if (err == cudaSuccess) {
      err = cudaEventElapsedTime(&ms, events[0], events[1]);
    }
    destroy();
    if (err != cudaSuccess) {
      return CallError(absl::StatusCode::kInternal,
                       "timing a convolution's algorithms", __FILE__, __LINE__,
                       cudaGetErrorString(err));
    }
    return ms / kRuns;
  }

  Context* ctx_;
  const ConvDesc d_;
  const std::string name_;
  FilterDescriptor filter_;
  ConvolutionDescriptor conv_;
  const bool deterministic_ = DeterministicOnly();
  // Asymmetric padding: cuDNN runs on a zero-padded copy of x (see the top)
  // of shape x_shape_ in scratch_ (device, max_batch samples); else
  // x_shape_ is d_.in and scratch_ null. The lowered form pads as it
  // unfolds and needs neither.
  const bool padded_;
  const Shape x_shape_;
  const ConvLowering lowered_;
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
