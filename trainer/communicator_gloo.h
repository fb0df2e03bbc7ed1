// Gloo internals the tests and the allreduce benchmark reach past the
// public contract in communicator.h for: the choice of allreduce algorithm.
#ifndef DLBATCH_TRAINER_COMMUNICATOR_GLOO_H_
#define DLBATCH_TRAINER_COMMUNICATOR_GLOO_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/communicator.h"

namespace dlbatch::trainer {

// Gloo's float allreduce algorithms. The ones marked "bit-identical" give
// every rank the same bits (each element is summed once, by one rank, and
// then copied); kRing adds the inputs in a different order on every rank,
// so with three or more ranks the replicas' weights would drift apart.
enum class GlooAllreduce {
  kRing,             // gloo::AllreduceRing: NOT bit-identical for size > 2
  kRingChunked,      // gloo::AllreduceRingChunked: bit-identical
  kHalvingDoubling,  // gloo::AllreduceHalvingDoubling: bit-identical
  kUnifiedRing,      // gloo::allreduce, RING: bit-identical
  kUnifiedBcube,     // gloo::allreduce, BCUBE: bit-identical
};

// What MakeGlooCommunicator uses (the fastest bit-identical one for LeNet's
// 431,080 floats on loopback with 2-4 ranks; bench/allreduce_bench.cc).
inline constexpr GlooAllreduce kDefaultGlooAllreduce =
    GlooAllreduce::kUnifiedRing;

const char* GlooAllreduceName(GlooAllreduce algorithm);

// MakeGlooCommunicator with the allreduce algorithm chosen.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicatorWith(
    GlooAllreduce algorithm, Rendezvous* rendezvous, int rank, int size,
    const std::string& host, absl::Duration timeout);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMMUNICATOR_GLOO_H_
