// Convolution on the CPU: oneDNN's forward, backward-data and
// backward-weights primitives over NHWC activations and OHWI weights.
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
using Args = std::vector<std::pair<int, memory::desc>>;

// Weights take the layout oneDNN prefers (tag::any): with plain OHWI it
// offers only its reference loops. They are reordered from and to OHWI
// around each call, which costs little next to the convolution itself.
// Activations stay NHWC: blocked layouts measured no faster on LeNet's
// shapes even before counting the reorders they need between layers. Of
// the implementations oneDNN offers, the fastest on this machine is timed
// and kept (PickFastest).
//
// In bf16 (Context::compute), each primitive takes its inputs in bf16
// (reordered, rounding, from the float32 user tensors: x, w and dy) and
// writes float32 (y, dx, and the weight and bias gradients), which oneDNN's
// bf16 convolutions offer. Next to a batch norm (ConvDesc::bf16_out,
// bf16_in) y and dy, or x and dx, are bf16 themselves: no conversion, and
// half the bytes for the batch norm to read and write.

class CpuConv final : public WeightedKernel<CpuConv, ConvKernel> {
 public:
  CpuConv(const Context* ctx, const ConvDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat(
            ctx->bf16() ? "bf16 " : "", "convolution ", desc.in.ToString(),
            " -> ", desc.out.ToString(), desc.bf16_in ? " from bf16" : "",
            desc.bf16_out ? " in bf16" : "", " (", desc.kh, "x", desc.kw,
            ", stride ", desc.stride_h, "x", desc.stride_w, ")")),
        cache_(max_batch) {}

 private:
  friend class WeightedKernel<CpuConv, ConvKernel>;

  bool wants_dx() const { return d_.input_grad; }

  struct Prims {
    std::optional<dnnl::convolution_forward::primitive_desc> fwd_pd;
    std::optional<BoundPrimitive> fwd, bwd_data, bwd_weights;
  };

  // The user tensors are float32 but x and dx, in `UserIn()`, and y and dy,
  // in `Out()` (bf16 next to a batch norm, ConvDesc); a primitive's inputs
  // are in `In()`.
  dt In() const { return ctx_->compute; }
  dt Out() const { return d_.bf16_out ? dt::bf16 : dt::f32; }
  dt UserIn() const { return d_.bf16_in ? dt::bf16 : dt::f32; }
  memory::desc Src(int n, dt t = dt::f32) const {
    return memory::desc({n, d_.in.c, d_.in.h, d_.in.w}, t, tag::nhwc);
  }
  memory::desc Dst(int n, dt t = dt::f32, tag layout = tag::nhwc) const {
    return memory::desc({n, d_.filters, d_.out.h, d_.out.w}, t, layout);
  }
  memory::desc Weights(tag t = tag::ohwi, dt type = dt::f32) const {
    return memory::desc({d_.filters, d_.in.c, d_.kh, d_.kw}, type, t);
  }
  memory::desc Bias() const {
    return memory::desc({d_.filters}, dt::f32, tag::x);
  }
  memory::desc WeightsAny(dt t = dt::f32) const { return Weights(tag::any, t); }
  memory::dims Strides() const { return {d_.stride_h, d_.stride_w}; }
  memory::dims PadL() const { return {d_.pad.top, d_.pad.left}; }
  memory::dims PadR() const { return {d_.pad.bottom, d_.pad.right}; }

  dnnl::primitive_attr Attr() const {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  const dnnl::convolution_forward::primitive_desc& FwdPd(int n) {
    Prims& p = cache_[n];
    if (!p.fwd_pd) {
      using Pd = dnnl::convolution_forward::primitive_desc;
      // oneDNN's implementation iterator points at desc: it must outlive
      // the search.
      const dnnl::convolution_forward::desc desc(
          dnnl::prop_kind::forward_training,
          dnnl::algorithm::convolution_direct, Src(n, In()), WeightsAny(In()),
          Bias(), Dst(n, Out()), Strides(), PadL(), PadR());
      p.fwd_pd.emplace(PickFastest<Pd, dnnl::convolution_forward>(
          ctx_, absl::StrCat(name_, " forward, n ", n), 1,
          [&](int) { return Pd(desc, Attr(), ctx_->engine); },
          [](const Pd& pd) -> Args {
            return {{DNNL_ARG_SRC, pd.src_desc()},
                    {DNNL_ARG_WEIGHTS, pd.weights_desc()},
                    {DNNL_ARG_BIAS, pd.bias_desc()},
                    {DNNL_ARG_DST, pd.dst_desc()}};
          },
          {{DNNL_ARG_SRC, Src(n, UserIn())},
           {DNNL_ARG_WEIGHTS, Weights()},
           {DNNL_ARG_DST, Dst(n, Out()), /*output=*/true}}));
    }
    return *p.fwd_pd;
  }

  BoundPrimitive& Fwd(int n) {
    Prims& p = cache_[n];
    if (!p.fwd) {
      BindForward<dnnl::convolution_forward>(&p.fwd, FwdPd(n), Src(n, UserIn()),
                                             Weights(), Bias(), Dst(n, Out()));
    }
    return *p.fwd;
  }

  BoundPrimitive& BwdData(int n) {
    Prims& p = cache_[n];
    if (!p.bwd_data) {
      using Pd = dnnl::convolution_backward_data::primitive_desc;
      const auto& hint = FwdPd(n);
      const dnnl::convolution_backward_data::desc desc(
          dnnl::algorithm::convolution_direct, Src(n, UserIn()),
          WeightsAny(In()), Dst(n, In()), Strides(), PadL(), PadR());
      const Pd pd = PickFastest<Pd, dnnl::convolution_backward_data>(
          ctx_, absl::StrCat(name_, " backward data, n ", n), 1,
          [&](int) { return Pd(desc, Attr(), ctx_->engine, hint); },
          [](const Pd& pd) -> Args {
            return {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc()},
                    {DNNL_ARG_WEIGHTS, pd.weights_desc()},
                    {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()}};
          },
          {{DNNL_ARG_DIFF_DST, Dst(n, Out())},
           {DNNL_ARG_WEIGHTS, Weights()},
           {DNNL_ARG_DIFF_SRC, Src(n, UserIn()), /*output=*/true}});
      BindBackwardData<dnnl::convolution_backward_data>(
          &p.bwd_data, n, pd, Src(n, UserIn()), Dst(n, Out()), Weights());
    }
    return *p.bwd_data;
  }

  BoundPrimitive& BwdWeights(int n) {
    Prims& p = cache_[n];
    if (!p.bwd_weights) {
      using Pd = dnnl::convolution_backward_weights::primitive_desc;
      const auto& hint = FwdPd(n);
      // dy in oneDNN's own layout too, where the filters are not a multiple
      // of 16: NHWC kernels vectorise over channels in 16s, and on LeNet's
      // first layer (20 filters over one channel) the blocked layout with
      // its reorder takes 0.20 ms against NHWC's 0.29. Not in bf16, whose
      // dy is converted once for both backward passes in their one layout.
      const dnnl::convolution_backward_weights::desc descs[2] = {
          {dnnl::algorithm::convolution_direct, Src(n, In()), WeightsAny(),
           Bias(), Dst(n, In()), Strides(), PadL(), PadR()},
          {dnnl::algorithm::convolution_direct, Src(n, In()), WeightsAny(),
           Bias(), Dst(n, In(), tag::any), Strides(), PadL(), PadR()}};
      const int layouts = !ctx_->bf16() && d_.filters % 16 != 0 ? 2 : 1;
      const Pd pd = PickFastest<Pd, dnnl::convolution_backward_weights>(
          ctx_, absl::StrCat(name_, " backward weights, n ", n), layouts,
          [&](int v) { return Pd(descs[v], Attr(), ctx_->engine, hint); },
          [](const Pd& pd) -> Args {
            return {{DNNL_ARG_SRC, pd.src_desc()},
                    {DNNL_ARG_DIFF_DST, pd.diff_dst_desc()},
                    {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc()},
                    {DNNL_ARG_DIFF_BIAS, pd.diff_bias_desc()}};
          },
          {{DNNL_ARG_SRC, Src(n, UserIn())},
           {DNNL_ARG_DIFF_DST, Dst(n, Out())},
           {DNNL_ARG_DIFF_WEIGHTS, Weights(), /*output=*/true}});
      BindBackwardWeights<dnnl::convolution_backward_weights>(
          &p.bwd_weights, n, pd, Src(n, UserIn()), Dst(n, Out()), Weights(),
          Bias());
    }
    return *p.bwd_weights;
  }

  const Context* ctx_;
  const ConvDesc d_;
  const std::string name_;
  PerBatch<Prims> cache_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(const Context* ctx,
                                                     const ConvDesc& desc,
                                                     int max_batch) {
  return MakePrepared<CpuConv>(ctx, desc, max_batch);
}

}  // namespace dlbatch::trainer::cpu
