// The GPU backend's return-code checks (backend_cuda_internal.h,
// backend_cuda_launch.h): a failed CUDA, cuDNN or cuBLAS call ends the
// trainer process naming the call, its file and line and the library's
// reason; while a kernel or the backend is being made it becomes a Status
// saying the same. Calls that fail on every machine (a nonsense copy
// direction, a null descriptor or handle, GPU 999) make these real
// failures, so the tests run with or without a GPU (label unit).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/cuda/backend_cuda_internal.h"
#include "trainer/cuda/backend_cuda_launch.h"
#include "trainer/cuda/cublas_library.h"

namespace dlbatch::trainer {
namespace {

// The death tests run in a freshly started copy of this program, so that
// the child starts CUDA itself rather than inherit the parent's.
class GpuChecks : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// What Die prints: "fatal: GPU backend: <call> failed at <file>:<line>:
// <reason>", as regular expressions.
std::string Fatal(const std::string& call, const std::string& reason = ".+") {
  return absl::StrCat("fatal: GPU backend: ", call,
                      " failed at [^ ]*gpu_checks_test\\.cc:[0-9]+: ", reason);
}

void BadCopy() {
  DLBATCH_CUDA_CHECK(
      cudaMemcpy(nullptr, nullptr, 4, static_cast<cudaMemcpyKind>(77)));
}
void BadDescriptor() {
  DLBATCH_CUDNN_CHECK(cudnnSetTensor4dDescriptor(nullptr, CUDNN_TENSOR_NHWC,
                                                 CUDNN_DATA_FLOAT, 1, 1, 1, 1));
}
// cuBLAS through the table the backend uses (loaded on first use).
const gpu::CublasLibrary& Blas() {
  static const gpu::CublasLibrary* const blas = [] {
    absl::StatusOr<const gpu::CublasLibrary*> b = gpu::LoadCublas();
    if (!b.ok()) {
      ADD_FAILURE() << b.status();
      std::abort();
    }
    return *b;
  }();
  return *blas;
}
void BadHandle() { DLBATCH_CUBLAS_CHECK(Blas().SetStream(nullptr, nullptr)); }

TEST_F(GpuChecks, AFailedCallEndsTheProcessNamingItsFileAndLine) {
  EXPECT_DEATH(BadCopy(), Fatal("cudaMemcpy\\(nullptr, nullptr, 4, "
                                "static_cast<cudaMemcpyKind>\\(77\\)\\)"));
  EXPECT_DEATH(BadDescriptor(),
               Fatal("cudnnSetTensor4dDescriptor\\( *nullptr, "
                     "CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 1, 1\\)",
                     "CUDNN_STATUS_BAD_PARAM"));
  EXPECT_DEATH(BadHandle(), Fatal("Blas\\(\\).SetStream\\(nullptr, nullptr\\)",
                                  "the library was not initialized"));
}

absl::Status DescriptorStatus() {
  DLBATCH_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(
      nullptr, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 1, 1));
  return absl::OkStatus();
}
absl::Status HandleStatus() {
  DLBATCH_CUBLAS_RETURN_IF_ERROR(Blas().SetStream(nullptr, nullptr));
  return absl::OkStatus();
}
absl::Status CopyStatus() {
  DLBATCH_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(nullptr, nullptr, 4, static_cast<cudaMemcpyKind>(77)));
  return absl::OkStatus();
}

// While making: a Status. cuDNN's "bad parameter" says the shape cannot
// run (InvalidArgument, which the network turns into a spec error); other
// failures are Internal.
TEST_F(GpuChecks, AFailedCallWhileMakingIsAStatusNamingItsFileAndLine) {
  const absl::Status descriptor = DescriptorStatus();
  EXPECT_EQ(descriptor.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(descriptor.message()),
              ::testing::ContainsRegex(
                  "^GPU backend: cudnnSetTensor4dDescriptor\\(.*\\) failed at "
                  "[^ ]*gpu_checks_test\\.cc:[0-9]+: CUDNN_STATUS_BAD_PARAM"))
      << descriptor;

  const absl::Status handle = HandleStatus();
  EXPECT_EQ(handle.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(handle.message()),
              ::testing::ContainsRegex(
                  "Blas\\(\\).SetStream\\(nullptr, nullptr\\) failed at "
                  "[^ ]*gpu_checks_test\\.cc:[0-9]+: "
                  "the library was not initialized"))
      << handle;

  const absl::Status copy = CopyStatus();
  EXPECT_EQ(copy.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(copy.message()),
              ::testing::ContainsRegex("cudaMemcpy\\(.*\\) failed at "
                                       "[^ ]*gpu_checks_test\\.cc:[0-9]+: .+"))
      << copy;
}

// cuDNN describes at most 2^31 - 1 elements in a tensor: a batch beyond
// that is refused before the call, saying what to change (cuDNN's own
// answer would be NOT_SUPPORTED). A batch within it is described.
TEST_F(GpuChecks, ABatchBeyondWhatCudnnDescribesSaysUseASmallerMiniBatch) {
  gpu::TensorDescriptor desc;
  const absl::Status big = gpu::SetNhwc(desc, 60000, Shape{28, 28, 1024});
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_EQ(big.message(),
            "a batch of 60000 [28, 28, 1024] activations is 48168960000 "
            "floats, more than the 2147483647 cuDNN takes in one tensor; use "
            "a smaller mini_batch_size");
  // 2^31 elements, one more than cuDNN takes.
  EXPECT_EQ(gpu::SetNhwc(desc, 1 << 21, Shape{32, 32, 1}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(gpu::SetNhwc(desc, 60000, Shape{28, 28, 1}).ok());
}

// While a step is recorded (gpu::CaptureErrors open on the thread), a
// failed call is kept and the caller goes on: the recording fails with the
// first such error, the trainer does not end. Once the scope closes, a
// failure ends the process again.
TEST_F(GpuChecks, WhileRecordingAFailedCallIsKeptNotFatal) {
  {
    gpu::CaptureErrors errors;
    EXPECT_TRUE(errors.status().ok());
    BadDescriptor();
    BadCopy();  // a second failure: the first is the one kept
    BadHandle();
    const absl::Status kept = errors.status();
    EXPECT_EQ(kept.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(kept.message()),
                ::testing::ContainsRegex(
                    "^GPU backend: cudnnSetTensor4dDescriptor\\(.*\\) failed "
                    "at [^ ]*gpu_checks_test\\.cc:[0-9]+: "
                    "CUDNN_STATUS_BAD_PARAM$"))
        << kept;
    {
      // Nested: the inner scope keeps its own, the outer keeps its first.
      gpu::CaptureErrors inner;
      BadCopy();
      EXPECT_THAT(std::string(inner.status().message()),
                  ::testing::HasSubstr("cudaMemcpy("));
    }
    EXPECT_EQ(errors.status(), kept);
  }
  EXPECT_DEATH(BadCopy(), Fatal("cudaMemcpy\\(.*\\)"));
  {
    // Closed out of turn: the outer first, then the inner; none is left.
    auto outer = std::make_unique<gpu::CaptureErrors>();
    auto inner = std::make_unique<gpu::CaptureErrors>();
    outer.reset();
    BadCopy();
    EXPECT_FALSE(inner->status().ok());
    inner.reset();
  }
  EXPECT_DEATH(BadCopy(), Fatal("cudaMemcpy\\(.*\\)"));
}

// cuBLAS is loaded on demand (cublas_library.h): once, every function the
// backend calls is there, and its words for a status are cuBLAS's.
TEST_F(GpuChecks, CublasLoadsOnDemandWithEveryFunctionTheBackendCalls) {
  absl::StatusOr<const gpu::CublasLibrary*> blas = gpu::LoadCublas();
  ASSERT_TRUE(blas.ok()) << blas.status();
  const gpu::CublasLibrary& b = **blas;
  for (const void* fn : {reinterpret_cast<const void*>(b.Create),
                         reinterpret_cast<const void*>(b.Destroy),
                         reinterpret_cast<const void*>(b.SetStream),
                         reinterpret_cast<const void*>(b.SetMathMode),
                         reinterpret_cast<const void*>(b.SetWorkspace),
                         reinterpret_cast<const void*>(b.Sgemm),
                         reinterpret_cast<const void*>(b.SgemmStridedBatched),
                         reinterpret_cast<const void*>(b.Sgemv),
                         reinterpret_cast<const void*>(b.GetStatusString)}) {
    EXPECT_NE(fn, nullptr);
  }
  EXPECT_EQ(*gpu::LoadCublas(), &b);  // loaded once
  EXPECT_EQ(b.SetMathMode(nullptr, CUBLAS_DEFAULT_MATH),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_STREQ(gpu::CublasStatusString(CUBLAS_STATUS_NOT_INITIALIZED),
               "the library was not initialized");
}

// A GPU that is not there (there is no GPU 999 on any machine, and none at
// all on some) is refused before any call, saying how many there are and
// what to write instead.
TEST_F(GpuChecks, ABackendOnAGpuThatIsNotThereSaysWhatToChange) {
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(999, {});
  ASSERT_FALSE(gpu.ok());
  EXPECT_THAT(std::string(gpu.status().message()),
              ::testing::ContainsRegex("^GPU 999: this machine has [0-9]+ "
                                       "visible CUDA device.*; use "
                                       ".*execution_environment: cpu"))
      << gpu.status();
}

// Without a device every launch fails, and the launcher ends the process
// naming the kernel. (On a GPU the same launch succeeds.)
TEST_F(GpuChecks, ALaunchThatFailsEndsTheProcessNamingTheKernel) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    GTEST_SKIP() << "a CUDA device is visible, so the launch would succeed";
  }
  cudaGetLastError();
  EXPECT_DEATH(gpu::LaunchFill(nullptr, nullptr, 1, 0),
               "fatal: GPU backend: launch of [A-Za-z]+ failed at "
               "[^ ]*backend_cuda_kernels\\.cu:[0-9]+: .+");
}

}  // namespace
}  // namespace dlbatch::trainer
