// Internals of the CPU backend (backend_cpu*.cc, cpu_*.cc): the oneDNN
// engine and stream it shares with its kernels, a binding of primitives to
// plain-layout user tensors, and the element-wise loops.
//
// Not for layers or the network: they see only backend.h.
#ifndef DLBATCH_TRAINER_CPU_BACKEND_CPU_INTERNAL_H_
#define DLBATCH_TRAINER_CPU_BACKEND_CPU_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "trainer/backend.h"

namespace dlbatch::trainer::cpu {

// What every CPU kernel shares with its backend.
struct Context {
  dnnl::engine engine;
  mutable dnnl::stream stream;  // waiting on it changes nothing observable
  int threads = 1;
  // The data type convolutions and inner products compute in: f32, or bf16
  // (MakeCpuBackend's `bf16`). Their user tensors are f32 either way.
  dnnl::memory::data_type compute = dnnl::memory::data_type::f32;
  bool bf16() const { return compute == dnnl::memory::data_type::bf16; }
  // Autotuning's choices: a kernel's key -> the index of the implementation
  // chosen among those oneDNN offers (see PickFastest).
  mutable std::map<std::string, int> tuning;
  // Applies `threads` to the calling thread (OpenMP's thread count is a
  // per-thread setting), in case it is not the one that made the backend.
  void Enter() const;
};

// Ends the process: a failure while running cannot be recovered (backend.h).
[[noreturn]] void Die(std::string_view what, const char* file, int line,
                      std::string_view detail);

// Runs `expr` (oneDNN calls that may throw) and dies with its text, file and
// line if it throws.
#define DLBATCH_DNNL_RUN(expr)                                 \
  do {                                                         \
    try {                                                      \
      expr;                                                    \
    } catch (const dnnl::error& dlbatch_dnnl_error) {          \
      ::dlbatch::trainer::cpu::Die(#expr, __FILE__, __LINE__,  \
                                   dlbatch_dnnl_error.what()); \
    }                                                          \
  } while (false)

// Runs `make` (a primitive's creation for batches of `n`, which throws
// where oneDNN has no implementation for a shape, or where the memory to
// time it cannot be had) and turns a throw into an error that names `what`:
// InvalidArgument, or ResourceExhausted saying what to shrink.
template <typename F>
absl::Status TryCreate(std::string_view what, int n, F&& make) {
  try {
    make();
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_out_of_memory) {
      return absl::ResourceExhaustedError(
          std::string(what) + ": cannot allocate the host memory it needs " +
          "for batches of " + std::to_string(n) +
          "; use a smaller mini_batch_size, or fewer filters or units");
    }
    return absl::InvalidArgumentError(std::string(what) +
                                      ": oneDNN cannot run it: " + e.what());
  }
  return absl::OkStatus();
}

// A primitive bound to user tensors in plain layouts. Where the primitive
// chose another layout (format_tag::any), an input is reordered into an
// internal buffer before the primitive runs and an output out of one after.
class BoundPrimitive {
 public:
  BoundPrimitive() = default;
  // `name` says what it computes, for the message if it fails.
  BoundPrimitive(const Context* ctx, std::string name, dnnl::primitive prim,
                 const dnnl::memory::desc& scratchpad);

  // Arguments are given in the order Run takes their pointers.
  void AddInput(int arg, const dnnl::memory::desc& user,
                const dnnl::memory::desc& prim);
  void AddOutput(int arg, const dnnl::memory::desc& user,
                 const dnnl::memory::desc& prim);

  // Lets input `arg` read the conversion that `from` made of its input
  // `from_arg` on its last Run instead of converting again, when Run gets
  // the pointer `from` converted: for a tensor the caller leaves unchanged
  // between the two calls (x from a step's forward to its backward weights,
  // dy from backward weights to backward data). `from` itself converts on
  // every Run. Nothing is shared where either needs no conversion or their
  // layouts differ. Call once both are bound.
  void ShareInput(int arg, BoundPrimitive& from, int from_arg);

  // Runs with `data[i]` as the i-th argument added; dies on a oneDNN error.
  void Run(std::initializer_list<const void*> data);

 private:
  struct Arg {
    int arg = 0;
    bool output = false;
    dnnl::memory user;
    dnnl::memory prim;  // the same object as `user` when no reorder
    dnnl::reorder reorder;
    bool reordered = false;
    // Where prim is shared (ShareInput): the user pointer whose conversion
    // it holds, and whether this argument may reuse it (else it converts).
    std::shared_ptr<const void*> holds;
    bool reuses = false;
  };
  Arg* Find(int arg);
  void Add(int arg, bool output, const dnnl::memory::desc& user,
           const dnnl::memory::desc& prim);

  const Context* ctx_ = nullptr;
  std::string name_;
  dnnl::primitive prim_;
  std::vector<Arg> args_;
  std::unordered_map<int, dnnl::memory> exec_args_;
};

// Times `prim` on scratch tensors of the given layouts (zero-filled) and
// returns its best of a few runs in seconds, what autotuning compares;
// stops early once the best exceeds `give_up` (if > 0).
double TimePrimitive(
    const Context* ctx, const dnnl::primitive& prim,
    const std::vector<std::pair<int, dnnl::memory::desc>>& args,
    double give_up);

// An argument's layout in the user's tensor, which BoundPrimitive reorders
// from (an input) or into (an output) where the primitive's differs.
struct UserLayout {
  int arg = 0;
  dnnl::memory::desc desc;
  bool output = false;
};

// Seconds a reorder from `from` to `to` takes (TimePrimitive's measure):
// what a candidate whose layout is not the user's pays on every call.
double TimeReorder(const Context* ctx, const dnnl::memory::desc& from,
                   const dnnl::memory::desc& to);

// Autotuning, as cuDNN's algorithm search: among the implementations oneDNN
// offers for a primitive (`make_pd(layouts)`, then next_impl()), other than
// its reference loops, returns the primitive descriptor of the fastest on
// this machine. `args` lists the arguments' layouts of a candidate; where
// one differs from the user's (`user`), the reorder a call adds for it
// (BoundPrimitive) counts in the candidate's time. make_pd(v) for v in
// [1, layouts) lets oneDNN choose more layouts (format_tag::any) than
// make_pd(0) does: one other than the user's wins only if it is faster
// with its reorders. The choice is kept in ctx->tuning under `key`
// (what is computed, on which shapes and batch size), by its place in
// make_pd(v)'s list (v = 0: the choices of the runs before layouts were
// offered read the same); a choice already there is taken without timing,
// so that a resumed run computes with the implementations of the run it
// continues.
template <typename Pd, typename Prim>
Pd PickFastest(
    const Context* ctx, const std::string& key, int layouts,
    const std::function<Pd(int)>& make_pd,
    const std::function<
        std::vector<std::pair<int, dnnl::memory::desc>>(const Pd&)>& args,
    const std::vector<UserLayout>& user) {
  auto is_ref = [](const Pd& pd) {
    return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
  };
  // A candidate is kept as kLayoutStride * v + its place in make_pd(v)'s
  // list: the lists' lengths are not stable (oneDNN left its reference
  // implementation out of some second listings).
  constexpr int kLayoutStride = 1000;
  auto candidate = [&](int index) -> std::optional<Pd> {
    const int v = index / kLayoutStride;
    if (v >= layouts) return std::nullopt;
    Pd pd = make_pd(v);
    for (int i = 0; i < index % kLayoutStride; ++i) {
      if (!pd.next_impl()) return std::nullopt;
    }
    return pd;
  };
  if (auto it = ctx->tuning.find(key); it != ctx->tuning.end()) {
    std::optional<Pd> pd = candidate(it->second);
    if (pd && !is_ref(*pd)) return *pd;
  }
  // Candidates mostly need the same reorders (x's and dy's, in bf16): each
  // is timed once.
  struct Reorder {
    dnnl::memory::desc from, to;
    double seconds;
  };
  std::vector<Reorder> reorders;
  auto reorder_time = [&](const dnnl::memory::desc& from,
                          const dnnl::memory::desc& to) {
    for (const Reorder& r : reorders) {
      if (r.from == from && r.to == to) return r.seconds;
    }
    reorders.push_back({from, to, TimeReorder(ctx, from, to)});
    return reorders.back().seconds;
  };
  int best = 0;
  double best_time = -1;
  for (int v = 0; v < layouts; ++v) {
    Pd pd = make_pd(v);
    int index = kLayoutStride * v;
    do {
      if (!is_ref(pd)) {
        std::vector<std::pair<int, dnnl::memory::desc>> a = args(pd);
        a.emplace_back(DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc());
        double t =
            TimePrimitive(ctx, Prim(pd), a, best_time < 0 ? 0 : 2 * best_time);
        for (const UserLayout& u : user) {
          for (const auto& [arg, md] : a) {
            if (arg != u.arg || md == u.desc) continue;
            t += u.output ? reorder_time(md, u.desc) : reorder_time(u.desc, md);
          }
        }
        if (best_time < 0 || t < best_time) {
          best_time = t;
          best = index;
        }
      }
      ++index;
    } while (pd.next_impl());
  }
  ctx->tuning[key] = best;
  return *candidate(best);
}

// conv and fc on oneDNN share their calls' form: each runs the primitive
// that `Derived` makes and caches for n (Fwd(n), BwdData(n), BwdWeights(n),
// each a BoundPrimitive&), and Prepare makes them at build time to refuse
// a shape that oneDNN cannot run: backward data only where the network
// asks for dx (`Derived::wants_dx()`; made on first use otherwise).
// `Derived` names itself in name_.
template <typename Derived, typename Interface>
class WeightedKernel : public Interface {
 public:
  absl::Status Prepare(int n) {
    return TryCreate(self().name_, n, [&] {
      self().Fwd(n);
      if (self().wants_dx()) self().BwdData(n);
      self().BwdWeights(n);
    });
  }

  void Forward(int n, const float* x, const float* w, const float* b,
               float* y) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &self().Fwd(n));
    p->Run({x, w, b, y});
  }
  void BackwardData(int n, const float* dy, const float* w,
                    float* dx) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &self().BwdData(n));
    p->Run({dy, w, dx});
  }
  void BackwardWeights(int n, const float* x, const float* dy, float* dw,
                       float* db) override {
    BoundPrimitive* p = nullptr;
    DLBATCH_DNNL_RUN(p = &self().BwdWeights(n));
    p->Run({x, dy, dw, db});
  }

 protected:
  // Where the primitives convert their inputs (bf16), a step converts x
  // once for forward and backward weights and dy once for both backward
  // passes (BoundPrimitive::ShareInput): the layer runs backward weights,
  // then backward data, after the forward of the same batch.

  // Binds a forward primitive made from `pd`: x, the weights and the bias
  // in, y out, in the user layouts given.
  template <typename Prim, typename Pd>
  void BindForward(std::optional<BoundPrimitive>* slot, const Pd& pd,
                   const dnnl::memory::desc& src,
                   const dnnl::memory::desc& weights,
                   const dnnl::memory::desc& bias,
                   const dnnl::memory::desc& dst) {
    slot->emplace(self().ctx_, self().name_ + " forward", Prim(pd),
                  pd.scratchpad_desc());
    (*slot)->AddInput(DNNL_ARG_SRC, src, pd.src_desc());
    (*slot)->AddInput(DNNL_ARG_WEIGHTS, weights, pd.weights_desc());
    (*slot)->AddInput(DNNL_ARG_BIAS, bias, pd.bias_desc());
    (*slot)->AddOutput(DNNL_ARG_DST, dst, pd.dst_desc());
  }

  // A forward primitive's arguments in its own layouts, as TimePrimitive
  // takes them.
  template <typename Pd>
  static std::vector<std::pair<int, dnnl::memory::desc>> ForwardArgs(
      const Pd& pd) {
    return {{DNNL_ARG_SRC, pd.src_desc()},
            {DNNL_ARG_WEIGHTS, pd.weights_desc()},
            {DNNL_ARG_BIAS, pd.bias_desc()},
            {DNNL_ARG_DST, pd.dst_desc()},
            {DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc()}};
  }

  // Binds a backward-weights primitive made from `pd` for batch n: x and dy
  // in, the weight and bias gradients out, in the user layouts given.
  template <typename Prim, typename Pd>
  void BindBackwardWeights(std::optional<BoundPrimitive>* slot, int n,
                           const Pd& pd, const dnnl::memory::desc& src,
                           const dnnl::memory::desc& dst,
                           const dnnl::memory::desc& weights,
                           const dnnl::memory::desc& bias) {
    slot->emplace(self().ctx_, self().name_ + " backward weights", Prim(pd),
                  pd.scratchpad_desc());
    (*slot)->AddInput(DNNL_ARG_SRC, src, pd.src_desc());
    (*slot)->AddInput(DNNL_ARG_DIFF_DST, dst, pd.diff_dst_desc());
    (*slot)->AddOutput(DNNL_ARG_DIFF_WEIGHTS, weights, pd.diff_weights_desc());
    (*slot)->AddOutput(DNNL_ARG_DIFF_BIAS, bias, pd.diff_bias_desc());
    (*slot)->ShareInput(DNNL_ARG_SRC, self().Fwd(n), DNNL_ARG_SRC);
  }

  // Binds a backward-data primitive made from `pd` for batch n: dy and the
  // weights in, dx out, in the user layouts given.
  template <typename Prim, typename Pd>
  void BindBackwardData(std::optional<BoundPrimitive>* slot, int n,
                        const Pd& pd, const dnnl::memory::desc& src,
                        const dnnl::memory::desc& dst,
                        const dnnl::memory::desc& weights) {
    slot->emplace(self().ctx_, self().name_ + " backward data", Prim(pd),
                  pd.scratchpad_desc());
    (*slot)->AddInput(DNNL_ARG_DIFF_DST, dst, pd.diff_dst_desc());
    (*slot)->AddInput(DNNL_ARG_WEIGHTS, weights, pd.weights_desc());
    (*slot)->AddOutput(DNNL_ARG_DIFF_SRC, src, pd.diff_src_desc());
    (*slot)->ShareInput(DNNL_ARG_DIFF_DST, self().BwdWeights(n),
                        DNNL_ARG_DIFF_DST);
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

// Makes a CPU kernel and its primitives for max_batch at once, so that a
// shape oneDNN cannot run is refused at build time (Kernel::Prepare).
template <typename Kernel, typename Desc>
absl::StatusOr<std::unique_ptr<Kernel>> MakePrepared(const Context* ctx,
                                                     const Desc& desc,
                                                     int max_batch) {
  auto kernel = std::make_unique<Kernel>(ctx, desc, max_batch);
  if (absl::Status s = kernel->Prepare(max_batch); !s.ok()) return s;
  return kernel;
}

// A per-batch-size cache: primitives are made for each n actually used
// (training uses one; the last validation batch may be smaller).
template <typename T>
class PerBatch {
 public:
  explicit PerBatch(int max_batch) : items_(max_batch + 1) {}
  T& operator[](int n) {
    if (n < 1 || n >= static_cast<int>(items_.size())) {
      Die("PerBatch", __FILE__, __LINE__,
          "batch size " + std::to_string(n) + " outside [1, " +
              std::to_string(items_.size() - 1) + "]");
    }
    if (items_[n] == nullptr) items_[n] = std::make_unique<T>();
    return *items_[n];
  }

 private:
  std::vector<std::unique_ptr<T>> items_;
};

absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(const Context* ctx,
                                                     const ConvDesc& desc,
                                                     int max_batch);
absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(const Context* ctx,
                                                 const FcDesc& desc,
                                                 int max_batch);
absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(const Context* ctx,
                                                     const PoolDesc& desc,
                                                     int max_batch);
absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
    const Context* ctx, const BatchNormDesc& desc, int max_batch);
absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>> MakeSyncBatchNorm(
    const Context* ctx, const BatchNormDesc& desc, int max_batch);

// --- element-wise loops (backend_cpu_kernels.cc), as in backend.h ---
void ActivationForward(float alpha, int64_t count, const float* x, float* y);
void ActivationBackward(float alpha, int64_t count, const float* x,
                        const float* dy, float* dx);
void GeluForward(int64_t count, const float* x, float* y);
void GeluBackward(int64_t count, const float* x, const float* dy, float* dx);
void Add(int64_t count, const float* a, const float* b, float* out);
// Backend::AddBf16 and GradientToBf16 (b16, out16: bf16 bit patterns).
void AddBf16(bool relu, int64_t count, const float* a, const uint16_t* b16,
             float* out);
void GradientToBf16(int64_t count, const float* y, const float* g,
                    uint16_t* out16);
// Batch norm over several ranks' samples (BatchNormKernel::SpanSums), on
// the calling thread: over `rows` positions of `c` channels of x (bf16 bit
// patterns where `bf16`), sums[0, c) = sum of (x - shift), sums[c, 2c) =
// sum of its square.
void ChannelSums(int64_t rows, int c, const void* x, bool bf16,
                 const float* shift, float* sums);
// dx += a[ch] + b[ch] * x, per position; x and dx bf16 where `bf16`.
void ChannelAffineAdd(int64_t rows, int c, const void* x, bool bf16,
                      const float* a, const float* b, void* dx);
// out = a + b, then relu or leaky relu (`alpha`) in the same pass.
void AddActivation(float alpha, int64_t count, const float* a, const float* b,
                   float* out);
void CopyStrided(int64_t rows, int64_t cols, const float* src,
                 int64_t src_stride, float* dst, int64_t dst_stride);
void DropoutForward(float p, uint64_t seed, int64_t count, const float* x,
                    float* mask, float* y);
void Multiply(int64_t count, const float* a, const float* b, float* out);
void Fill(float* x, int64_t count, float value);
void Scale(int64_t count, float alpha, float* x);
void PrepareImages(int n, const Shape& shape, const uint8_t* pixels,
                   const SamplePlacement* placements, const float* scale_bias,
                   float* out);
double SumSquares(int64_t count, const float* x);
void SoftmaxCrossEntropy(int n, int classes, const float* logits,
                         const int32_t* labels, float smoothing, float* probs,
                         float* stats);
void SoftmaxCrossEntropyBackward(int n, int classes, const float* probs,
                                 const int32_t* labels, float smoothing,
                                 float scale, float* dlogits);
void SgdmUpdate(int64_t count, int64_t decayed, float lr, float momentum,
                float l2, float* params, const float* grads, float* velocity);
void SgdmNesterovUpdate(int64_t count, int64_t decayed, float lr,
                        float momentum, float l2, float* params,
                        const float* grads, float* velocity);
void AdamUpdate(int64_t count, int64_t decayed, float lr, float beta1,
                float beta2, float epsilon, int64_t t, float l2, float* params,
                const float* grads, float* m, float* v);
void RmspropUpdate(int64_t count, int64_t decayed, float lr, float beta2,
                   float epsilon, float l2, float* params, const float* grads,
                   float* v);

}  // namespace dlbatch::trainer::cpu

#endif  // DLBATCH_TRAINER_CPU_BACKEND_CPU_INTERNAL_H_
