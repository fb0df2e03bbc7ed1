// Batch normalisation on the CPU: oneDNN's batch-normalization primitives
// over NHWC activations with a separate scale and shift; the running
// statistics are moved by a small loop over the channels. A folded relu
// (BatchNormDesc::relu) is oneDNN's fuse_norm_relu: the forward keeps a
// mask of the outputs it zeroed (the workspace), which the backward applies
// to dy as it reads it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "trainer/backend.h"
#include "trainer/cpu/backend_cpu_internal.h"

namespace dlbatch::trainer::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using flags = dnnl::normalization_flags;

class CpuBatchNorm final : public BatchNormKernel {
 public:
  CpuBatchNorm(const Context* ctx, const BatchNormDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat("batch normalization ", desc.in.ToString(),
                           desc.relu ? " with relu" : "",
                           desc.bf16_in ? " from bf16" : "",
                           desc.bf16_out ? " in bf16" : "",
                           desc.spans_ranks ? " over ranks" : "")),
        cache_(max_batch) {}

  absl::Status Prepare(int n) {
    return TryCreate(name_, n, [&] {
      Inference(n);
      Training(n, d_.spans_ranks);
      Bwd(n, d_.spans_ranks);
    });
  }

  // Over ranks: oneDNN's passes with the statistics given
  // (use_global_stats), which then take them as constants; SpanFinish
  // adds the terms of their gradients to dx.
  void SpanSums(int n, const float* x, const float* shift,
                float* sums) override {
    const int c = d_.in.c;
    ChannelSums(Rows(n), c, x, d_.bf16_in, shift, sums);
    sums[2 * c] = static_cast<float>(n);
  }

  void SpanForward(int n, const float* x, const float* gamma, const float* beta,
                   const float* shift, const float* sums, float* y,
                   float* saved_mean, float* saved_var, float* running_mean,
                   float* running_var, float momentum) override {
    const int c = d_.in.c;
    const double m = double{sums[2 * c]} * d_.in.h * d_.in.w;
    for (int ch = 0; ch < c; ++ch) {
      const double mean = sums[ch] / m;
      saved_mean[ch] = static_cast<float>(shift[ch] + mean);
      saved_var[ch] =
          static_cast<float>(std::max(0.0, sums[c + ch] / m - mean * mean));
    }
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Training(n, /*global=*/true));
    if (d_.relu) {
      p->Run({x, gamma, beta, saved_mean, saved_var, y, workspace_.data()});
    } else {
      p->Run({x, gamma, beta, saved_mean, saved_var, y});
    }
    for (int ch = 0; ch < c; ++ch) {
      running_mean[ch] =
          (1 - momentum) * running_mean[ch] + momentum * saved_mean[ch];
      running_var[ch] =
          (1 - momentum) * running_var[ch] + momentum * saved_var[ch];
    }
  }

  void SpanBackward(int n, const float* x, const float* dy, const float* gamma,
                    const float* saved_mean, const float* saved_var, float* dx,
                    float* dgamma, float* dbeta, float* sums) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Bwd(n, /*global=*/true));
    if (d_.relu) {
      p->Run({x, dy, gamma, gamma, saved_mean, saved_var, workspace_.data(), dx,
              dgamma, dbeta});
    } else {
      p->Run({x, dy, gamma, gamma, saved_mean, saved_var, dx, dgamma, dbeta});
    }
    const int c = d_.in.c;
    for (int ch = 0; ch < c; ++ch) {
      sums[ch] = dgamma[ch];
      sums[c + ch] = dbeta[ch];
    }
    sums[2 * c] = static_cast<float>(n);
  }

  void SpanFinish(int n, const float* x, const float* gamma,
                  const float* saved_mean, const float* saved_var,
                  const float* sums, float* dx) override {
    const int c = d_.in.c;
    const double m = double{sums[2 * c]} * d_.in.h * d_.in.w;
    // dx -= g * (dbeta / m + xhat * dgamma / m), g = gamma / sigma and
    // xhat = (x - mean) / sigma: dx += a + b * x.
    std::vector<float> a(c), b(c);
    for (int ch = 0; ch < c; ++ch) {
      const double inv = 1.0 / std::sqrt(double{saved_var[ch]} + d_.epsilon);
      const double g = gamma[ch] * inv;
      const double slope = -g * inv * sums[ch] / m;
      b[ch] = static_cast<float>(slope);
      a[ch] =
          static_cast<float>(-g * sums[c + ch] / m - slope * saved_mean[ch]);
    }
    ChannelAffineAdd(Rows(n), c, x, d_.bf16_in, a.data(), b.data(), dx);
  }

  void ForwardTraining(int n, const float* x, const float* gamma,
                       const float* beta, float* y, float* saved_mean,
                       float* saved_var, float* running_mean,
                       float* running_var, float momentum) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Training(n));
    if (d_.relu) {
      p->Run({x, gamma, beta, y, saved_mean, saved_var, workspace_.data()});
    } else {
      p->Run({x, gamma, beta, y, saved_mean, saved_var});
    }
    for (int c = 0; c < d_.in.c; ++c) {
      running_mean[c] =
          (1 - momentum) * running_mean[c] + momentum * saved_mean[c];
      running_var[c] =
          (1 - momentum) * running_var[c] + momentum * saved_var[c];
    }
  }

  void ForwardInference(int n, const float* x, const float* gamma,
                        const float* beta, const float* running_mean,
                        const float* running_var, float* y) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Inference(n));
    p->Run({x, gamma, beta, running_mean, running_var, y});
  }

  void Backward(int n, const float* x, const float* dy, const float* gamma,
                const float* saved_mean, const float* saved_var, float* dx,
                float* dgamma, float* dbeta) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Bwd(n));
    // oneDNN 2.6 will not run backward without a shift argument, which it
    // never reads: gamma stands in.
    if (d_.relu) {
      p->Run({x, dy, gamma, gamma, saved_mean, saved_var, workspace_.data(), dx,
              dgamma, dbeta});
    } else {
      p->Run({x, dy, gamma, gamma, saved_mean, saved_var, dx, dgamma, dbeta});
    }
  }

 private:
  struct Prims {
    std::optional<dnnl::batch_normalization_forward::primitive_desc> train_pd,
        global_pd;
    std::optional<BoundPrimitive> train, infer, bwd, global_train, global_bwd;
  };

  int64_t Rows(int n) const { return int64_t{n} * d_.in.h * d_.in.w; }

  // The primitives' data type, and x's and dx's: bf16 where the input is
  // (BatchNormDesc::bf16_in); y and dy are float32 unless the output goes
  // to a convolution in bf16 (UserData).
  memory::desc Data(int n) const {
    return memory::desc({n, d_.in.c, d_.in.h, d_.in.w},
                        d_.bf16_in ? dt::bf16 : dt::f32, tag::nhwc);
  }
  memory::desc UserData(int n) const {
    return memory::desc({n, d_.in.c, d_.in.h, d_.in.w},
                        d_.bf16_out ? dt::bf16 : dt::f32, tag::nhwc);
  }
  memory::desc Channels() const {
    return memory::desc({d_.in.c}, dt::f32, tag::x);
  }
  flags Flags() const {
    return d_.relu ? flags::use_scale | flags::use_shift | flags::fuse_norm_relu
                   : flags::use_scale | flags::use_shift;
  }
  dnnl::primitive_attr Attr() const {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  // The training passes; `global`: with the statistics given (inputs, as
  // SpanForward's), not the batch's (outputs).
  const dnnl::batch_normalization_forward::primitive_desc& TrainPd(
      int n, bool global) {
    auto& pd = global ? cache_[n].global_pd : cache_[n].train_pd;
    if (!pd) {
      dnnl::batch_normalization_forward::desc desc(
          dnnl::prop_kind::forward_training, Data(n), d_.epsilon,
          global ? flags::use_global_stats | Flags() : Flags());
      pd.emplace(desc, Attr(), ctx_->engine);
    }
    return *pd;
  }

  BoundPrimitive& Training(int n, bool global = false) {
    auto& p = global ? cache_[n].global_train : cache_[n].train;
    if (!p) {
      const auto& pd = TrainPd(n, global);
      p.emplace(ctx_,
                name_ + (global ? " forward training over ranks"
                                : " forward training"),
                dnnl::batch_normalization_forward(pd), pd.scratchpad_desc());
      p->AddInput(DNNL_ARG_SRC, Data(n), pd.src_desc());
      p->AddInput(DNNL_ARG_SCALE, Channels(), Channels());
      p->AddInput(DNNL_ARG_SHIFT, Channels(), Channels());
      if (global) {
        p->AddInput(DNNL_ARG_MEAN, Channels(), pd.mean_desc());
        p->AddInput(DNNL_ARG_VARIANCE, Channels(), pd.variance_desc());
      }
      p->AddOutput(DNNL_ARG_DST, UserData(n), pd.dst_desc());
      if (!global) {
        p->AddOutput(DNNL_ARG_MEAN, Channels(), pd.mean_desc());
        p->AddOutput(DNNL_ARG_VARIANCE, Channels(), pd.variance_desc());
      }
      if (d_.relu) {
        // One buffer for every batch size: only a training forward and the
        // backward of the same batch use it, one after the other.
        const size_t bytes = pd.workspace_desc().get_size();
        if (bytes > workspace_.size()) workspace_.resize(bytes);
        p->AddOutput(DNNL_ARG_WORKSPACE, pd.workspace_desc(),
                     pd.workspace_desc());
      }
    }
    return *p;
  }

  BoundPrimitive& Inference(int n) {
    Prims& p = cache_[n];
    if (!p.infer) {
      dnnl::batch_normalization_forward::desc desc(
          dnnl::prop_kind::forward_inference, Data(n), d_.epsilon,
          flags::use_global_stats | Flags());
      dnnl::batch_normalization_forward::primitive_desc pd(desc, Attr(),
                                                           ctx_->engine);
      p.infer.emplace(ctx_, name_ + " forward inference",
                      dnnl::batch_normalization_forward(pd),
                      pd.scratchpad_desc());
      p.infer->AddInput(DNNL_ARG_SRC, Data(n), pd.src_desc());
      p.infer->AddInput(DNNL_ARG_SCALE, Channels(), Channels());
      p.infer->AddInput(DNNL_ARG_SHIFT, Channels(), Channels());
      p.infer->AddInput(DNNL_ARG_MEAN, Channels(), pd.mean_desc());
      p.infer->AddInput(DNNL_ARG_VARIANCE, Channels(), pd.variance_desc());
      p.infer->AddOutput(DNNL_ARG_DST, UserData(n), pd.dst_desc());
    }
    return *p.infer;
  }

  BoundPrimitive& Bwd(int n, bool global = false) {
    auto& p = global ? cache_[n].global_bwd : cache_[n].bwd;
    if (!p) {
      dnnl::batch_normalization_backward::desc desc(
          dnnl::prop_kind::backward, Data(n), Data(n), d_.epsilon,
          global ? flags::use_global_stats | Flags() : Flags());
      dnnl::batch_normalization_backward::primitive_desc pd(
          desc, Attr(), ctx_->engine, TrainPd(n, global));
      p.emplace(ctx_, name_ + (global ? " backward over ranks" : " backward"),
                dnnl::batch_normalization_backward(pd), pd.scratchpad_desc());
      p->AddInput(DNNL_ARG_SRC, Data(n), pd.src_desc());
      p->AddInput(DNNL_ARG_DIFF_DST, UserData(n), pd.diff_dst_desc());
      p->AddInput(DNNL_ARG_SCALE, Channels(), Channels());
      p->AddInput(DNNL_ARG_SHIFT, Channels(), Channels());
      p->AddInput(DNNL_ARG_MEAN, Channels(), pd.mean_desc());
      p->AddInput(DNNL_ARG_VARIANCE, Channels(), pd.variance_desc());
      if (d_.relu) {
        p->AddInput(DNNL_ARG_WORKSPACE, pd.workspace_desc(),
                    pd.workspace_desc());
      }
      p->AddOutput(DNNL_ARG_DIFF_SRC, Data(n), pd.diff_src_desc());
      p->AddOutput(DNNL_ARG_DIFF_SCALE, Channels(), Channels());
      p->AddOutput(DNNL_ARG_DIFF_SHIFT, Channels(), Channels());
    }
    return *p;
  }

  const Context* ctx_;
  const BatchNormDesc d_;
  const std::string name_;
  PerBatch<Prims> cache_;
  // The relu's mask from the last training forward (d_.relu), sized for the
  // largest batch made so far.
  std::vector<uint8_t> workspace_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
    const Context* ctx, const BatchNormDesc& desc, int max_batch) {
  return MakePrepared<CpuBatchNorm>(ctx, desc, max_batch);
}

}  // namespace dlbatch::trainer::cpu
