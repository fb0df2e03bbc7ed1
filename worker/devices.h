// What a worker offers its profile: the GPUs the CUDA runtime finds, or CPU
// slots on a machine without them.
#ifndef DLBATCH_WORKER_DEVICES_H_
#define DLBATCH_WORKER_DEVICES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::worker {

// GPUs through the CUDA runtime; empty in a CPU-only build, without a
// driver, or without devices. `note` says why none were found, or which
// GPUs the runtime counts but could not describe (left out).
std::vector<v1::Device> DiscoverGpus(std::string* note);
std::vector<v1::Device> CpuSlots(int count);
// The CUDA_VISIBLE_DEVICES that shows a job exactly its GPUs, `indices` in
// this worker's numbering (DiscoverGpus'). A worker that was itself given
// CUDA_VISIBLE_DEVICES (`inherited`; null when unset), as a node's GPUs are
// shared out between workers, numbers only those: its GPU i is that list's
// i-th entry, whatever its form (an ordinal, GPU-<uuid>, MIG-<uuid>), not
// the machine's GPU i. An index beyond the list is an error.
absl::StatusOr<std::string> ChildVisibleDevices(
    absl::Span<const int32_t> indices, const char* inherited);
// The processors this process may run on.
int UsableCores();

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_DEVICES_H_
