// Gradient allreduce in buckets that overlaps the rest of backward, as
// data-parallel trainers do (DDP's buckets, Horovod's fusion buffer).
//
// Backward tells which ranges of the gradient buffer are final
// (Network::GradsReady), last layer first. GradientBuckets keeps the final
// ranges not yet sent as maximal contiguous runs; once a run holds a
// bucket's worth of floats it starts an allreduce of that run
// (Communicator::StartAllreduceSum), while earlier layers still compute.
// Finish() starts what is left, waits (Communicator::WaitAll: an event on a
// GPU, not a host sync) and readies the object for the next step.
//
// Buckets are slices of the gradient buffer itself: nothing is copied, so
// a run is contiguous by construction. The buffer keeps every weight before
// every bias (network.h), so backward finishes two runs at once, one down
// from the end of the weights and one down from the end of the buffer; the
// weights' run fills buckets as layers finish, the small biases' run
// usually goes at Finish.
//
// Every rank sees the same ranges in the same order (the same network), so
// every rank starts the same allreduces in the same order, as the
// communicator requires. Every element is summed exactly once per step:
// Finish also sends any element that was never reported.
//
// Thread safety: one thread, as the Network and Communicator it serves.
#ifndef DLBATCH_TRAINER_COMM_GRAD_BUCKETS_H_
#define DLBATCH_TRAINER_COMM_GRAD_BUCKETS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {

// Bucket sizes. On GPUs, NCCL reaches most of its bandwidth at a few MiB
// and each launch costs microseconds; on CPUs, Gloo's TCP allreduce of
// 1 MiB takes about a millisecond against tens of microseconds of latency,
// and a smaller bucket starts sooner while the (longer) CPU backward runs.
inline constexpr int64_t kGpuBucketBytes = int64_t{4} << 20;
inline constexpr int64_t kCpuBucketBytes = int64_t{1} << 20;

// The bucket size, in floats, for a backend on a GPU or not.
int64_t DefaultBucketFloats(bool on_gpu);

class GradientBuckets {
 public:
  // Over `count` floats at `grads` (the network's gradient buffer, in the
  // communicator's memory). `comm` is not owned and must outlive this.
  // `bucket_floats` below 1 counts as 1.
  GradientBuckets(Communicator* comm, float* grads, int64_t count,
                  int64_t bucket_floats);
  // Waits for allreduces still in flight (a step left early by an error),
  // so that none of them outlives the buffer they write.
  ~GradientBuckets();

  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // [first, first + count) of the buffer is final for this step. A range
  // outside the buffer, or one reported before in this step, is a bug in
  // the caller: Finish returns Internal (and still sums every element once).
  void Ready(int64_t first, int64_t count);

  // Ready as a Network::GradsReady, for Network::Backward. Valid while
  // this object is.
  std::function<void(int64_t, int64_t)> ReadyFn() {
    return [this](int64_t first, int64_t count) { Ready(first, count); };
  }

  // Starts the runs left (and any element never reported), then
  // WaitAll(). Returns the first error of the step: a failed start or
  // wait, or a bad Ready. After the communicator failed, nothing more was
  // started (it is spent). Afterwards the next step may begin.
  absl::Status Finish();

  // The allreduces started in this step (or the last finished one),
  // (first, count) in order: for tests and logs.
  const std::vector<std::pair<int64_t, int64_t>>& started() const {
    return started_;
  }

 private:
  void NewStepIfFinished();
  void Start(int64_t first, int64_t count);
  void Fail(absl::Status status);

  Communicator* const comm_;
  float* const grads_;
  const int64_t count_;
  const int64_t bucket_floats_;
  // Final ranges not yet started, merged: first -> end.
  std::map<int64_t, int64_t> pending_;
  // Everything reported this step, merged: first -> end (to refuse a range
  // reported twice).
  std::map<int64_t, int64_t> reported_;
  std::vector<std::pair<int64_t, int64_t>> started_;
  bool waiting_ = false;      // allreduces started since the last WaitAll
  bool comm_failed_ = false;  // a start failed this step
  bool finished_ = false;     // Finish ran; the next call opens a step
  absl::Status status_;       // the step's first error
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMM_GRAD_BUCKETS_H_
