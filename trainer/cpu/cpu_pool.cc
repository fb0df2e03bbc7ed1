// Pooling on the CPU: oneDNN's max and average (padding excluded) pooling
// over NHWC activations. Max pooling records its argmax in the caller's
// workspace during training, for Backward.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "trainer/backend.h"
#include "trainer/cpu/backend_cpu_internal.h"

namespace dlbatch::trainer::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

class CpuPool final : public PoolKernel {
 public:
  CpuPool(const Context* ctx, const PoolDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat(
            desc.kind == PoolKind::kMax ? "max" : "average", " pooling ",
            desc.in.ToString(), " -> ", desc.out.ToString(), " (", desc.kh, "x",
            desc.kw, ", stride ", desc.stride_h, "x", desc.stride_w, ")")),
        cache_(max_batch) {}

  absl::Status Prepare(int n) {
    return TryCreate(name_, n, [&] {
      Fwd(n, /*training=*/true);
      Fwd(n, /*training=*/false);
      Bwd(n);
    });
  }

  size_t WorkspaceBytes(int n) const override {
    if (d_.kind != PoolKind::kMax) return 0;
    size_t bytes = 0;
    DLBATCH_DNNL_RUN(bytes = FwdPd(n, true).workspace_desc().get_size());
    return bytes;
  }

  void Forward(int n, const float* x, float* y, void* workspace) override {
    const bool training = workspace != nullptr && d_.kind == PoolKind::kMax;
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Fwd(n, training));
    if (training) {
      p->Run({x, y, workspace});
    } else {
      p->Run({x, y});
    }
  }

  void Backward(int n, const float* /*x*/, const float* /*y*/, const float* dy,
                const void* workspace, float* dx) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &Bwd(n));
    if (d_.kind == PoolKind::kMax) {
      p->Run({dy, workspace, dx});
    } else {
      p->Run({dy, dx});
    }
  }

 private:
  struct Prims {
    std::optional<dnnl::pooling_forward::primitive_desc> pd[2];
    std::optional<BoundPrimitive> fwd[2], bwd;
  };

  memory::desc Src(int n) const {
    return memory::desc({n, d_.in.c, d_.in.h, d_.in.w}, dt::f32, tag::nhwc);
  }
  memory::desc Dst(int n) const {
    return memory::desc({n, d_.out.c, d_.out.h, d_.out.w}, dt::f32, tag::nhwc);
  }
  dnnl::algorithm Algorithm() const {
    return d_.kind == PoolKind::kMax
               ? dnnl::algorithm::pooling_max
               : dnnl::algorithm::pooling_avg_exclude_padding;
  }
  memory::dims Strides() const { return {d_.stride_h, d_.stride_w}; }
  memory::dims Kernel() const { return {d_.kh, d_.kw}; }
  memory::dims PadL() const { return {d_.pad.top, d_.pad.left}; }
  memory::dims PadR() const { return {d_.pad.bottom, d_.pad.right}; }
  dnnl::primitive_attr Attr() const {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  const dnnl::pooling_forward::primitive_desc& FwdPd(int n,
                                                     bool training) const {
    Prims& p = cache_[n];
    auto& pd = p.pd[training];
    if (!pd) {
      dnnl::pooling_forward::desc desc(
          training ? dnnl::prop_kind::forward_training
                   : dnnl::prop_kind::forward_inference,
          Algorithm(), Src(n), Dst(n), Strides(), Kernel(), PadL(), PadR());
      pd.emplace(desc, Attr(), ctx_->engine);
    }
    return *pd;
  }

  BoundPrimitive& Fwd(int n, bool training) {
    auto& fwd = cache_[n].fwd[training];
    if (!fwd) {
      const auto& pd = FwdPd(n, training);
      fwd.emplace(ctx_, name_ + " forward", dnnl::pooling_forward(pd),
                  pd.scratchpad_desc());
      fwd->AddInput(DNNL_ARG_SRC, Src(n), pd.src_desc());
      fwd->AddOutput(DNNL_ARG_DST, Dst(n), pd.dst_desc());
      if (training && d_.kind == PoolKind::kMax) {
        fwd->AddOutput(DNNL_ARG_WORKSPACE, pd.workspace_desc(),
                       pd.workspace_desc());
      }
    }
    return *fwd;
  }

  BoundPrimitive& Bwd(int n) {
    auto& bwd = cache_[n].bwd;
    if (!bwd) {
      const auto& fwd_pd = FwdPd(n, true);
      dnnl::pooling_backward::desc desc(Algorithm(), Src(n), Dst(n), Strides(),
                                        Kernel(), PadL(), PadR());
      dnnl::pooling_backward::primitive_desc pd(desc, Attr(), ctx_->engine,
                                                fwd_pd);
      bwd.emplace(ctx_, name_ + " backward", dnnl::pooling_backward(pd),
                  pd.scratchpad_desc());
      bwd->AddInput(DNNL_ARG_DIFF_DST, Dst(n), pd.diff_dst_desc());
      if (d_.kind == PoolKind::kMax) {
        bwd->AddInput(DNNL_ARG_WORKSPACE, fwd_pd.workspace_desc(),
                      fwd_pd.workspace_desc());
      }
      bwd->AddOutput(DNNL_ARG_DIFF_SRC, Src(n), pd.diff_src_desc());
    }
    return *bwd;
  }

  const Context* ctx_;
  const PoolDesc d_;
  const std::string name_;
  mutable PerBatch<Prims> cache_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(const Context* ctx,
                                                     const PoolDesc& desc,
                                                     int max_batch) {
  return MakePrepared<CpuPool>(ctx, desc, max_batch);
}

}  // namespace dlbatch::trainer::cpu
