// Collectives between ranks on GPUs over NCCL (communicator_nccl.h): the
// trainer's only multi-GPU code. Without DLBATCH_HAVE_NCCL it compiles to
// the argument checks and a MakeNcclCommunicator that says why there is none.
//
// The NCCL communicator is made non-blocking (ncclConfig_t::blocking = 0):
// its calls return ncclInProgress instead of waiting, and this file polls
// ncclCommGetAsyncError and the stream against a deadline, so no wait
// outlasts the timeout. On a failure or a timeout the communicator is
// aborted (ncclCommAbort), which also stops its kernels on the device.
#include "trainer/comm/communicator_nccl.h"

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

#ifdef DLBATCH_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "common/status.h"
#endif

namespace dlbatch::trainer {
namespace {

absl::Status CheckArguments(const Rendezvous* rendezvous, int rank, int size,
                            int device, absl::Duration timeout) {
  if (rendezvous == nullptr) {
    return absl::InvalidArgumentError(
        "MakeNcclCommunicator needs a rendezvous");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", rank, " is not in [0, ", size, ")"));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL rank ", rank, ": CUDA device ", device, " is negative"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "MakeNcclCommunicator needs a positive timeout");
  }
  return absl::OkStatus();
}

#ifdef DLBATCH_HAVE_NCCL

constexpr char kUniqueIdKey[] = "nccl_unique_id";

absl::StatusCode CodeOf(ncclResult_t result) {
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;  // the network or a peer
    case ncclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NcclError(ncclResult_t result, const char* what, const char* file,
                       int line) {
  // ncclGetLastError's argument is unused (NCCL's documentation).
  const char* detail = ncclGetLastError(nullptr);
  return absl::Status(CodeOf(result),
                      absl::StrCat("NCCL: ", what, " failed at ", file, ":",
                                   line, ": ", ncclGetErrorString(result),
                                   detail != nullptr && *detail != '\0'
                                       ? absl::StrCat(" (", detail, ")")
                                       : std::string()));
}

absl::Status CudaError(cudaError_t error, const char* what, const char* file,
                       int line) {
  return absl::InternalError(absl::StrCat("NCCL communicator: ", what,
                                          " failed at ", file, ":", line, ": ",
                                          cudaGetErrorString(error)));
}

#define DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(expr)                             \
  do {                                                                      \
    const cudaError_t dlbatch_nccl_cuda_error = (expr);                     \
    if (dlbatch_nccl_cuda_error != cudaSuccess) {                           \
      return CudaError(dlbatch_nccl_cuda_error, #expr, __FILE__, __LINE__); \
    }                                                                       \
  } while (false)

// A call on the communicator: waits, up to `deadline`, for it to settle.
#define DLBATCH_NCCL_RETURN_IF_ERROR(expr, deadline) \
  RETURN_IF_ERROR(Settle((expr), #expr, __FILE__, __LINE__, (deadline)))

// A call not on a communicator (it blocks, as such calls do).
#define DLBATCH_NCCL_PLAIN_RETURN_IF_ERROR(expr)                        \
  do {                                                                  \
    const ncclResult_t dlbatch_nccl_result = (expr);                    \
    if (dlbatch_nccl_result != ncclSuccess) {                           \
      return NcclError(dlbatch_nccl_result, #expr, __FILE__, __LINE__); \
    }                                                                   \
  } while (false)

// Polls spin briefly (a collective's result is wanted at once), then sleep
// (a rank that comes late must not cost a core for minutes).
void Pause(int* polls) {
  if (++*polls < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, absl::Duration timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {}

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      // Flush and leave together (ranks pass a Barrier() first, so this
      // settles at once); a finalize that does not is aborted instead.
      const absl::Status finalized = [&]() -> absl::Status {
        DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
        DLBATCH_NCCL_RETURN_IF_ERROR(ncclCommFinalize(comm_),
                                     absl::Now() + timeout_);
        const ncclResult_t destroyed = ncclCommDestroy(comm_);
        comm_ = nullptr;
        if (destroyed != ncclSuccess && destroyed != ncclInProgress) {
          return NcclError(destroyed, "ncclCommDestroy(comm_)", __FILE__,
                           __LINE__);
        }
        return absl::OkStatus();
      }();
      if (!finalized.ok()) {
        std::fprintf(stderr, "dlbatch-train: rank %d: %s\n", rank_,
                     std::string(finalized.message()).c_str());
        Abort();
      }
    }
    // Nothing can be returned from here: failures are reported, not hidden.
    if (scratch_ != nullptr) Report(cudaFree(scratch_), "cudaFree");
    if (computed_ != nullptr)
      Report(cudaEventDestroy(computed_), "cudaEventDestroy");
    if (reduced_ != nullptr)
      Report(cudaEventDestroy(reduced_), "cudaEventDestroy");
    if (stream_ != nullptr)
      Report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }

  // Joins the other ranks of `id`. A failure aborts what was made.
  absl::Status Init(const ncclUniqueId& id) {
    absl::Status status = [&]() -> absl::Status {
      const absl::Time deadline = absl::Now() + timeout_;
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
          cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
          cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)));
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaMemset(scratch_, 0, sizeof(float)));
      // Ordering only: no timing, so recording them costs next to nothing.
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      DLBATCH_NCCL_RETURN_IF_ERROR(
          ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), deadline);
      return absl::OkStatus();
    }();
    if (!status.ok()) return Fail(std::move(status));
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllreduceSum(float* data, int64_t count) override {
    RETURN_IF_ERROR(CheckBuffer("AllreduceSum", data, count));
    if (count == 0) return absl::OkStatus();
    return Collective(
        absl::StrCat("ncclAllReduce of ", count, " floats"),
        [&](absl::Time deadline) -> absl::Status {
          DLBATCH_NCCL_RETURN_IF_ERROR(
              ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32,
                            ncclSum, comm_, stream_),
              deadline);
          return absl::OkStatus();
        });
  }

  absl::Status StartAllreduceSum(float* data, int64_t count) override {
    RETURN_IF_ERROR(CheckBuffer("StartAllreduceSum", data, count));
    if (count == 0) return absl::OkStatus();
    absl::Status status = [&]() -> absl::Status {
      const absl::Time deadline = absl::Now() + timeout_;
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      RETURN_IF_ERROR(AfterComputeStream());
      // Returns once enqueued (Settle waits out ncclInProgress, which a
      // non-blocking communicator returns while it is still enqueueing).
      DLBATCH_NCCL_RETURN_IF_ERROR(
          ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32,
                        ncclSum, comm_, stream_),
          deadline);
      ++started_;
      return absl::OkStatus();
    }();
    if (!status.ok()) return Fail(std::move(status));
    return absl::OkStatus();
  }

  absl::Status WaitAll() override {
    RETURN_IF_ERROR(Usable());
    if (started_ == 0) return absl::OkStatus();
    started_ = 0;
    absl::Status status = [&]() -> absl::Status {
      const absl::Time deadline = absl::Now() + timeout_;
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      // What NCCL has noticed so far (a peer's closed connection); a later
      // failure is for the next host wait to find (see the header).
      ncclResult_t state = ncclSuccess;
      DLBATCH_NCCL_PLAIN_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError(state, "the started allreduces", __FILE__, __LINE__);
      }
      if (compute_stream_ == nullptr) {
        return WaitForStream("the started allreduces", deadline);
      }
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaEventRecord(reduced_, stream_));
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(compute_stream_, reduced_, 0));
      return absl::OkStatus();
    }();
    if (!status.ok()) return Fail(std::move(status));
    return absl::OkStatus();
  }

  void SetComputeStream(void* stream) override {
    compute_stream_ = static_cast<cudaStream_t>(stream);
  }

  absl::Status WaitOnDevice(const std::function<bool()>& done,
                            const std::string& what) override {
    RETURN_IF_ERROR(Usable());
    if (done()) return absl::OkStatus();  // as in a healthy step
    absl::Status status = [&]() -> absl::Status {
      const absl::Time deadline = absl::Now() + timeout_;
      for (int polls = 0; !done(); Pause(&polls)) {
        ncclResult_t state = ncclSuccess;
        DLBATCH_NCCL_PLAIN_RETURN_IF_ERROR(
            ncclCommGetAsyncError(comm_, &state));
        if (state != ncclSuccess && state != ncclInProgress) {
          return NcclError(state, what.c_str(), __FILE__, __LINE__);
        }
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "NCCL: ", what, " did not finish within ",
              absl::FormatDuration(timeout_), " on rank ", rank_, " of ", size_,
              ": the device waits for an allreduce that a peer never joined "
              "(it died or stopped calling collectives); see its errors"));
        }
      }
      return absl::OkStatus();
    }();
    if (!status.ok()) return Fail(std::move(status));
    return absl::OkStatus();
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override {
    RETURN_IF_ERROR(CheckBuffer("Broadcast", data, count));
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Broadcast: root ", root, " is not in [0, ", size_, ")"));
    }
    if (count == 0) return absl::OkStatus();
    return Collective(
        absl::StrCat("ncclBroadcast of ", count, " floats from rank ", root),
        [&](absl::Time deadline) -> absl::Status {
          DLBATCH_NCCL_RETURN_IF_ERROR(
              ncclBroadcast(data, data, static_cast<size_t>(count), ncclFloat32,
                            root, comm_, stream_),
              deadline);
          return absl::OkStatus();
        });
  }

  // NCCL has no barrier: an allreduce of one float every rank must join.
  absl::Status Barrier() override {
    RETURN_IF_ERROR(Usable());
    return Collective("Barrier (ncclAllReduce of 1 float)",
                      [&](absl::Time deadline) -> absl::Status {
                        DLBATCH_NCCL_RETURN_IF_ERROR(
                            ncclAllReduce(scratch_, scratch_, 1, ncclFloat32,
                                          ncclSum, comm_, stream_),
                            deadline);
                        return absl::OkStatus();
                      });
  }

 private:
  absl::Status CheckBuffer(const char* op, const float* data,
                           int64_t count) const {
    if (count < 0 || (count > 0 && data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", count, " floats at ",
                       data == nullptr ? "null" : "a pointer",
                       "; the count must be >= 0 and the data device memory"));
    }
    return Usable();
  }

  // FailedPrecondition with the first error once one collective failed.
  absl::Status Usable() const {
    if (first_error_.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL communicator of rank ", rank_,
        " was aborted after an earlier error: ", first_error_.message()));
  }

  // Orders what is enqueued on stream_ next after the work issued so far
  // to the compute stream: on the device, with an event, where the stream
  // is known; otherwise by waiting for the whole device (the backend's
  // stream included, which this module then cannot see).
  // REQUIRES: cudaSetDevice(device_).
  absl::Status AfterComputeStream() {
    if (compute_stream_ == nullptr) {
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      return absl::OkStatus();
    }
    DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(computed_, compute_stream_));
    DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream_, computed_, 0));
    return absl::OkStatus();
  }

  // Orders the collective after the caller's work, enqueues it and waits
  // for it (and for any started allreduce before it on stream_) to finish,
  // all within the timeout. Any failure aborts the communicator: the ranks
  // are out of step from then on.
  template <typename Enqueue>
  absl::Status Collective(const std::string& what, Enqueue enqueue) {
    absl::Status status = [&]() -> absl::Status {
      const absl::Time deadline = absl::Now() + timeout_;
      DLBATCH_NCCL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      RETURN_IF_ERROR(AfterComputeStream());
      RETURN_IF_ERROR(enqueue(deadline));
      return WaitForStream(what, deadline);
    }();
    if (!status.ok()) return Fail(std::move(status));
    return absl::OkStatus();
  }

  // `result` of the NCCL call `what` on comm_, once it is no longer in
  // progress (a non-blocking communicator's calls may return before they
  // are done).
  absl::Status Settle(ncclResult_t result, const char* what, const char* file,
                      int line, absl::Time deadline) {
    for (int polls = 0; result == ncclInProgress;) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "NCCL: ", what, " at ", file, ":", line, " did not finish within ",
            absl::FormatDuration(timeout_), " on rank ", rank_, " of ", size_,
            ": a rank did not come or stopped; see the other ranks' errors"));
      }
      Pause(&polls);
      ncclResult_t state = ncclSuccess;
      DLBATCH_NCCL_PLAIN_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
      result = state;
    }
    if (result != ncclSuccess) return NcclError(result, what, file, line);
    return absl::OkStatus();
  }

  absl::Status WaitForStream(const std::string& what, absl::Time deadline) {
    for (int polls = 0;; Pause(&polls)) {
      const cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) {
        return CudaError(done, "cudaStreamQuery", __FILE__, __LINE__);
      }
      ncclResult_t state = ncclSuccess;
      DLBATCH_NCCL_PLAIN_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError(state, what.c_str(), __FILE__, __LINE__);
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "NCCL: ", what, " did not finish within ",
            absl::FormatDuration(timeout_), " on rank ", rank_, " of ", size_,
            ": a peer died or stopped calling collectives; see its errors"));
      }
    }
  }

  absl::Status Fail(absl::Status status) {
    if (first_error_.ok()) first_error_ = status;
    Abort();
    return status;
  }

  void Abort() {
    if (comm_ == nullptr) return;
    const ncclResult_t aborted = ncclCommAbort(comm_);
    comm_ = nullptr;
    if (aborted != ncclSuccess && aborted != ncclInProgress) {
      std::fprintf(stderr, "dlbatch-train: rank %d: ncclCommAbort: %s\n", rank_,
                   ncclGetErrorString(aborted));
    }
  }

  void Report(cudaError_t error, const char* what) const {
    if (error != cudaSuccess) {
      std::fprintf(stderr, "dlbatch-train: rank %d: %s: %s\n", rank_, what,
                   cudaGetErrorString(error));
    }
  }

  const int rank_;
  const int size_;
  const int device_;
  const absl::Duration timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // every collective runs here
  float* scratch_ = nullptr;       // Barrier's one float, on the device
  // The caller's stream (SetComputeStream); null: order by device syncs.
  cudaStream_t compute_stream_ = nullptr;
  cudaEvent_t computed_ = nullptr;  // on compute_stream_, before a collective
  cudaEvent_t reduced_ = nullptr;   // on stream_, after started allreduces
  int started_ = 0;                 // since the last WaitAll
  absl::Status first_error_;
};

// Rank 0 makes the id and publishes it; the others wait for it. The id is
// stored as hex: a store may carry text only (the scheduler's does).
absl::StatusOr<ncclUniqueId> ShareUniqueId(Rendezvous* rendezvous, int rank,
                                           absl::Duration timeout) {
  ncclUniqueId id;
  if (rank == 0) {
    DLBATCH_NCCL_PLAIN_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    RETURN_IF_ERROR(
        rendezvous->Set(kUniqueIdKey, absl::BytesToHexString(absl::string_view(
                                          id.internal, sizeof(id.internal)))));
    return id;
  }
  ASSIGN_OR_RETURN(const std::string hex,
                   rendezvous->Get(kUniqueIdKey, timeout));
  const std::string bytes = absl::HexStringToBytes(hex);
  if (bytes.size() != sizeof(id.internal) ||
      absl::BytesToHexString(bytes) != absl::AsciiStrToLower(hex)) {
    return absl::DataLossError(
        absl::StrCat("rendezvous key ", kUniqueIdKey, " holds ", hex.size(),
                     " characters, not the ", 2 * sizeof(id.internal),
                     " hex digits of an ncclUniqueId; was it written by this "
                     "dlbatch-train?"));
  }
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

#endif  // DLBATCH_HAVE_NCCL

}  // namespace

#ifdef DLBATCH_HAVE_NCCL

bool NcclBuilt() { return true; }

std::string NcclLibraryVersion() {
  // NCCL numbers its versions 10000 * major + 100 * minor + patch.
  int v = 0;
  const std::string loaded =
      ncclGetVersion(&v) == ncclSuccess
          ? absl::StrCat(v / 10000, ".", v % 10000 / 100, ".", v % 100)
          : std::string("?");
  return absl::StrCat(loaded, " (built with ", NCCL_MAJOR, ".", NCCL_MINOR, ".",
                      NCCL_PATCH, ")");
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    Rendezvous* rendezvous, int rank, int size, int device,
    absl::Duration timeout) {
  RETURN_IF_ERROR(CheckArguments(rendezvous, rank, size, device, timeout));
  int visible = 0;
  const cudaError_t counted = cudaGetDeviceCount(&visible);
  if (counted != cudaSuccess) {
    cudaGetLastError();  // a missing driver is an answer here, not an error
    visible = 0;
  }
  if (device >= visible) {
    return absl::UnavailableError(absl::StrCat(
        "NCCL rank ", rank, ": CUDA device ", device, " is not visible (",
        visible, " visible",
        counted != cudaSuccess ? absl::StrCat(": ", cudaGetErrorString(counted))
                               : std::string(),
        "); ranks on GPUs need a device each: use fewer ranks per machine, or "
        "execution_environment: cpu"));
  }
  ASSIGN_OR_RETURN(const ncclUniqueId id,
                   ShareUniqueId(rendezvous, rank, timeout));
  auto comm = std::make_unique<NcclCommunicator>(rank, size, device, timeout);
  RETURN_IF_ERROR(comm->Init(id));
  return comm;
}

#else  // !DLBATCH_HAVE_NCCL

bool NcclBuilt() { return false; }

std::string NcclLibraryVersion() { return "not built"; }

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    Rendezvous* rendezvous, int rank, int size, int device,
    absl::Duration timeout) {
  if (absl::Status s = CheckArguments(rendezvous, rank, size, device, timeout);
      !s.ok()) {
    return s;
  }
  return absl::UnavailableError(absl::StrCat(
      "NCCL rank ", rank,
      ": this dlbatch-train was built without NCCL (CMake "
      "found no nccl.h and libnccl beside CUDA), so ranks cannot train on GPUs "
      "together; use execution_environment: cpu, a pool of 1, or rebuild where "
      "NCCL is installed"));
}

#endif  // DLBATCH_HAVE_NCCL

}  // namespace dlbatch::trainer
