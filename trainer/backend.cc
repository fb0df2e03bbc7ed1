#include "trainer/backend.h"

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlbatch::trainer {

Buffer::~Buffer() {
  if (data_ != nullptr) backend_->Free(data_);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) backend_->Free(data_);
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<HostMemory> HostMemory::Allocate(Backend* backend,
                                                size_t bytes) {
  HostMemory m;
  m.backend_ = backend;
  m.data_ = backend->AllocateHost(bytes);
  if (m.data_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes,
        " bytes of host memory for batches; use a smaller mini_batch_size"));
  }
  return m;
}

HostMemory::~HostMemory() {
  if (data_ != nullptr) backend_->FreeHost(data_);
}

HostMemory& HostMemory::operator=(HostMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) backend_->FreeHost(data_);
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

void* Backend::AllocateHost(size_t bytes) {
  return ::operator new (bytes == 0 ? 64 : bytes, std::align_val_t{64},
                         std::nothrow);
}

void Backend::FreeHost(void* host) {
  ::operator delete (host, std::align_val_t{64});
}

absl::Status Backend::StartRecording() {
  return absl::UnimplementedError(
      absl::StrCat(Describe(), " cannot record work; it runs calls as issued"));
}

absl::StatusOr<std::unique_ptr<Recording>> Backend::FinishRecording() {
  return absl::FailedPreconditionError("FinishRecording without a recording");
}

absl::Status GpuLowPrecisionSupport(bool bf16, int device,
                                    const std::string& name, int major,
                                    int minor) {
  const int needed = bf16 ? 8 : 7;
  if (major >= needed) return absl::OkStatus();
  const char* type = bf16 ? "bf16" : "fp16";
  return absl::FailedPreconditionError(absl::StrCat(
      "precision: ", type, " needs a GPU with ", type,
      " tensor cores (compute capability ", needed, ".0 or later), but gpu ",
      device, " (", name, ") has compute capability ", major, ".", minor,
      "; use ",
      bf16 && major >= 7 ? "precision: fp16 (with loss scaling) or " : "",
      "precision: fp32 on it"));
}

absl::StatusOr<std::optional<bool>> EnvironmentSwitch(const char* name,
                                                      const char* on,
                                                      const char* off) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string_view v(value);
  if (v == "1") return true;
  if (v == "0") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, " is \"", value, "\"; set it to 1 (", on, ") or 0 (",
                   off, "), or unset it"));
}

absl::StatusOr<std::optional<bool>> ConvLoweredSwitch() {
  return EnvironmentSwitch("DLBATCH_CONV_LOWERED",
                           "every convolution as a matrix product",
                           "every convolution by cuDNN");
}

absl::StatusOr<std::optional<bool>> FoldReluSwitch() {
  return EnvironmentSwitch("DLBATCH_FOLD_RELU",
                           "fold a relu into the layer before it, the default",
                           "run every relu as a layer of its own");
}

namespace {
[[noreturn]] void NoSpan(const char* what) {
  std::fprintf(stderr,
               "fatal: BatchNormKernel::%s on a backend whose batch "
               "norm does not span ranks\n",
               what);
  std::abort();
}
}  // namespace

void BatchNormKernel::SpanSums(int, const float*, const float*, float*) {
  NoSpan("SpanSums");
}
void BatchNormKernel::SpanForward(int, const float*, const float*, const float*,
                                  const float*, const float*, float*, float*,
                                  float*, float*, float*, float) {
  NoSpan("SpanForward");
}
void BatchNormKernel::SpanBackward(int, const float*, const float*,
                                   const float*, const float*, const float*,
                                   float*, float*, float*, float*) {
  NoSpan("SpanBackward");
}
void BatchNormKernel::SpanFinish(int, const float*, const float*, const float*,
                                 const float*, const float*, float*) {
  NoSpan("SpanFinish");
}

void Backend::AddBf16(bool, int64_t, const float*, const void*, float*) {
  std::fprintf(stderr, "fatal: %s: AddBf16 without bf16 activations\n",
               Describe().c_str());
  std::abort();
}

void Backend::GradientToBf16(int64_t, const float*, const float*, void*) {
  std::fprintf(stderr, "fatal: %s: GradientToBf16 without bf16 activations\n",
               Describe().c_str());
  std::abort();
}

void Backend::AddActivation(const ActivationDesc& desc, int64_t count,
                            const float* a, const float* b, float* out) {
  Add(count, a, b, out);
  ActivationForward(desc, count, out, out);
}

}  // namespace dlbatch::trainer
