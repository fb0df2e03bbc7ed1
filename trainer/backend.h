// The device a trainer rank computes on. Layers never touch a device
// directly: they ask their Backend for kernels (one object per layer, made
// once at build time, so a backend can cache oneDNN primitives or cuDNN
// algorithm choices per shape) and call the element-wise functions below.
// The CPU backend (oneDNN) is the reference; a GPU backend (cuDNN, cuBLAS)
// implements the same interface with device memory and one stream per rank.
//
// Conventions for every function here:
// - Pointers are device memory of this backend (Allocate), except where a
//   name says host. Activations are NHWC (shape.h). `n` is the batch size
//   of the call, 1 <= n <= the max_batch the kernel was made for.
// - Gradients are overwritten, never accumulated.
// - Calls are ordered as issued (one stream). On a GPU they return before
//   the work is done; CopyToHost, SumSquares and Synchronize wait for it.
// - A failure while running (a CUDA error, a oneDNN exception) ends the
//   process with the call, file and line: a trainer rank is its own process,
//   and a half-computed step cannot be recovered. Creating a kernel for a
//   shape the backend cannot run returns an error instead.
//
// Thread safety: a Backend and its kernels are used from one thread.
#ifndef DLBATCH_TRAINER_BACKEND_H_
#define DLBATCH_TRAINER_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/placement.h"
#include "trainer/shape.h"

namespace dlbatch::trainer {

class Backend;

// Memory owned by a Backend: host memory on the CPU, device memory on a
// GPU. Move-only; freed by its backend, which must outlive it.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, void* data, size_t bytes)
      : backend_(backend), data_(data), bytes_(bytes) {}
  ~Buffer();
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  float* f32() const { return as<float>(); }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host memory from Backend::AllocateHost, freed when it goes.
class HostMemory {
 public:
  HostMemory() = default;
  static absl::StatusOr<HostMemory> Allocate(Backend* backend, size_t bytes);
  ~HostMemory();
  HostMemory(HostMemory&& other) noexcept { *this = std::move(other); }
  HostMemory& operator=(HostMemory&& other) noexcept;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  void* get() const { return data_; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
};

// Padding of a window (convolution, pooling); `same` resolves to an
// asymmetric one (proto/sample_shape.h).
using Padding = ::dlbatch::WindowPadding;

struct ConvDesc {
  Shape in;
  int filters = 0;
  int kh = 0, kw = 0;
  int stride_h = 1, stride_w = 1;
  Padding pad;
  Shape out;  // derived by the caller: (in + pads - k) / stride + 1
  // y and dy in bf16 (only where Backend::bf16_activations()): the layer's
  // output goes only to a batch norm that takes bf16 (BatchNormDesc).
  bool bf16_out = false;
  // x and dx in bf16: the input is such a batch norm's bf16 output.
  bool bf16_in = false;
  // False where the network never asks for dx (its input is the data, or
  // nothing before it learns): BackwardData is not prepared, and a backend
  // may refuse it (the GPU's do).
  bool input_grad = true;
};

// Weights are [filters, kh, kw, in.c] (OHWI) and bias [filters].
//
// conv and fc kernels: a step's BackwardWeights and then BackwardData come
// after its Forward with x and dy unchanged in between, so a backend may
// reuse what it derived from them there (the CPU's bf16 copies); any
// Forward starts afresh.
class ConvKernel {
 public:
  virtual ~ConvKernel() = default;
  virtual void Forward(int n, const float* x, const float* w, const float* b,
                       float* y) = 0;
  virtual void BackwardData(int n, const float* dy, const float* w,
                            float* dx) = 0;
  virtual void BackwardWeights(int n, const float* x, const float* dy,
                               float* dw, float* db) = 0;
};

// Fully connected: x is (n, in) (a sample's NHWC elements, flattened), the
// weights [units, in] (row-major) and bias [units]; y is (n, units).
struct FcDesc {
  int64_t in = 0;
  int units = 0;
};

class FcKernel {
 public:
  virtual ~FcKernel() = default;
  virtual void Forward(int n, const float* x, const float* w, const float* b,
                       float* y) = 0;
  virtual void BackwardData(int n, const float* dy, const float* w,
                            float* dx) = 0;
  virtual void BackwardWeights(int n, const float* x, const float* dy,
                               float* dw, float* db) = 0;
};

enum class PoolKind { kMax, kAverage };

// Average pooling divides by the window's elements inside the input
// (padding excluded, ONNX's count_include_pad=0). Global average pooling is
// a window of the whole input.
struct PoolDesc {
  PoolKind kind = PoolKind::kMax;
  Shape in;
  int kh = 0, kw = 0;
  int stride_h = 1, stride_w = 1;
  Padding pad;
  Shape out;
};

class PoolKernel {
 public:
  virtual ~PoolKernel() = default;
  // Device bytes that a training Forward of n samples records for Backward
  // (max pooling's argmax); 0 if none.
  virtual size_t WorkspaceBytes(int n) const = 0;
  // `workspace` may be null for inference.
  virtual void Forward(int n, const float* x, float* y, void* workspace) = 0;
  virtual void Backward(int n, const float* x, const float* y, const float* dy,
                        const void* workspace, float* dx) = 0;
};

// Batch normalisation per channel over (n, h, w). Variances are biased (the
// batch's mean of squared deviations), running and saved alike.
struct BatchNormDesc {
  Shape in;
  float epsilon = 1e-5f;
  // A relu folded in (only where Backend::folds_relu()): y = max(0, the
  // normalised output), and Backward's dy is the gradient of that y, masked
  // where it is 0 before the normalisation's own backward.
  bool relu = false;
  // x and dx in bf16, y and dy float32 (only where
  // Backend::bf16_activations()): the input is a convolution's bf16 output.
  bool bf16_in = false;
  // y and dy in bf16 too (with bf16_in): the output (or that of the relu
  // folded in) goes only to a convolution, which takes it so.
  bool bf16_out = false;
  // The training passes span ranks (BatchNormKernel::SpanSums and the
  // rest; only where Backend::batch_norm_spans_ranks()).
  bool spans_ranks = false;
};

class BatchNormKernel {
 public:
  virtual ~BatchNormKernel() = default;
  // Normalises with this batch's statistics, saves them (mean, var: [c])
  // for Backward, and moves the running ones toward them:
  // running = (1 - momentum) * running + momentum * batch.
  virtual void ForwardTraining(int n, const float* x, const float* gamma,
                               const float* beta, float* y, float* saved_mean,
                               float* saved_var, float* running_mean,
                               float* running_var, float momentum) = 0;
  virtual void ForwardInference(int n, const float* x, const float* gamma,
                                const float* beta, const float* running_mean,
                                const float* running_var, float* y) = 0;
  virtual void Backward(int n, const float* x, const float* dy,
                        const float* gamma, const float* saved_mean,
                        const float* saved_var, float* dx, float* dgamma,
                        float* dbeta) = 0;

  // Statistics over the samples of ranks that split one mini-batch over a
  // process's threads (Backend::batch_norm_spans_ranks): the training
  // passes cut where per-channel sums cross ranks, as SyncBatchNormKernel's
  // (the same `sums` of 2c + 1 floats, summed over the ranks by the caller
  // in between), but with this kernel's folded relu and bf16 tensors. The
  // defaults end the process: only such a backend's kernels are asked.
  //
  // sums[0, c) = sum of (x - shift), sums[c, 2c) = sum of (x - shift)^2
  // over this rank's n samples, sums[2c] = n.
  virtual void SpanSums(int n, const float* x, const float* shift, float* sums);
  // From the totals (m = sums[2c] * h * w): mean = shift + sums[ch] / m,
  // biased var = sums[c + ch] / m - (sums[ch] / m)^2, saved; normalises
  // with them and moves the running statistics as ForwardTraining.
  virtual void SpanForward(int n, const float* x, const float* gamma,
                           const float* beta, const float* shift,
                           const float* sums, float* y, float* saved_mean,
                           float* saved_var, float* running_mean,
                           float* running_var, float momentum);
  // dx as if the statistics were constants (gamma / sqrt(var + epsilon) *
  // dy), and this rank's dgamma = sum of dy * xhat and dbeta = sum of dy;
  // the same into sums[0, c) and sums[c, 2c), n into sums[2c].
  virtual void SpanBackward(int n, const float* x, const float* dy,
                            const float* gamma, const float* saved_mean,
                            const float* saved_var, float* dx, float* dgamma,
                            float* dbeta, float* sums);
  // From the totals: dx -= gamma / sqrt(var + epsilon) * (sums[c + ch] / m
  // + xhat * sums[ch] / m), the terms of the statistics' own gradients.
  virtual void SpanFinish(int n, const float* x, const float* gamma,
                          const float* saved_mean, const float* saved_var,
                          const float* sums, float* dx);
};

// Batch normalisation whose statistics span the ranks of a data-parallel
// job: BatchNormKernel's training arithmetic, split where per-channel sums
// cross ranks. Each pass fills `sums` (device float[2c + 1]) with this
// rank's sums and its sample count n in sums[2c]; the caller adds them up
// over all ranks in place (one Communicator::AllreduceSum of 2c + 1) and
// finishes the pass with the totals, so the global batch is sums[2c] and no
// count has to come back to the host. Inference needs no sums:
// BatchNormKernel runs it.
class SyncBatchNormKernel {
 public:
  virtual ~SyncBatchNormKernel() = default;
  // sums[0, c) = sum of (x - shift), sums[c, 2c) = sum of (x - shift)^2
  // over this rank's n samples. `shift` ([c]) must be the same on every
  // rank; a value near the mean keeps the variance from cancelling.
  virtual void ForwardSums(int n, const float* x, const float* shift,
                           float* sums) = 0;
  // From the totals, with m = sums[2c] * h * w: mean = shift + sums[ch] / m,
  // biased var = sums[c + ch] / m - (sums[ch] / m)^2; then as
  // BatchNormKernel::ForwardTraining. `shift` may be `running_mean`.
  virtual void ForwardNormalize(int n, const float* x, const float* gamma,
                                const float* beta, const float* shift,
                                const float* sums, float* y, float* saved_mean,
                                float* saved_var, float* running_mean,
                                float* running_var, float momentum) = 0;
  // This rank's parameter gradients (its share of the global ones):
  // dgamma = sum of dy * xhat, dbeta = sum of dy over its n samples, with
  // xhat = (x - saved_mean) / sqrt(saved_var + epsilon); the same into
  // sums[0, c) and sums[c, 2c).
  virtual void BackwardSums(int n, const float* x, const float* dy,
                            const float* saved_mean, const float* saved_var,
                            float* dgamma, float* dbeta, float* sums) = 0;
  // From the totals (m as above): dx = gamma / sqrt(var + epsilon) *
  // (dy - sums[c + ch] / m - xhat * sums[ch] / m).
  virtual void BackwardData(int n, const float* x, const float* dy,
                            const float* gamma, const float* saved_mean,
                            const float* saved_var, const float* sums,
                            float* dx) = 0;
};

enum class ActivationKind {
  kRectifier,  // y = x > 0 ? x : alpha * x (relu: alpha = 0)
  kGelu,       // y = x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2))), exact
};

struct ActivationDesc {
  float alpha = 0;
  ActivationKind kind = ActivationKind::kRectifier;
};

// Work recorded once and then issued again as a whole: a CUDA graph of a
// training step, whose forty-odd kernel launches would otherwise take the
// host longer than a small network's kernels take on the device.
class Recording {
 public:
  virtual ~Recording() = default;
  // Issues the recorded work again (in order with the backend's other
  // calls), with the pointers and arguments it was recorded with: it reads
  // what the buffers hold when it runs (a new batch, a new dropout key).
  virtual void Replay() = 0;
  // True once the backend moved memory the recorded work uses (it grew a
  // library's workspace for a new shape): record again; Replay would end
  // the process.
  virtual bool stale() const { return false; }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu: oneDNN 2.6.3, 2 threads" / "gpu 0: NVIDIA H100 80GB HBM3".
  virtual std::string Describe() const = 0;
  virtual bool on_gpu() const = 0;
  // Whether training should scale its loss (loss_scaler.h): arithmetic in
  // fp16, whose small gradients would otherwise flush to zero.
  virtual bool scales_loss() const { return false; }
  // Whether the network folds a relu into the batchnorm or add layer whose
  // only consumer it is (BatchNormDesc::relu, AddActivation), so that the
  // relu costs no pass of its own: the CPU's do, unless DLBATCH_FOLD_RELU=0
  // (FoldReluSwitch).
  virtual bool folds_relu() const { return false; }
  // Whether a convolution whose output goes only to a batch norm hands it
  // that output, and takes back its gradient, in bf16 (ConvDesc::bf16_out,
  // BatchNormDesc::bf16_in): the CPU's in bf16, where both are oneDNN bf16
  // primitives and the tensor between them is then half the bytes, with no
  // conversion of dy before the convolution's backward passes. Such a batch
  // norm hands bf16 on, in turn, to one convolution, or as the last input
  // of an add (AddBf16).
  virtual bool bf16_activations() const { return false; }

  // Which implementation each kernel chose where the backend times the
  // candidates (oneDNN's implementations, cuDNN's algorithms): text to keep
  // in a checkpoint, so that a resumed run computes with the same ones and
  // continues bit for bit. LoadTuning must come before the kernels first
  // run; choices it names that this machine cannot use are timed afresh.
  virtual std::string SaveTuning() const { return ""; }
  virtual void LoadTuning(const std::string& tuning) { (void)tuning; }

  // --- memory ---
  // Zero-filled, aligned for any kernel of this backend.
  virtual absl::StatusOr<Buffer> Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;
  // The host side of CopyToDevice may be reused as soon as it returns.
  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits for the work issued before it.
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(float* x, int64_t count, float value) = 0;
  virtual void Synchronize() = 0;
  // The stream every call above is issued to, for a communicator that
  // orders its collectives after them (Communicator::SetComputeStream): a
  // cudaStream_t on the GPU; null where calls finish as they return (CPU).
  virtual void* native_stream() { return nullptr; }

  // --- batches: copies to the device that overlap compute ---
  // Host memory that Upload copies from: page-locked on a GPU (so that the
  // copy runs without the host), plain memory elsewhere. Null if none is
  // left. Free it with FreeHost.
  virtual void* AllocateHost(size_t bytes);
  virtual void FreeHost(void* host);
  // Queues a copy from AllocateHost memory to the device on a stream of its
  // own: it starts once the work queued before it is done (so it may
  // overwrite a buffer that work reads) and runs alongside the work queued
  // after it. The host must not change `host_src` until WaitUploaded(the
  // token returned). The CPU copies at once.
  virtual uint64_t Upload(void* dst, const void* host_src, size_t bytes) {
    CopyToDevice(dst, host_src, bytes);
    return 0;
  }
  // Work queued after this call waits for every Upload before it; the host
  // does not wait.
  virtual void UseUploads() {}
  // The host waits until Upload `token` has read its source.
  virtual void WaitUploaded(uint64_t token) { (void)token; }
  // Whether Upload `token` has read its source, without waiting (for a
  // bounded wait of the caller's: Communicator::WaitOnDevice).
  virtual bool Uploaded(uint64_t token) {
    (void)token;
    return true;
  }
  // Images from bytes (BatchLoader::Options::bytes): `n` samples of
  // `shape`, 8-bit NHWC as the data set holds them, each placed by
  // placements[i] (placement.h; null: as they are) into `out`, a value v of
  // channel c becoming v * scale_bias[c] + scale_bias[shape.c + c] (a
  // multiply, then an add, each rounded) and a fill position the bias: what
  // the batch loader makes on the host (PrepareBatch), bit for bit.
  virtual void PrepareImages(int n, const Shape& shape, const uint8_t* pixels,
                             const SamplePlacement* placements,
                             const float* scale_bias, float* out) = 0;

  // --- recording (CUDA graphs) ---
  // Whether StartRecording can succeed: a GPU; the CPU runs calls as they
  // are issued and has nothing to gain.
  virtual bool can_record() const { return false; }
  // The calls issued from StartRecording to FinishRecording are recorded,
  // not run: nothing of them runs until the Recording replays. Kernels must
  // have run once before (so that nothing is set up lazily while
  // recording). In between, nothing may wait for the device (CopyToHost,
  // SumSquares, Synchronize, WaitUploaded), allocate or free, or Upload;
  // scalars passed to calls are fixed in the recording, so what changes
  // between replays must come from device memory (SetDropoutKey, batches).
  // A failure returns an error and leaves the backend running calls as
  // issued again; so does a CUDA, cuDNN or cuBLAS call in between that
  // fails (one that cannot be recorded): instead of ending the process, as
  // while running, it makes FinishRecording return its error. (The
  // caller's own errors, such as a batch beyond a kernel's max_batch, still
  // end it.)
  virtual absl::Status StartRecording();
  virtual absl::StatusOr<std::unique_ptr<Recording>> FinishRecording();

  // --- kernels with shape-dependent set-up ---
  // `max_batch` bounds n at every call of the kernel.
  virtual absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(
      const ConvDesc& desc, int max_batch) = 0;
  virtual absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(const FcDesc& desc,
                                                           int max_batch) = 0;
  virtual absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(
      const PoolDesc& desc, int max_batch) = 0;
  // Whether MakeBatchNorm's kernels take statistics over ranks that split
  // one mini-batch (BatchNormKernel::SpanSums and the rest).
  virtual bool batch_norm_spans_ranks() const { return false; }
  virtual absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
      const BatchNormDesc& desc, int max_batch) = 0;
  virtual absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>>
  MakeSyncBatchNorm(const BatchNormDesc& desc, int max_batch) = 0;

  // --- element-wise; `count` elements ---
  virtual void ActivationForward(const ActivationDesc& desc, int64_t count,
                                 const float* x, float* y) = 0;
  virtual void ActivationBackward(const ActivationDesc& desc, int64_t count,
                                  const float* x, const float* dy,
                                  float* dx) = 0;
  // The key dropout draws from until the next call: a training step's
  // (seed, iteration, rank). Issued in order like a kernel: on a GPU it is
  // written to device memory, where DropoutForward reads it, so that a
  // step recorded once (StartRecording) draws anew each time it replays
  // after a new key.
  virtual void SetDropoutKey(uint64_t key) = 0;
  // Inverted dropout: mask[i] = (draw(Key(key, salt), i) >= p) / (1 - p),
  // y = x * mask, where key is SetDropoutKey's (0 before any), `salt` tells
  // the layers of a step apart, and draw is rng.h's UniformAt, a
  // counter-based uniform [0, 1): the same on every backend.
  virtual void DropoutForward(float p, uint64_t salt, int64_t count,
                              const float* x, float* mask, float* y) = 0;
  // dx = dy * mask.
  virtual void Multiply(int64_t count, const float* a, const float* b,
                        float* out) = 0;
  // out = a + b; `out` may be `a` or `b` (an add layer's sum, a gradient
  // accumulated over the layers that use one output).
  virtual void Add(int64_t count, const float* a, const float* b,
                   float* out) = 0;
  // out = activation(a + b), `out` as for Add: an add layer with its relu
  // folded in. By default Add, then ActivationForward in place.
  virtual void AddActivation(const ActivationDesc& desc, int64_t count,
                             const float* a, const float* b, float* out);
  // Only where bf16_activations(), for an add that takes one input in bf16
  // (`b16`: count bf16 values): out = a + b16, then relu where `relu`; and
  // out16 = bf16(g), or bf16 of g where y > 0 (relu's gradient from its
  // output) when `y` is not null. Rounding is to nearest even, as oneDNN's.
  virtual void AddBf16(bool relu, int64_t count, const float* a,
                       const void* b16, float* out);
  virtual void GradientToBf16(int64_t count, const float* y, const float* g,
                              void* out16);
  // Copies `rows` rows of `cols` floats from src (rows `src_stride` floats
  // apart) to dst (rows `dst_stride` apart): a concat layer's channels in
  // and out of its NHWC output. The two must not overlap.
  virtual void CopyStrided(int64_t rows, int64_t cols, const float* src,
                           int64_t src_stride, float* dst,
                           int64_t dst_stride) = 0;

  // Softmax over each row of logits (n, classes) into probs, then adds the
  // rows' summed cross-entropy -sum_k q_k log(probs[k]) to stats[0] and the
  // number of rows whose argmax (first on ties) is the label to stats[1],
  // where the target q = (1 - smoothing) * onehot(label) + smoothing /
  // classes (label smoothing; 0: -log(probs[label])). stats is device
  // float[2]. Labels are in [0, classes).
  virtual void SoftmaxCrossEntropy(int n, int classes, const float* logits,
                                   const int32_t* labels, float smoothing,
                                   float* probs, float* stats) = 0;
  // dlogits = (probs - q) * scale, q as above.
  virtual void SoftmaxCrossEntropyBackward(int n, int classes,
                                           const float* probs,
                                           const int32_t* labels,
                                           float smoothing, float scale,
                                           float* dlogits) = 0;

  // --- solvers: one pass over the contiguous parameter buffer ---
  // The first `decayed` of the `count` parameters get L2 regularisation
  // (grad + l2 * param); the rest (biases, batchnorm) do not. All updates
  // are MATLAB's trainingOptions formulas.
  // v = momentum * v - lr * g;  p += v.
  virtual void SgdmUpdate(int64_t count, int64_t decayed, float lr,
                          float momentum, float l2, float* params,
                          const float* grads, float* velocity) = 0;
  // Nesterov's momentum in the same terms (Sutskever et al. 2013; PyTorch's
  // nesterov=True with v = -lr * its buffer):
  // v = momentum * v - lr * g;  p += momentum * v - lr * g.
  virtual void SgdmNesterovUpdate(int64_t count, int64_t decayed, float lr,
                                  float momentum, float l2, float* params,
                                  const float* grads, float* velocity) = 0;
  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps); t >= 1.
  virtual void AdamUpdate(int64_t count, int64_t decayed, float lr, float beta1,
                          float beta2, float epsilon, int64_t t, float l2,
                          float* params, const float* grads, float* m,
                          float* v) = 0;
  // v = b2 v + (1-b2) g^2;  p -= lr * g / (sqrt(v) + eps).
  virtual void RmspropUpdate(int64_t count, int64_t decayed, float lr,
                             float beta2, float epsilon, float l2,
                             float* params, const float* grads, float* v) = 0;
  // Sum of squares in double precision; waits for the result (a host sync).
  // Non-finite elements make the result non-finite.
  virtual double SumSquares(int64_t count, const float* x) = 0;
  virtual void Scale(int64_t count, float alpha, float* x) = 0;
  // Gradient clipping (MATLAB's l2norm method) without a host wait: where
  // ‖x‖ (SumSquares' double sum) exceeds `threshold`, x *= float(threshold
  // / ‖x‖). A NaN norm leaves x as it is; the loss shows it.
  virtual void ClipToNorm(int64_t count, double threshold, float* x) = 0;
};

// The CPU backend: oneDNN kernels on `threads` OpenMP threads (0: all cores).
// With `bf16` (train.options.precision: bf16), convolutions and fully
// connected layers compute in bfloat16 (oneDNN's bf16 primitives: inputs,
// weights and output gradients rounded to bf16, products summed in float32
// into float32 outputs and weight gradients); the buffers of this
// interface stay float32 but between a convolution and a batch norm that
// take bf16 from each other (bf16_activations), and so do pooling, the
// element-wise layers, the loss, the solvers (the weights are float32
// masters, rounded for each call) and batch normalisation's statistics and
// parameters. FailedPrecondition, saying why, where this CPU cannot
// (CpuBf16Support).
absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(int threads,
                                                        bool bf16 = false);

// Before CPU backends of several threads run at once (trainer/
// thread_ranks.h): each makes its own oneDNN primitives from then on. Two
// backends that made the same primitive got one object from oneDNN 2.6's
// primitive cache, and running it from two threads at once corrupted the
// heap (one run in eight of LeNet split over two threads); without the
// cache they share nothing. Kernels are made when a network is built, so
// this costs no step.
void SeparateCpuBackends();

// OK where oneDNN runs bf16 primitives natively on this CPU (AVX-512 BF16
// or AMX); else FailedPrecondition naming what the CPU has and what to do.
absl::Status CpuBf16Support();

// OK where a GPU of compute capability major.minor has the tensor cores
// that precision bf16 (`bf16`) or fp16 computes on: bf16 from 8.0
// (Ampere) on, fp16 from 7.0 (Volta). Else FailedPrecondition naming the
// GPU (`device`, `name`), what it has and what to use instead.
absl::Status GpuLowPrecisionSupport(bool bf16, int device,
                                    const std::string& name, int major,
                                    int minor);

// A switch of the trainer's environment: unset (or empty) -> nullopt, "1"
// -> true, "0" -> false; another value is InvalidArgument saying what each
// means (`on`, `off`).
absl::StatusOr<std::optional<bool>> EnvironmentSwitch(const char* name,
                                                      const char* on,
                                                      const char* off);

// DLBATCH_CONV_LOWERED: every GPU convolution as a matrix product (true) or
// by cuDNN (false); unset, whichever times faster. The GPU backend reads
// it; dlbatch-train checks it on any device, so that a typo is refused on
// the CPU too.
absl::StatusOr<std::optional<bool>> ConvLoweredSwitch();

// DLBATCH_FOLD_RELU: 0 runs every relu as a layer of its own instead of
// folding it into the layer before (Backend::folds_relu); unset or 1, the
// backend's default. The CPU backend reads it; dlbatch-train checks it.
absl::StatusOr<std::optional<bool>> FoldReluSwitch();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_BACKEND_H_
