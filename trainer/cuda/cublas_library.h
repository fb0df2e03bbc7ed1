// cuBLAS, loaded when the first GPU backend is made instead of with the
// program: libcublas needs libcublasLt, whose loading alone takes about
// 0.1 s and 200 MB of memory, which a run on the CPU should not pay (and
// dlbatch-train does not need either library to start). The GPU backend
// calls cuBLAS through this table only.
#ifndef DLBATCH_TRAINER_CUDA_CUBLAS_LIBRARY_H_
#define DLBATCH_TRAINER_CUDA_CUBLAS_LIBRARY_H_

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace dlbatch::trainer::gpu {

// The functions the backend uses, as libcublas exports them (cublas_v2.h
// maps cublasCreate to cublasCreate_v2 and so on).
struct CublasLibrary {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasSgemm_v2) Sgemm;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched;
  decltype(&cublasSgemv_v2) Sgemv;
  // bf16 and fp16 products: the exported function (the header adds a C++
  // overload taking a cudaDataType compute type).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                           int, int, int, const void*, const void*,
                           cudaDataType, int, const void*, cudaDataType, int,
                           const void*, void*, cudaDataType, int,
                           cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) GetStatusString;
};

// Loads libcublas once (later calls return the same table or the same
// error). The error names the library or the function that is missing and
// what to install. Thread-safe.
absl::StatusOr<const CublasLibrary*> LoadCublas();

// cuBLAS's words for `status` where the library is loaded, else its number.
const char* CublasStatusString(cublasStatus_t status);

}  // namespace dlbatch::trainer::gpu

#endif  // DLBATCH_TRAINER_CUDA_CUBLAS_LIBRARY_H_
