// Pooling on the GPU over NHWC activations. Max pooling whose windows tile
// the input (stride = size, no padding: LeNet's 2x2/2) runs our kernels
// (gpu_layer_kernels.cu), which record each window's argmax in the
// workspace: cuDNN's deterministic max backward, which finds the maximum
// again from the input and output, took 215 us where ours takes about 20
// on LeNet's first pooling at batch 1024. Pooling with asymmetric padding
// (`same` with an even window, or a stride over an even size), which cuDNN
// cannot describe, runs our direct kernels: max records its argmax (int32
// per output) in the workspace. Other max pooling (overlapping windows,
// symmetric padding) and average pooling (padding excluded) are cuDNN's,
// whose backward needs no workspace.
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"

namespace dlbatch::trainer::gpu {
namespace {

class GpuPool final : public PoolKernel {
 public:
  GpuPool(Context* ctx, const PoolDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat(
            desc.kind == PoolKind::kMax ? "max" : "average", " pooling ",
            desc.in.ToString(), " -> ", desc.out.ToString(), " (", desc.kh, "x",
            desc.kw, ", stride ", desc.stride_h, "x", desc.stride_w, ")")),
        tiled_(desc.kind == PoolKind::kMax && desc.stride_h == desc.kh &&
               desc.stride_w == desc.kw && desc.pad.top == 0 &&
               desc.pad.bottom == 0 && desc.pad.left == 0 &&
               desc.pad.right == 0 && desc.kh * desc.kw <= 256 &&
               desc.out.h == desc.in.h / desc.kh &&
               desc.out.w == desc.in.w / desc.kw && desc.out.c == desc.in.c),
        direct_(!desc.pad.symmetric()),
        tensors_(max_batch + 1) {}

  absl::Status Prepare(int max_batch) {
    if (direct_) {
      // Our kernels read the shapes as given: check what cuDNN would.
      if (d_.kh < 1 || d_.kw < 1 || d_.stride_h < 1 || d_.stride_w < 1 ||
          d_.pad.negative()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": a window, stride or padding out of range"));
      }
      const int oh =
          (d_.in.h + d_.pad.top + d_.pad.bottom - d_.kh) / d_.stride_h + 1;
      const int ow =
          (d_.in.w + d_.pad.left + d_.pad.right - d_.kw) / d_.stride_w + 1;
      if (d_.out.h != oh || d_.out.w != ow || d_.out.c != d_.in.c) {
        return absl::InvalidArgumentError(absl::StrCat(
            name_, ": padding ", d_.pad.top, ",", d_.pad.left, ",",
            d_.pad.bottom, ",", d_.pad.right, " gives an output of [", oh, ", ",
            ow, ", ", d_.in.c, "], not ", d_.out.ToString()));
      }
      return absl::OkStatus();
    }
    // The deterministic max: its backward adds no gradients with atomics.
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetPooling2dDescriptor(
        pool_.get(),
        d_.kind == PoolKind::kMax ? CUDNN_POOLING_MAX_DETERMINISTIC
                                  : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
        CUDNN_NOT_PROPAGATE_NAN, d_.kh, d_.kw, d_.pad.top, d_.pad.left,
        d_.stride_h, d_.stride_w));
    absl::StatusOr<Tensors*> t = MakeTensors(max_batch);
    if (!t.ok()) return t.status();
    int n = 0, c = 0, h = 0, w = 0;
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnGetPooling2dForwardOutputDim(
        pool_.get(), (*t)->x.get(), &n, &c, &h, &w));
    if (c != d_.out.c || h != d_.out.h || w != d_.out.w) {
      return absl::InternalError(
          absl::StrCat(name_, ": cuDNN computes an output of [", h, ", ", w,
                       ", ", c, "], not ", d_.out.ToString()));
    }
    return absl::OkStatus();
  }

  size_t WorkspaceBytes(int n) const override {
    if (direct_) {
      return d_.kind == PoolKind::kMax
                 ? static_cast<size_t>(n) * d_.out.size() * sizeof(int32_t)
                 : 0;
    }
    return tiled_ ? static_cast<size_t>(n) * d_.out.size() : 0;
  }

  void Forward(int n, const float* x, float* y, void* workspace) override {
    if (direct_) {
      CheckBatch(n);
      LaunchPoolPaddedForward(
          ctx_->stream, d_.kind == PoolKind::kMax, n, d_.in.h, d_.in.w, d_.in.c,
          d_.kh, d_.kw, d_.stride_h, d_.stride_w, d_.pad.top, d_.pad.left,
          d_.out.h, d_.out.w, x, y,
          d_.kind == PoolKind::kMax ? static_cast<int32_t*>(workspace)
                                    : nullptr);
      return;
    }
    if (tiled_) {
      LaunchMaxPoolTiledForward(ctx_->stream, n, d_.in.h, d_.in.w, d_.in.c,
                                d_.kh, d_.kw, d_.out.h, d_.out.w, x, y,
                                static_cast<uint8_t*>(workspace));
      return;
    }
    Tensors& t = TensorsFor(n);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnPoolingForward(ctx_->cudnn, pool_.get(), &one,
                                            t.x.get(), x, &zero, t.y.get(), y));
  }

  void Backward(int n, const float* x, const float* y, const float* dy,
                const void* workspace, float* dx) override {
    if (direct_) {
      CheckBatch(n);
      if (d_.kind == PoolKind::kMax && workspace == nullptr) {
        Die(name_.c_str(), __FILE__, __LINE__,
            "backward without the argmax a training forward records");
      }
      LaunchPoolPaddedBackward(
          ctx_->stream, d_.kind == PoolKind::kMax, n, d_.in.h, d_.in.w, d_.in.c,
          d_.kh, d_.kw, d_.stride_h, d_.stride_w, d_.pad.top, d_.pad.left,
          d_.out.h, d_.out.w, static_cast<const int32_t*>(workspace), dy, dx);
      return;
    }
    if (tiled_) {
      if (workspace == nullptr) {
        Die(name_.c_str(), __FILE__, __LINE__,
            "backward without the argmax a training forward records");
      }
      LaunchMaxPoolTiledBackward(
          ctx_->stream, n, d_.in.h, d_.in.w, d_.in.c, d_.kh, d_.kw, d_.out.h,
          d_.out.w, static_cast<const uint8_t*>(workspace), dy, dx);
      return;
    }
    Tensors& t = TensorsFor(n);
    const float one = 1, zero = 0;
    DLBATCH_CUDNN_CHECK(cudnnPoolingBackward(
        ctx_->cudnn, pool_.get(), &one, t.y.get(), y, t.y.get(), dy, t.x.get(),
        x, &zero, t.x.get(), dx));
  }

 private:
  struct Tensors {
    TensorDescriptor x, y;
  };

  absl::StatusOr<Tensors*> MakeTensors(int n) {
    auto t = std::make_unique<Tensors>();
    if (absl::Status s = SetNhwc(t->x, n, d_.in); !s.ok()) return s;
    if (absl::Status s = SetNhwc(t->y, n, d_.out); !s.ok()) return s;
    tensors_[n] = std::move(t);
    return tensors_[n].get();
  }

  void CheckBatch(int n) const {
    if (n < 1 || n >= static_cast<int>(tensors_.size())) {
      Die(name_.c_str(), __FILE__, __LINE__,
          absl::StrCat("batch size ", n, " outside [1, ", tensors_.size() - 1,
                       "]")
              .c_str());
    }
  }

  Tensors& TensorsFor(int n) {
    CheckBatch(n);
    if (tensors_[n] == nullptr) {
      absl::StatusOr<Tensors*> t = MakeTensors(n);
      if (!t.ok()) {
        Die(name_.c_str(), __FILE__, __LINE__,
            std::string(t.status().message()).c_str());
      }
    }
    return *tensors_[n];
  }

  Context* ctx_;
  const PoolDesc d_;
  const std::string name_;
  const bool tiled_;   // max pooling by our kernels (see the top)
  const bool direct_;  // asymmetric padding: our direct kernels
  PoolingDescriptor pool_;
  std::vector<std::unique_ptr<Tensors>> tensors_;  // by batch size
};

}  // namespace

absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(Context* ctx,
                                                     const PoolDesc& desc,
                                                     int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pooling: max_batch must be >= 1, not ", max_batch));
  }
  auto kernel = std::make_unique<GpuPool>(ctx, desc, max_batch);
  if (absl::Status s = kernel->Prepare(max_batch); !s.ok()) return s;
  return kernel;
}

}  // namespace dlbatch::trainer::gpu
