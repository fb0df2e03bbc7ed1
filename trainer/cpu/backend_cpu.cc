// The CPU backend: host memory, oneDNN kernels (cpu_*.cc) and element-wise
// loops (backend_cpu_kernels.cc) on one OpenMP thread team.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "trainer/backend.h"
#include "trainer/cpu/backend_cpu_internal.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace cpu {

void Context::Enter() const {
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

void Die(std::string_view what, const char* file, int line,
         std::string_view detail) {
  std::fprintf(stderr, "fatal: CPU backend: %.*s failed at %s:%d: %.*s\n",
               static_cast<int>(what.size()), what.data(), file, line,
               static_cast<int>(detail.size()), detail.data());
  std::fflush(stderr);
  std::abort();
}

BoundPrimitive::BoundPrimitive(const Context* ctx, std::string name,
                               dnnl::primitive prim,
                               const dnnl::memory::desc& scratchpad)
    : ctx_(ctx), name_(std::move(name)), prim_(std::move(prim)) {
  if (scratchpad.get_size() > 0) {
    exec_args_[DNNL_ARG_SCRATCHPAD] = dnnl::memory(scratchpad, ctx->engine);
  }
}

void BoundPrimitive::AddInput(int arg, const dnnl::memory::desc& user,
                              const dnnl::memory::desc& prim) {
  Add(arg, /*output=*/false, user, prim);
}

void BoundPrimitive::AddOutput(int arg, const dnnl::memory::desc& user,
                               const dnnl::memory::desc& prim) {
  Add(arg, /*output=*/true, user, prim);
}

void BoundPrimitive::Add(int arg, bool output, const dnnl::memory::desc& user,
                         const dnnl::memory::desc& prim) {
  Arg a;
  a.arg = arg;
  a.output = output;
  a.user = dnnl::memory(user, ctx_->engine, DNNL_MEMORY_NONE);
  if (user == prim) {
    a.prim = a.user;
  } else {
    a.prim = dnnl::memory(prim, ctx_->engine);  // owned internal buffer
    a.reorder =
        output ? dnnl::reorder(a.prim, a.user) : dnnl::reorder(a.user, a.prim);
    a.reordered = true;
  }
  exec_args_[arg] = a.prim;
  args_.push_back(std::move(a));
}

BoundPrimitive::Arg* BoundPrimitive::Find(int arg) {
  for (Arg& a : args_) {
    if (a.arg == arg) return &a;
  }
  Die("BoundPrimitive::Find", __FILE__, __LINE__,
      absl::StrCat(name_, " has no argument ", arg));
}

void BoundPrimitive::ShareInput(int arg, BoundPrimitive& from, int from_arg) {
  Arg* a = Find(arg);
  Arg* f = from.Find(from_arg);
  if (a->output || f->output || !a->reordered || !f->reordered ||
      a->prim.get_desc() != f->prim.get_desc()) {
    return;
  }
  if (f->holds == nullptr) f->holds = std::make_shared<const void*>(nullptr);
  a->holds = f->holds;
  a->reuses = true;
  a->prim = f->prim;  // this argument's own buffer is freed
  exec_args_[arg] = a->prim;
}

void BoundPrimitive::Run(std::initializer_list<const void*> data) {
  if (data.size() != args_.size()) {
    Die("BoundPrimitive::Run", __FILE__, __LINE__,
        absl::StrCat(data.size(), " pointers for ", args_.size(),
                     " arguments"));
  }
  ctx_->Enter();
  try {
    auto it = data.begin();
    for (Arg& a : args_) {
      const void* user = *it++;
      a.user.set_data_handle(const_cast<void*>(user));
      if (!a.reordered || a.output) continue;
      if (a.reuses && *a.holds == user) continue;
      a.reorder.execute(ctx_->stream, a.user, a.prim);
      if (a.holds != nullptr) *a.holds = user;
    }
    prim_.execute(ctx_->stream, exec_args_);
    for (Arg& a : args_) {
      if (a.reordered && a.output) {
        a.reorder.execute(ctx_->stream, a.prim, a.user);
      }
    }
  } catch (const dnnl::error& e) {
    Die(name_, __FILE__, __LINE__, e.what());
  }
}

double TimePrimitive(
    const Context* ctx, const dnnl::primitive& prim,
    const std::vector<std::pair<int, dnnl::memory::desc>>& args,
    double give_up) {
  std::unordered_map<int, dnnl::memory> exec;
  for (const auto& [arg, md] : args) {
    if (md.get_size() == 0) continue;
    dnnl::memory mem(md, ctx->engine);
    std::memset(mem.get_data_handle(), 0, md.get_size());
    exec[arg] = mem;
  }
  // Warm-up: caches, pages. Timed too: a candidate whose warm-up alone
  // takes more than twice `give_up` is far slower than the best so far, and
  // a long one (a big layer at a big batch: ResNet-9's 3x3 convolutions at
  // batch 512 take ~1 s each here) needs one more run, not three, for its
  // time to be known within what the page faults of its first added.
  const auto warm_start = std::chrono::steady_clock::now();
  prim.execute(ctx->stream, exec);
  ctx->stream.wait();
  const double warm = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - warm_start)
                          .count();
  if (give_up > 0 && warm > 2 * give_up) return warm;
  const int runs = warm > 0.05 ? 1 : 3;
  // The best of a few runs: other processes on the machine only ever add.
  // A candidate far slower than the best so far is not worth more runs.
  double best = 0;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    prim.execute(ctx->stream, exec);
    ctx->stream.wait();
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (i == 0 || t < best) best = t;
    if (give_up > 0 && best > give_up) break;
  }
  return best;
}

double TimeReorder(const Context* ctx, const dnnl::memory::desc& from,
                   const dnnl::memory::desc& to) {
  const dnnl::reorder::primitive_desc pd(ctx->engine, from, ctx->engine, to);
  return TimePrimitive(ctx, dnnl::reorder(pd),
                       {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}, 0);
}

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool bf16, bool fold_relu) : fold_relu_(fold_relu) {
    ctx_.engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    ctx_.stream = dnnl::stream(ctx_.engine);
    ctx_.threads = threads;
    if (bf16) ctx_.compute = dnnl::memory::data_type::bf16;
    ctx_.Enter();
  }

  std::string Describe() const override {
    const dnnl_version_t* v = dnnl_version();
    return absl::StrCat("cpu: oneDNN ", v->major, ".", v->minor, ".", v->patch,
                        ", ", ctx_.threads,
                        ctx_.threads == 1 ? " thread" : " threads",
                        ctx_.bf16() ? ", bf16" : "");
  }
  bool on_gpu() const override { return false; }
  bool folds_relu() const override { return fold_relu_; }
  bool batch_norm_spans_ranks() const override { return true; }
  bool bf16_activations() const override { return ctx_.bf16(); }

  // One "index<TAB>key" line per choice.
  std::string SaveTuning() const override {
    std::string out;
    for (const auto& [key, index] : ctx_.tuning) {
      absl::StrAppend(&out, index, "\t", key, "\n");
    }
    return out;
  }
  void LoadTuning(const std::string& tuning) override {
    for (absl::string_view line :
         absl::StrSplit(tuning, '\n', absl::SkipEmpty())) {
      const size_t tab = line.find('\t');
      int index = 0;
      if (tab == absl::string_view::npos ||
          !absl::SimpleAtoi(line.substr(0, tab), &index) || index < 0) {
        continue;  // not ours to judge: it is only a hint
      }
      ctx_.tuning[std::string(line.substr(tab + 1))] = index;
    }
  }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    constexpr size_t kAlign = 64;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* data = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes,
                       " bytes of host memory; use a smaller mini_batch_size"));
    }
    std::memset(data, 0, rounded);
    return Buffer(this, data, bytes);
  }
  void Free(void* data) override { std::free(data); }
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
  }
  void Fill(float* x, int64_t count, float value) override {
    ctx_.Enter();
    cpu::Fill(x, count, value);
  }
  void Synchronize() override { DLBATCH_DNNL_RUN(ctx_.stream.wait()); }

  absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(const ConvDesc& desc,
                                                       int max_batch) override {
    ctx_.Enter();
    return cpu::MakeConv(&ctx_, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(const FcDesc& desc,
                                                   int max_batch) override {
    ctx_.Enter();
    return cpu::MakeFc(&ctx_, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(const PoolDesc& desc,
                                                       int max_batch) override {
    ctx_.Enter();
    return cpu::MakePool(&ctx_, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
      const BatchNormDesc& desc, int max_batch) override {
    ctx_.Enter();
    return cpu::MakeBatchNorm(&ctx_, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>> MakeSyncBatchNorm(
      const BatchNormDesc& desc, int max_batch) override {
    ctx_.Enter();
    return cpu::MakeSyncBatchNorm(&ctx_, desc, max_batch);
  }

  void ActivationForward(const ActivationDesc& desc, int64_t count,
                         const float* x, float* y) override {
    ctx_.Enter();
    if (desc.kind == ActivationKind::kGelu) {
      cpu::GeluForward(count, x, y);
    } else {
      cpu::ActivationForward(desc.alpha, count, x, y);
    }
  }
  void ActivationBackward(const ActivationDesc& desc, int64_t count,
                          const float* x, const float* dy, float* dx) override {
    ctx_.Enter();
    if (desc.kind == ActivationKind::kGelu) {
      cpu::GeluBackward(count, x, dy, dx);
    } else {
      cpu::ActivationBackward(desc.alpha, count, x, dy, dx);
    }
  }
  void SetDropoutKey(uint64_t key) override { dropout_key_ = key; }
  void DropoutForward(float p, uint64_t salt, int64_t count, const float* x,
                      float* mask, float* y) override {
    ctx_.Enter();
    cpu::DropoutForward(p, Key(dropout_key_, salt), count, x, mask, y);
  }
  void Multiply(int64_t count, const float* a, const float* b,
                float* out) override {
    ctx_.Enter();
    cpu::Multiply(count, a, b, out);
  }
  void Add(int64_t count, const float* a, const float* b, float* out) override {
    ctx_.Enter();
    cpu::Add(count, a, b, out);
  }
  void AddBf16(bool relu, int64_t count, const float* a, const void* b16,
               float* out) override {
    ctx_.Enter();
    cpu::AddBf16(relu, count, a, static_cast<const uint16_t*>(b16), out);
  }
  void GradientToBf16(int64_t count, const float* y, const float* g,
                      void* out16) override {
    ctx_.Enter();
    cpu::GradientToBf16(count, y, g, static_cast<uint16_t*>(out16));
  }
  void AddActivation(const ActivationDesc& desc, int64_t count, const float* a,
                     const float* b, float* out) override {
    if (desc.kind == ActivationKind::kGelu) {
      Backend::AddActivation(desc, count, a, b, out);
      return;
    }
    ctx_.Enter();
    cpu::AddActivation(desc.alpha, count, a, b, out);
  }
  void CopyStrided(int64_t rows, int64_t cols, const float* src,
                   int64_t src_stride, float* dst,
                   int64_t dst_stride) override {
    ctx_.Enter();
    cpu::CopyStrided(rows, cols, src, src_stride, dst, dst_stride);
  }
  void SoftmaxCrossEntropy(int n, int classes, const float* logits,
                           const int32_t* labels, float smoothing, float* probs,
                           float* stats) override {
    cpu::SoftmaxCrossEntropy(n, classes, logits, labels, smoothing, probs,
                             stats);
  }
  void SoftmaxCrossEntropyBackward(int n, int classes, const float* probs,
                                   const int32_t* labels, float smoothing,
                                   float scale, float* dlogits) override {
    cpu::SoftmaxCrossEntropyBackward(n, classes, probs, labels, smoothing,
                                     scale, dlogits);
  }
  void SgdmUpdate(int64_t count, int64_t decayed, float lr, float momentum,
                  float l2, float* params, const float* grads,
                  float* velocity) override {
    ctx_.Enter();
    cpu::SgdmUpdate(count, decayed, lr, momentum, l2, params, grads, velocity);
  }
  void SgdmNesterovUpdate(int64_t count, int64_t decayed, float lr,
                          float momentum, float l2, float* params,
                          const float* grads, float* velocity) override {
    ctx_.Enter();
    cpu::SgdmNesterovUpdate(count, decayed, lr, momentum, l2, params, grads,
                            velocity);
  }
  void AdamUpdate(int64_t count, int64_t decayed, float lr, float beta1,
                  float beta2, float epsilon, int64_t t, float l2,
                  float* params, const float* grads, float* m,
                  float* v) override {
    ctx_.Enter();
    cpu::AdamUpdate(count, decayed, lr, beta1, beta2, epsilon, t, l2, params,
                    grads, m, v);
  }
  void RmspropUpdate(int64_t count, int64_t decayed, float lr, float beta2,
                     float epsilon, float l2, float* params, const float* grads,
                     float* v) override {
    ctx_.Enter();
    cpu::RmspropUpdate(count, decayed, lr, beta2, epsilon, l2, params, grads,
                       v);
  }
  double SumSquares(int64_t count, const float* x) override {
    ctx_.Enter();
    return cpu::SumSquares(count, x);
  }
  void Scale(int64_t count, float alpha, float* x) override {
    ctx_.Enter();
    cpu::Scale(count, alpha, x);
  }
  void ClipToNorm(int64_t count, double threshold, float* x) override {
    const double norm = std::sqrt(SumSquares(count, x));
    if (norm > threshold) Scale(count, static_cast<float>(threshold / norm), x);
  }
  void PrepareImages(int n, const Shape& shape, const uint8_t* pixels,
                     const SamplePlacement* placements, const float* scale_bias,
                     float* out) override {
    ctx_.Enter();
    cpu::PrepareImages(n, shape, pixels, placements, scale_bias, out);
  }

 private:
  cpu::Context ctx_;
  uint64_t dropout_key_ = 0;
  const bool fold_relu_;
};

}  // namespace
}  // namespace cpu

absl::Status CpuBf16Support() {
  dnnl::cpu_isa isa = dnnl::cpu_isa::all;
  try {
    isa = dnnl::get_effective_cpu_isa();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(
        "cannot ask oneDNN for this CPU's instructions: ", e.what()));
  }
  if (isa == dnnl::cpu_isa::avx512_core_bf16 ||
      isa == dnnl::cpu_isa::avx512_core_amx) {
    return absl::OkStatus();
  }
  std::string has;
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      has = "SSE4.1";
      break;
    case dnnl::cpu_isa::avx:
      has = "AVX";
      break;
    case dnnl::cpu_isa::avx2:
      has = "AVX2";
      break;
    case dnnl::cpu_isa::avx2_vnni:
      has = "AVX2 VNNI";
      break;
    case dnnl::cpu_isa::avx512_core:
      has = "AVX-512";
      break;
    case dnnl::cpu_isa::avx512_core_vnni:
      has = "AVX-512 VNNI";
      break;
    default:
      has = absl::StrCat("oneDNN's ISA ", static_cast<int>(isa));
      break;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "precision: bf16 on the CPU needs AVX-512 BF16 or AMX (oneDNN's bf16 "
      "primitives); this CPU's best is ",
      has,
      ": use precision: fp32 here, or run the job on a machine whose CPU "
      "has them (Intel Cooper Lake or Sapphire Rapids and later, AMD Zen 4 "
      "and later) or on a GPU"));
}

void SeparateCpuBackends() { dnnl::set_primitive_cache_capacity(0); }

absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(int threads,
                                                        bool bf16) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU backend: threads must be >= 0 (0: all cores), not ", threads));
  }
  if (bf16) RETURN_IF_ERROR(CpuBf16Support());
  if (threads == 0) threads = omp_get_num_procs();
  // dlbatch-train refuses a bad value before it gets here.
  absl::StatusOr<std::optional<bool>> fold = FoldReluSwitch();
  const bool fold_relu = !fold.ok() || fold->value_or(true);
  try {
    return std::unique_ptr<Backend>(
        new cpu::CpuBackend(threads, bf16, fold_relu));
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(
        "CPU backend: cannot create the oneDNN engine: ", e.what()));
  }
}

}  // namespace dlbatch::trainer
