// Fully connected layers on the CPU: oneDNN's inner-product primitives,
// x (n, in) times weights [units, in] (row-major) plus bias.
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

// Plain layouts throughout: oneDNN runs them as one GEMM each (x64:gemm:jit).
class CpuFc final : public WeightedKernel<CpuFc, FcKernel> {
 public:
  CpuFc(const Context* ctx, const FcDesc& desc, int max_batch)
      : ctx_(ctx),
        d_(desc),
        name_(absl::StrCat(ctx->bf16() ? "bf16 " : "", "inner product ",
                           desc.in, " -> ", desc.units)),
        cache_(max_batch) {}

 private:
  friend class WeightedKernel<CpuFc, FcKernel>;

  bool wants_dx() const { return true; }

  struct Prims {
    std::optional<dnnl::inner_product_forward::primitive_desc> fwd_pd;
    std::optional<BoundPrimitive> fwd, bwd_data, bwd_weights;
  };

  // The user tensors are float32; a primitive's inputs are in `In()`, and
  // in bf16 its weights in the layout oneDNN prefers for them.
  dt In() const { return ctx_->compute; }
  memory::desc Src(int n, dt t = dt::f32) const {
    return memory::desc({n, d_.in}, t, tag::nc);
  }
  memory::desc Dst(int n, dt t = dt::f32) const {
    return memory::desc({n, d_.units}, t, tag::nc);
  }
  memory::desc Weights(dt t = dt::f32) const {
    return memory::desc({d_.units, d_.in}, t,
                        t == dt::f32 ? tag::oi : tag::any);
  }
  memory::desc Bias() const {
    return memory::desc({d_.units}, dt::f32, tag::x);
  }

  dnnl::primitive_attr Attr() const {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  const dnnl::inner_product_forward::primitive_desc& FwdPd(int n) {
    Prims& p = cache_[n];
    if (!p.fwd_pd) {
      dnnl::inner_product_forward::desc desc(dnnl::prop_kind::forward_training,
                                             Src(n, In()), Weights(In()),
                                             Bias(), Dst(n));
      p.fwd_pd.emplace(desc, Attr(), ctx_->engine);
    }
    return *p.fwd_pd;
  }

  // In float32 the forward may run as oneDNN's matmul instead, reading the
  // [units, in] weights as their [in, units] transpose (strides {1, in}):
  // the inner product's GEMM is slow at small batches (LeNet's 800 -> 500
  // at batch 64: 0.165 ms against the matmul's 0.115 here). The faster is
  // timed and kept in the tuning (0: inner product, 1: matmul).
  memory::desc MatmulWeights() const {
    return memory::desc({d_.in, d_.units}, dt::f32, memory::dims{1, d_.in});
  }
  memory::desc MatmulBias() const {
    return memory::desc({1, d_.units}, dt::f32, tag::ab);
  }
  dnnl::matmul::primitive_desc MatmulPd(int n) const {
    const dnnl::matmul::desc desc(Src(n), MatmulWeights(), MatmulBias(),
                                  Dst(n));
    return dnnl::matmul::primitive_desc(desc, Attr(), ctx_->engine);
  }
  bool FwdAsMatmul(int n) {
    if (ctx_->bf16()) return false;
    const std::string key = absl::StrCat(name_, " forward, n ", n);
    if (auto it = ctx_->tuning.find(key);
        it != ctx_->tuning.end() && (it->second == 0 || it->second == 1)) {
      return it->second == 1;
    }
    // Timing allocates the layer's tensors: where they do not fit, the
    // network refuses the layer saying so (Network::Build), not this.
    try {
      return TimeFwdAsMatmul(n, key);
    } catch (const dnnl::error&) {
      return false;
    }
  }
  bool TimeFwdAsMatmul(int n, const std::string& key) {
    const auto& ip = FwdPd(n);
    const double inner = TimePrimitive(ctx_, dnnl::inner_product_forward(ip),
                                       ForwardArgs(ip), 0);
    const dnnl::matmul::primitive_desc mm = MatmulPd(n);
    const double matmul =
        TimePrimitive(ctx_, dnnl::matmul(mm), ForwardArgs(mm), 2 * inner);
    ctx_->tuning[key] = matmul < inner ? 1 : 0;
    return matmul < inner;
  }

  BoundPrimitive& Fwd(int n) {
    Prims& p = cache_[n];
    if (!p.fwd && FwdAsMatmul(n)) {
      BindForward<dnnl::matmul>(&p.fwd, MatmulPd(n), Src(n), MatmulWeights(),
                                MatmulBias(), Dst(n));
    }
    if (!p.fwd) {
      BindForward<dnnl::inner_product_forward>(&p.fwd, FwdPd(n), Src(n),
                                               Weights(), Bias(), Dst(n));
    }
    return *p.fwd;
  }

  BoundPrimitive& BwdData(int n) {
    Prims& p = cache_[n];
    if (!p.bwd_data) {
      dnnl::inner_product_backward_data::desc desc(Src(n), Weights(In()),
                                                   Dst(n, In()));
      dnnl::inner_product_backward_data::primitive_desc pd(
          desc, Attr(), ctx_->engine, FwdPd(n));
      BindBackwardData<dnnl::inner_product_backward_data>(
          &p.bwd_data, n, pd, Src(n), Dst(n), Weights());
    }
    return *p.bwd_data;
  }

  BoundPrimitive& BwdWeights(int n) {
    Prims& p = cache_[n];
    if (!p.bwd_weights) {
      dnnl::inner_product_backward_weights::desc desc(Src(n, In()), Weights(),
                                                      Bias(), Dst(n, In()));
      dnnl::inner_product_backward_weights::primitive_desc pd(
          desc, Attr(), ctx_->engine, FwdPd(n));
      BindBackwardWeights<dnnl::inner_product_backward_weights>(
          &p.bwd_weights, n, pd, Src(n), Dst(n), Weights(), Bias());
    }
    return *p.bwd_weights;
  }

  const Context* ctx_;
  const FcDesc d_;
  const std::string name_;
  PerBatch<Prims> cache_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(const Context* ctx,
                                                 const FcDesc& desc,
                                                 int max_batch) {
  return MakePrepared<CpuFc>(ctx, desc, max_batch);
}

}  // namespace dlbatch::trainer::cpu
