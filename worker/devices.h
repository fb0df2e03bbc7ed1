// What a worker offers its profile: the GPUs the CUDA runtime finds, or CPU
// slots on a machine without them.
#ifndef DLBATCH_WORKER_DEVICES_H_
#define DLBATCH_WORKER_DEVICES_H_

#include <string>
#include <vector>

#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::worker {

// GPUs through the CUDA runtime; empty in a CPU-only build, without a
// driver, or without devices. `note` says why none were found.
std::vector<v1::Device> DiscoverGpus(std::string* note);
std::vector<v1::Device> CpuSlots(int count);
// The processors this process may run on.
int UsableCores();

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_DEVICES_H_
