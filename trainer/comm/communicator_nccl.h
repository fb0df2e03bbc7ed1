// Collectives between ranks on GPUs over NCCL, behind communicator.h's
// Communicator. The whole module is communicator_nccl.cc; a build without
// NCCL (or without the GPU backend) compiles it to a stub whose
// MakeNcclCommunicator returns UNAVAILABLE, so callers need no #if.
//
// Contract beyond communicator.h:
// - `data` is device memory on `device` (the CUDA backend's buffers).
// - Ordering: collectives run on a stream of the communicator's own. Given
//   the backend's stream (SetComputeStream), each one first waits, on the
//   device, for an event recorded there, so that it reads what the caller
//   issued before it; without one it waits for the whole device. Blocking
//   collectives (AllreduceSum, Broadcast, Barrier) then wait on the host
//   until they finish: the result is ready for whatever the caller issues
//   next, on any stream.
// - StartAllreduceSum enqueues and returns; WaitAll records an event after
//   the started allreduces and makes the compute stream wait for it, with
//   no host wait (without a compute stream it waits on the host instead).
//   A peer that dies during them is noticed by the next call that waits on
//   the host, within the timeout: any blocking collective, or WaitOnDevice
//   (the training loop waits there for the upload of a batch slot, which
//   follows the compute stream and so the allreduces); the abort that
//   follows also ends the unfinished allreduces on the device, so a compute
//   stream waiting on them goes on. Work the caller syncs on by other means
//   (Backend::CopyToHost) before such a call could wait for a dead peer
//   without a bound.
// - Every wait is bounded by `timeout`: a rank that never comes, or a peer
//   that dies mid-collective, ends the call with DeadlineExceeded (or the
//   error NCCL reports) instead of a hang. After such a failure the NCCL
//   communicator is aborted and every later collective returns
//   FailedPrecondition with the first error. Argument errors (negative
//   count, bad root) leave it usable.
// - Ranks that end normally pass a Barrier() before destroying it.
// - Rendezvous key: "nccl_unique_id" (rank 0's ncclUniqueId, hex), one
//   NCCL communicator per store.
//
// Thread safety: one thread per object.
#ifndef DLBATCH_TRAINER_COMM_COMMUNICATOR_NCCL_H_
#define DLBATCH_TRAINER_COMM_COMMUNICATOR_NCCL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {

// Rank `rank` of `size` on CUDA device `device` (an index among the visible
// ones). Rank 0 publishes NCCL's unique id in `rendezvous` (not owned; used
// only during the call); the others wait for it up to `timeout`.
// InvalidArgument for bad arguments; UNAVAILABLE where this build has no
// NCCL or the device is not visible; DeadlineExceeded where the ranks do not
// all come within `timeout`.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    Rendezvous* rendezvous, int rank, int size, int device,
    absl::Duration timeout);

// Whether this build has the NCCL communicator (CMake found NCCL beside the
// GPU backend).
bool NcclBuilt();

// The NCCL loaded and the one built against, "2.27.7 (built with 2.27.7)";
// "not built" without NCCL.
std::string NcclLibraryVersion();

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMM_COMMUNICATOR_NCCL_H_
