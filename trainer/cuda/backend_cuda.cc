// The GPU backend: device memory, one non-blocking stream per backend on
// which every copy, cuDNN and cuBLAS call and kernel of ours runs in issue
// order, and the kernels of gpu_*.cc and backend_cuda_kernels.cu.
#include "trainer/cuda/backend_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"

namespace dlbatch::trainer {
namespace gpu {

void Die(const char* what, const char* file, int line, const char* detail) {
  std::fprintf(stderr, "fatal: GPU backend: %s failed at %s:%d: %s\n", what,
               file, line, detail);
  std::fflush(stderr);
  std::abort();
}

namespace {
// The innermost CaptureErrors open on this thread, if any.
thread_local CaptureErrors* open_capture_errors = nullptr;
}  // namespace

void Fault(const char* what, const char* file, int line, const char* detail) {
  if (open_capture_errors == nullptr) Die(what, file, line, detail);
  open_capture_errors->Keep(what, file, line, detail);
}

CaptureErrors::CaptureErrors() : outer_(open_capture_errors) {
  open_capture_errors = this;
}
// Scopes close in any order: one closed out of turn is unlinked.
CaptureErrors::~CaptureErrors() {
  if (open_capture_errors == this) {
    open_capture_errors = outer_;
    return;
  }
  for (CaptureErrors* s = open_capture_errors; s != nullptr; s = s->outer_) {
    if (s->outer_ == this) {
      s->outer_ = outer_;
      return;
    }
  }
}

void CaptureErrors::Keep(const char* what, const char* file, int line,
                         const char* detail) {
  if (first_.ok()) {
    first_ = CallError(absl::StatusCode::kInternal, what, file, line, detail);
  }
}

absl::Status CallError(absl::StatusCode code, const char* what,
                       const char* file, int line, const char* detail) {
  return absl::Status(code, absl::StrCat("GPU backend: ", what, " failed at ",
                                         file, ":", line, ": ", detail));
}

void NoBackwardData(const std::string& name) {
  Die(name.c_str(), __FILE__, __LINE__,
      "backward data asked of a convolution whose input gradient the network "
      "never wants (ConvDesc::input_grad)");
}

absl::Status DeviceAlloc(void** data, size_t bytes, int device,
                         absl::string_view what) {
  *data = nullptr;
  if (cudaMalloc(data, bytes == 0 ? 256 : bytes) == cudaSuccess) {
    return absl::OkStatus();
  }
  cudaGetLastError();  // not sticky: clear it
  *data = nullptr;
  return absl::ResourceExhaustedError(absl::StrCat(
      "GPU ", device, ": cannot allocate ", bytes,
      " bytes of device memory for ", what,
      "; use a smaller mini_batch_size, or fewer filters or units"));
}

absl::Status Context::ReserveWorkspace(size_t bytes) {
  if (bytes <= workspace_bytes) return absl::OkStatus();
  // The new one first, so that a failure leaves the old one in place; if
  // both do not fit at once, the old one goes first. Freeing waits for the
  // device, so work queued on the old one is done.
  void* grown = nullptr;
  if (cudaMalloc(&grown, bytes) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    grown = nullptr;
    if (workspace != nullptr) {
      DLBATCH_CUDA_RETURN_IF_ERROR(cudaFree(workspace));
      workspace = nullptr;
      ++workspace_moves;
      if (cudaMalloc(&grown, bytes) != cudaSuccess) {
        cudaGetLastError();
        grown = nullptr;
        // Back to the size the kernels made so far reserved, if it fits.
        if (cudaMalloc(&workspace, workspace_bytes) != cudaSuccess) {
          cudaGetLastError();
          workspace = nullptr;
          workspace_bytes = 0;
        }
      }
    }
    if (grown == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "GPU ", device, ": cannot allocate a cuDNN workspace of ", bytes,
          " bytes; use a smaller mini_batch_size"));
    }
  } else if (workspace != nullptr) {
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaFree(workspace));
  }
  workspace = grown;
  workspace_bytes = bytes;
  ++workspace_moves;
  return absl::OkStatus();
}

void* Context::Workspace(size_t bytes) {
  if (bytes > workspace_bytes) {
    const absl::Status status = ReserveWorkspace(bytes);
    if (!status.ok()) {
      Die("Context::Workspace", __FILE__, __LINE__,
          std::string(status.message()).c_str());
    }
  }
  return workspace;
}

absl::Status SetNhwc(const TensorDescriptor& desc, int n, const Shape& shape,
                     cudnnDataType_t type) {
  // cuDNN describes tensors of at most 2 Gi elements (it answers
  // NOT_SUPPORTED beyond): say what that means for the job.
  const int64_t elements = int64_t{n} * shape.c * shape.h * shape.w;
  if (elements > std::numeric_limits<int32_t>::max()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a batch of ", n, " ", shape.ToString(), " activations is ", elements,
        " floats, more than the 2147483647 cuDNN takes in one tensor; use a "
        "smaller mini_batch_size"));
  }
  DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(
      desc.get(), CUDNN_TENSOR_NHWC, type, n, shape.c, shape.h, shape.w));
  return absl::OkStatus();
}

namespace {

// A captured graph, replayed on the stream it was captured from. Freed
// before its backend (backend.h: a backend outlives what it made).
class CudaRecording final : public Recording {
 public:
  CudaRecording(const Context* ctx, cudaGraph_t graph)
      : ctx_(ctx), graph_(graph), moves_(ctx->workspace_moves) {}
  ~CudaRecording() override {
    if (exec != nullptr) cudaGraphExecDestroy(exec);  // best effort
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  void Replay() override {
    if (stale()) {
      Die("Recording::Replay", __FILE__, __LINE__,
          "the cuDNN workspace moved since the recording (record again)");
    }
    DLBATCH_CUDA_CHECK(cudaGraphLaunch(exec, ctx_->stream));
  }
  bool stale() const override { return ctx_->workspace_moves != moves_; }

  cudaGraphExec_t exec = nullptr;  // set by FinishRecording

 private:
  const Context* ctx_;
  cudaGraph_t graph_;
  uint64_t moves_;  // ctx_->workspace_moves when recorded
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() = default;
  ~CudaBackend() override {
    // Best effort: a failure here has nothing left to protect.
    if (ctx_.stream != nullptr) cudaStreamSynchronize(ctx_.stream);
    if (ctx_.workspace != nullptr) cudaFree(ctx_.workspace);
    if (sum_partial_ != nullptr) cudaFree(sum_partial_);
    if (dropout_key_ != nullptr) cudaFree(dropout_key_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
    if (sum_host_ != nullptr) cudaFreeHost(sum_host_);
    if (ctx_.cublas != nullptr) ctx_.blas->Destroy(ctx_.cublas);
    if (ctx_.cudnn != nullptr) cudnnDestroy(ctx_.cudnn);
    for (cudaEvent_t e : upload_done_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (compute_mark_ != nullptr) cudaEventDestroy(compute_mark_);
    if (upload_stream_ != nullptr) cudaStreamDestroy(upload_stream_);
    if (ctx_.stream != nullptr) cudaStreamDestroy(ctx_.stream);
  }

  absl::Status Init(int device, const CudaBackendOptions& options) {
    ctx_.device = device;
    ctx_.tf32 = options.tf32;
    using LowPrecision = CudaBackendOptions::LowPrecision;
    ctx_.low_precision = options.low_precision != LowPrecision::kNone;
    ctx_.low = options.low_precision == LowPrecision::kFp16
                   ? gpu::LowType::kFp16
                   : gpu::LowType::kBf16;
    ctx_.lowering = options.lowering;
    if (options.lowering == CudaBackendOptions::Lowering::kTimed) {
      absl::StatusOr<std::optional<bool>> lowered = ConvLoweredSwitch();
      if (!lowered.ok()) return lowered.status();
      if (lowered->has_value()) {
        ctx_.lowering = **lowered ? CudaBackendOptions::Lowering::kAlways
                                  : CudaBackendOptions::Lowering::kNever;
      }
    }
    ctx_.lowered_bytes = options.lowered_bytes;
    ctx_.lowered_groups = options.lowered_groups;
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaDeviceProp prop{};
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
    // A GPU older than every architecture the build has code for would
    // otherwise fail at its first kernel, after the network is built.
    if (const cudaError_t image = gpu::KernelImageStatus();
        image != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      const std::string which =
          absl::StrCat("gpu ", device, " (", prop.name, ", compute capability ",
                       prop.major, ".", prop.minor, ")");
      return absl::FailedPreconditionError(absl::StrCat(
          which, " cannot run this dlbatch-train's GPU code (",
          cudaGetErrorString(image), "): it was built for CUDA architectures ",
          DLBATCH_CUDA_ARCHITECTURES,
          "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=native on a machine "
          "with this GPU, or train with execution_environment: cpu"));
    }
    if (ctx_.low_precision) {
      if (absl::Status s =
              GpuLowPrecisionSupport(ctx_.low == gpu::LowType::kBf16, device,
                                     prop.name, prop.major, prop.minor);
          !s.ok()) {
        return s;
      }
    }
    description_ = absl::StrCat(
        "gpu ", device, ": ", prop.name, " (sm_", prop.major, prop.minor, ", ",
        prop.totalGlobalMem >> 30, " GiB), cuDNN ", cudnnGetVersion(),
        !ctx_.low_precision               ? (options.tf32 ? ", tf32" : ", fp32")
        : ctx_.low == gpu::LowType::kBf16 ? ", bf16"
                                          : ", fp16",
        // Low-precision convolutions run by cuDNN alone (gpu_conv_low.cc).
        ctx_.low_precision ? ""
        : ctx_.lowering == CudaBackendOptions::Lowering::kAlways
            ? ", convolutions lowered"
        : ctx_.lowering == CudaBackendOptions::Lowering::kNever
            ? ", convolutions by cuDNN"
            : "");
    DLBATCH_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    DLBATCH_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking));
    DLBATCH_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    for (cudaEvent_t& e : upload_done_) {
      DLBATCH_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnCreate(&ctx_.cudnn));
    DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetStream(ctx_.cudnn, ctx_.stream));
    absl::StatusOr<const gpu::CublasLibrary*> blas = gpu::LoadCublas();
    if (!blas.ok()) return blas.status();
    ctx_.blas = *blas;
    DLBATCH_CUBLAS_RETURN_IF_ERROR(ctx_.blas->Create(&ctx_.cublas));
    DLBATCH_CUBLAS_RETURN_IF_ERROR(
        ctx_.blas->SetStream(ctx_.cublas, ctx_.stream));
    DLBATCH_CUBLAS_RETURN_IF_ERROR(ctx_.blas->SetMathMode(
        ctx_.cublas,
        options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    // A workspace of our own (after cublasSetStream, which resets it), so
    // that cuBLAS allocates nothing while a step is recorded; the sizes
    // cuBLAS's documentation recommends (32 MiB from Hopper on, 4 before).
    const size_t cublas_bytes =
        prop.major >= 9 ? size_t{32} << 20 : size_t{4} << 20;
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaMalloc(&cublas_workspace_, cublas_bytes));
    DLBATCH_CUBLAS_RETURN_IF_ERROR(
        ctx_.blas->SetWorkspace(ctx_.cublas, cublas_workspace_, cublas_bytes));
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaMalloc(&dropout_key_, sizeof(uint64_t)));
    DLBATCH_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(dropout_key_, 0, sizeof(uint64_t), ctx_.stream));
    DLBATCH_CUDA_RETURN_IF_ERROR(
        cudaMalloc(&sum_partial_, (kSumSquaresBlocks + 1) * sizeof(double)));
    DLBATCH_CUDA_RETURN_IF_ERROR(cudaMallocHost(&sum_host_, sizeof(double)));
    return absl::OkStatus();
  }

  std::string Describe() const override { return description_; }
  bool on_gpu() const override { return true; }
  bool scales_loss() const override {
    return ctx_.low_precision && ctx_.low == gpu::LowType::kFp16;
  }

  // One "algorithm<TAB>key" line per choice, as the CPU backend's.
  std::string SaveTuning() const override {
    std::string out;
    for (const auto& [key, algo] : ctx_.tuning) {
      absl::StrAppend(&out, algo, "\t", key, "\n");
    }
    return out;
  }
  void LoadTuning(const std::string& tuning) override {
    for (absl::string_view line :
         absl::StrSplit(tuning, '\n', absl::SkipEmpty())) {
      const size_t tab = line.find('\t');
      int algo = 0;
      if (tab == absl::string_view::npos ||
          !absl::SimpleAtoi(line.substr(0, tab), &algo) || algo < 0) {
        continue;  // a hint only: a CPU run's lines never match our keys
      }
      ctx_.tuning[std::string(line.substr(tab + 1))] = algo;
    }
  }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    void* data = nullptr;
    RETURN_IF_ERROR(
        DeviceAlloc(&data, bytes, ctx_.device, "the network's buffers"));
    DLBATCH_CUDA_CHECK(
        cudaMemsetAsync(data, 0, bytes == 0 ? 256 : bytes, ctx_.stream));
    return Buffer(this, data, bytes);
  }
  void Free(void* data) override { DLBATCH_CUDA_CHECK(cudaFree(data)); }
  // From pageable memory the call returns once the source is staged, so the
  // caller may reuse it at once (backend.h).
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    DLBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes,
                                       cudaMemcpyHostToDevice, ctx_.stream));
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    DLBATCH_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes,
                                       cudaMemcpyDeviceToHost, ctx_.stream));
    DLBATCH_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (dst == src || bytes == 0) return;
    DLBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                       cudaMemcpyDeviceToDevice, ctx_.stream));
  }
  void Fill(float* x, int64_t count, float value) override {
    LaunchFill(ctx_.stream, x, count, value);
  }
  void Synchronize() override {
    DLBATCH_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void* native_stream() override { return ctx_.stream; }

  void* AllocateHost(size_t bytes) override {
    void* host = nullptr;
    if (cudaMallocHost(&host, bytes == 0 ? 64 : bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return host;
  }
  void FreeHost(void* host) override {
    if (host != nullptr) DLBATCH_CUDA_CHECK(cudaFreeHost(host));
  }
  // The upload stream waits for the compute queued so far (an event), then
  // copies; each upload records one of a ring of events. A token older
  // than the ring waits on a later upload of the same stream: later, so
  // done after it.
  uint64_t Upload(void* dst, const void* host_src, size_t bytes) override {
    DLBATCH_CUDA_CHECK(cudaEventRecord(compute_mark_, ctx_.stream));
    DLBATCH_CUDA_CHECK(cudaStreamWaitEvent(upload_stream_, compute_mark_, 0));
    DLBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes,
                                       cudaMemcpyHostToDevice, upload_stream_));
    const uint64_t token = ++uploads_;
    DLBATCH_CUDA_CHECK(cudaEventRecord(
        upload_done_[token % upload_done_.size()], upload_stream_));
    return token;
  }
  void UseUploads() override {
    if (uploads_ == 0) return;
    DLBATCH_CUDA_CHECK(cudaStreamWaitEvent(
        ctx_.stream, upload_done_[uploads_ % upload_done_.size()], 0));
  }
  void WaitUploaded(uint64_t token) override {
    if (token == 0 || token > uploads_) return;
    DLBATCH_CUDA_CHECK(
        cudaEventSynchronize(upload_done_[token % upload_done_.size()]));
  }

  bool Uploaded(uint64_t token) override {
    if (token == 0 || token > uploads_) return true;
    const cudaError_t done =
        cudaEventQuery(upload_done_[token % upload_done_.size()]);
    if (done == cudaErrorNotReady) return false;
    DLBATCH_CUDA_CHECK(done);
    return true;
  }

  bool can_record() const override { return true; }
  // Stream capture into a CUDA graph. Thread-local mode: a call of this
  // thread that cannot be recorded (a wait for the device, an allocation)
  // fails, and FinishRecording with it (CaptureErrors), instead of quietly
  // running at record time; other threads (the batch loader) are not
  // concerned.
  absl::Status StartRecording() override {
    if (capture_errors_ != nullptr) {
      return absl::FailedPreconditionError("StartRecording while recording");
    }
    RETURN_IF_ERROR(Recoverable(
        cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture", __LINE__));
    capture_errors_ = std::make_unique<CaptureErrors>();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Recording>> FinishRecording() override {
    if (capture_errors_ == nullptr) {
      return absl::FailedPreconditionError(
          "FinishRecording without StartRecording");
    }
    const absl::Status failed = capture_errors_->status();
    capture_errors_.reset();
    cudaGraph_t graph = nullptr;
    // Ends the capture whatever happened in it: the stream runs calls as
    // issued again.
    const absl::Status ended =
        Recoverable(cudaStreamEndCapture(ctx_.stream, &graph),
                    "cudaStreamEndCapture", __LINE__);
    auto recording = std::make_unique<CudaRecording>(&ctx_, graph);
    if (!failed.ok()) {
      cudaGetLastError();  // a launch's error, kept in failed
      return failed;
    }
    RETURN_IF_ERROR(ended);
    RETURN_IF_ERROR(
        Recoverable(cudaGraphInstantiate(&recording->exec, graph, 0),
                    "cudaGraphInstantiate", __LINE__));
    // Sets the graph up on the device now rather than at its first replay.
    RETURN_IF_ERROR(Recoverable(cudaGraphUpload(recording->exec, ctx_.stream),
                                "cudaGraphUpload", __LINE__));
    return std::unique_ptr<Recording>(std::move(recording));
  }

  // A failed call's Status, with the runtime's last error cleared, so that
  // the next launch check does not take it for its own.
  static absl::Status Recoverable(cudaError_t error, const char* what,
                                  int line) {
    if (error == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();
    return CallError(absl::StatusCode::kInternal, what, __FILE__, line,
                     cudaGetErrorString(error));
  }

  absl::StatusOr<std::unique_ptr<ConvKernel>> MakeConv(const ConvDesc& desc,
                                                       int max_batch) override {
    if (ctx_.low_precision) return gpu::MakeLowConv(&ctx_, desc, max_batch);
    return gpu::MakeConv(&ctx_, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<FcKernel>> MakeFc(const FcDesc& desc,
                                                   int max_batch) override {
    return gpu::MakeFc(&ctx_, this, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<PoolKernel>> MakePool(const PoolDesc& desc,
                                                       int max_batch) override {
    return gpu::MakePool(&ctx_, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<BatchNormKernel>> MakeBatchNorm(
      const BatchNormDesc& desc, int max_batch) override {
    return gpu::MakeBatchNorm(&ctx_, this, desc, max_batch);
  }
  absl::StatusOr<std::unique_ptr<SyncBatchNormKernel>> MakeSyncBatchNorm(
      const BatchNormDesc& desc, int max_batch) override {
    return gpu::MakeSyncBatchNorm(&ctx_, this, desc, max_batch);
  }

  void ActivationForward(const ActivationDesc& desc, int64_t count,
                         const float* x, float* y) override {
    if (desc.kind == ActivationKind::kGelu) {
      LaunchGeluForward(ctx_.stream, count, x, y);
    } else {
      LaunchActivationForward(ctx_.stream, desc.alpha, count, x, y);
    }
  }
  void ActivationBackward(const ActivationDesc& desc, int64_t count,
                          const float* x, const float* dy, float* dx) override {
    if (desc.kind == ActivationKind::kGelu) {
      LaunchGeluBackward(ctx_.stream, count, x, dy, dx);
    } else {
      LaunchActivationBackward(ctx_.stream, desc.alpha, count, x, dy, dx);
    }
  }
  void SetDropoutKey(uint64_t key) override {
    LaunchStoreU64(ctx_.stream, dropout_key_, key);
  }
  void DropoutForward(float p, uint64_t salt, int64_t count, const float* x,
                      float* mask, float* y) override {
    LaunchDropoutForward(ctx_.stream, p, dropout_key_, salt, count, x, mask, y);
  }
  void Multiply(int64_t count, const float* a, const float* b,
                float* out) override {
    LaunchMultiply(ctx_.stream, count, a, b, out);
  }
  void Add(int64_t count, const float* a, const float* b, float* out) override {
    LaunchAdd(ctx_.stream, count, a, b, out);
  }
  void CopyStrided(int64_t rows, int64_t cols, const float* src,
                   int64_t src_stride, float* dst,
                   int64_t dst_stride) override {
    LaunchCopyStrided(ctx_.stream, rows, cols, src, src_stride, dst,
                      dst_stride);
  }
  void SoftmaxCrossEntropy(int n, int classes, const float* logits,
                           const int32_t* labels, float smoothing, float* probs,
                           float* stats) override {
    LaunchSoftmaxCrossEntropy(ctx_.stream, n, classes, logits, labels,
                              smoothing, probs, stats);
  }
  void SoftmaxCrossEntropyBackward(int n, int classes, const float* probs,
                                   const int32_t* labels, float smoothing,
                                   float scale, float* dlogits) override {
    LaunchSoftmaxCrossEntropyBackward(ctx_.stream, n, classes, probs, labels,
                                      smoothing, scale, dlogits);
  }
  void SgdmUpdate(int64_t count, int64_t decayed, float lr, float momentum,
                  float l2, float* params, const float* grads,
                  float* velocity) override {
    LaunchSgdmUpdate(ctx_.stream, count, decayed, lr, momentum, l2, params,
                     grads, velocity, /*nesterov=*/false);
  }
  void SgdmNesterovUpdate(int64_t count, int64_t decayed, float lr,
                          float momentum, float l2, float* params,
                          const float* grads, float* velocity) override {
    LaunchSgdmUpdate(ctx_.stream, count, decayed, lr, momentum, l2, params,
                     grads, velocity, /*nesterov=*/true);
  }
  void AdamUpdate(int64_t count, int64_t decayed, float lr, float beta1,
                  float beta2, float epsilon, int64_t t, float l2,
                  float* params, const float* grads, float* m,
                  float* v) override {
    // The bias corrections as the CPU backend computes them.
    const double tt = static_cast<double>(t < 1 ? 1 : t);
    const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(beta1, tt)));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(beta2, tt)));
    LaunchAdamUpdate(ctx_.stream, count, decayed, lr, beta1, beta2, epsilon, c1,
                     c2, l2, params, grads, m, v);
  }
  void RmspropUpdate(int64_t count, int64_t decayed, float lr, float beta2,
                     float epsilon, float l2, float* params, const float* grads,
                     float* v) override {
    LaunchRmspropUpdate(ctx_.stream, count, decayed, lr, beta2, epsilon, l2,
                        params, grads, v);
  }
  double SumSquares(int64_t count, const float* x) override {
    double* result = sum_partial_ + kSumSquaresBlocks;
    LaunchSumSquares(ctx_.stream, count, x, sum_partial_, result);
    DLBATCH_CUDA_CHECK(cudaMemcpyAsync(sum_host_, result, sizeof(double),
                                       cudaMemcpyDeviceToHost, ctx_.stream));
    DLBATCH_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    return *sum_host_;
  }
  void Scale(int64_t count, float alpha, float* x) override {
    LaunchScale(ctx_.stream, count, alpha, x);
  }
  void ClipToNorm(int64_t count, double threshold, float* x) override {
    double* sum = sum_partial_ + kSumSquaresBlocks;
    LaunchSumSquares(ctx_.stream, count, x, sum_partial_, sum);
    LaunchScaleToNorm(ctx_.stream, count, threshold, sum, x);
  }
  void PrepareImages(int n, const Shape& shape, const uint8_t* pixels,
                     const SamplePlacement* placements, const float* scale_bias,
                     float* out) override {
    LaunchPrepareImages(ctx_.stream, n, shape.h, shape.w, shape.c, pixels,
                        placements, scale_bias, out);
  }

 private:
  Context ctx_;
  std::string description_;
  double* sum_partial_ = nullptr;  // device: the blocks' sums, then the total
  double* sum_host_ = nullptr;     // pinned: SumSquares' result
  cudaStream_t upload_stream_ = nullptr;      // Upload's copies
  cudaEvent_t compute_mark_ = nullptr;        // Upload: the compute before it
  std::array<cudaEvent_t, 8> upload_done_{};  // by token % 8
  uint64_t uploads_ = 0;                      // tokens given
  // Open from StartRecording to FinishRecording (on the recording thread):
  // non-null while recording.
  std::unique_ptr<CaptureErrors> capture_errors_;
  uint64_t* dropout_key_ = nullptr;  // device: SetDropoutKey's
  void* cublas_workspace_ = nullptr;
};

}  // namespace
}  // namespace gpu

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver, no device: not an error here
    return 0;
  }
  return count;
}

std::vector<CudaDeviceInfo> ListCudaDevices() {
  std::vector<CudaDeviceInfo> out;
  const int count = CudaDeviceCount();
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    info.uuid = "GPU-";
    for (int b = 0; b < 16; ++b) {
      if (b == 4 || b == 6 || b == 8 || b == 10) info.uuid += '-';
      absl::StrAppend(&info.uuid, absl::Hex(u[b], absl::kZeroPad2));
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, const CudaBackendOptions& options) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return absl::UnavailableError(absl::StrCat(
        "GPU ", device, ": this machine has ", count, " visible CUDA device(s)",
        count == 0
            ? " (no driver or no GPU; CUDA_VISIBLE_DEVICES may hide them); use "
              "execution_environment: cpu"
            : absl::StrCat(" (numbered 0 to ", count - 1,
                           "); use one of those, or execution_environment: "
                           "cpu")));
  }
  auto backend = std::make_unique<gpu::CudaBackend>();
  if (absl::Status s = backend->Init(device, options); !s.ok()) return s;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace dlbatch::trainer
