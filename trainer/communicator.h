// How a trainer's ranks find each other and average their gradients.
//
// A Rendezvous is a small key-value store all ranks of a job can reach, as
// torchrun's store: a folder for ranks on one machine, or the one a dlbatch
// scheduler serves for a job's attempt. A Communicator runs collectives over
// it: Gloo over TCP between CPU replicas, NCCL between GPUs
// (communicator_nccl.h), on device buffers there.
//
// Thread safety: one thread per object.
#ifndef DLBATCH_TRAINER_COMMUNICATOR_H_
#define DLBATCH_TRAINER_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dlbatch::trainer {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
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
  // In place over `count` floats of the backend's memory (host memory on
  // the CPU). Every rank calls each collective in the same order.
  virtual absl::Status AllreduceSum(float* data, int64_t count) = 0;
  virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;
  virtual absl::Status Barrier() = 0;
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

#endif  // DLBATCH_TRAINER_COMMUNICATOR_H_
