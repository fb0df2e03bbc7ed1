// How a trainer's ranks find each other and average their gradients.
//
// A Rendezvous is a small key-value store all ranks of a job can reach, as
// torchrun's store: a folder for ranks on one machine, or the one a dlbatch
// scheduler serves for a job's attempt. A Communicator runs collectives over
// it: Gloo over TCP between CPU replicas, NCCL between GPUs
// (communicator_nccl.h), on device buffers there.
//
// Thread safety: one thread per object (a communicator may run collectives
// on threads of its own; its callers see none of them).
#ifndef DLBATCH_TRAINER_COMM_COMMUNICATOR_H_
#define DLBATCH_TRAINER_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dlbatch::trainer {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;
  // Waits until `key` is set; DeadlineExceeded after `timeout`, naming the
  // key (so a rank that never came is reported, not waited on forever).
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;
};

// A store in `dir` (created if missing): one file per key, written
// atomically. Every rank must see the same folder.
absl::StatusOr<std::unique_ptr<Rendezvous>> OpenFileRendezvous(
    const std::string& dir);

// The store a dlbatch scheduler serves for one attempt of a train job
// (`address` as the worker was given it, e.g. unix:/run/x.sock or
// host:port), authenticated with the attempt's rendezvous secret. Keys are
// the scheduler's per attempt; they vanish when the attempt ends.
struct SchedulerRendezvousConfig {
  std::string address;
  int64_t job_id = 0;
  int attempt = 0;
  std::string secret;
};
absl::StatusOr<std::unique_ptr<Rendezvous>> OpenSchedulerRendezvous(
    const SchedulerRendezvousConfig& config);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the ranks are threads of one process that split one rank's
  // mini-batch (trainer/thread_ranks.h): its batch norms then take their
  // statistics over all of them, so that it trains the one rank's model.
  virtual bool splits_batch() const { return false; }
  // In place over `count` floats of the backend's memory (host memory on
  // the CPU). Every rank calls each collective in the same order.
  virtual absl::Status AllreduceSum(float* data, int64_t count) = 0;
  virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Gradient buckets (grad_buckets.h): an allreduce that runs while the
  // caller goes on computing. StartAllreduceSum starts summing `count`
  // floats at `data` in place and returns; WaitAll completes every one
  // started since the last WaitAll. Every rank starts the same counts in
  // the same order. Until WaitAll returns, the caller must neither read nor
  // write a started range (on a GPU: no work it issues to the compute stream
  // before WaitAll may touch one). Collectives called in between
  // (AllreduceSum, Broadcast, Barrier) run after the started ones, in the
  // order called, on every rank alike.
  // A failure shows in the return of StartAllreduceSum or, where the
  // allreduce ran in the background, of WaitAll; either way the
  // communicator is unusable afterwards, as after a failed AllreduceSum.
  // The default runs the blocking AllreduceSum, which is correct (with
  // nothing to overlap) for any communicator.
  virtual absl::Status StartAllreduceSum(float* data, int64_t count) {
    return AllreduceSum(data, count);
  }
  // Returns when the started allreduces' results are ready for whatever the
  // caller issues next: on the CPU, done; on a GPU, ordered before the
  // compute stream's later work (SetComputeStream) without a host wait.
  virtual absl::Status WaitAll() { return absl::OkStatus(); }

  // Waits on the host until `done()` holds, for device work that may wait
  // for this communicator's started allreduces (WaitAll orders the compute
  // stream after them), so that a peer that dies cannot hold it for ever:
  // bounded like a blocking collective, by the timeout and by a failure
  // the communicator notices, either of which aborts it (ending its
  // unfinished allreduces, so the work waiting on them goes on) and is
  // returned, naming `what`. The default, for communicators whose
  // collectives no device work waits on, polls done() without a bound.
  virtual absl::Status WaitOnDevice(const std::function<bool()>& done,
                                    const std::string& what) {
    (void)what;
    while (!done()) std::this_thread::yield();
    return absl::OkStatus();
  }

  // The stream on which the caller computes the data that collectives read
  // and write (Backend::native_stream(): a cudaStream_t for the CUDA
  // backend); null for none or unknown. A GPU communicator orders its
  // collectives after the work issued there with events instead of waiting
  // for the whole device. The stream must outlive its use here: set null
  // before destroying it. Communicators over host memory ignore it.
  virtual void SetComputeStream(void* stream) { (void)stream; }
};

// One rank alone: the collectives return at once.
std::unique_ptr<Communicator> MakeSoloCommunicator();

// Gloo over TCP. Rank `rank` of `size` binds to `host` (loopback unless
// the ranks span machines) and finds the others through `rendezvous`
// within `timeout`; collectives time out after `timeout` too, so a dead
// peer ends the step with an error instead of a hang.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    Rendezvous* rendezvous, int rank, int size, const std::string& host,
    absl::Duration timeout);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMM_COMMUNICATOR_H_
