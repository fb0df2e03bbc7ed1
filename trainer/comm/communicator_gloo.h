// Gloo internals the tests and the allreduce benchmark reach past the
// public contract in communicator.h for: the choice of allreduce algorithm.
//
// Behaviour of every Gloo communicator worth knowing beside that contract:
// - After a collective fails (dead or silent peer) the communicator is
//   spent: later collectives return FailedPrecondition with the first error.
//   Argument errors (bad count, root) leave it usable.
// - Destroying it closes its connections; a peer still finishing the last
//   collective may then fail. Ranks that end normally pass a Barrier() first.
// - Gloo writes to sockets without MSG_NOSIGNAL, so making one sets SIGPIPE
//   to SIG_IGN process-wide (unless the program has its own handler):
//   a dead peer must fail a collective, not kill this rank.
// - StartAllreduceSum runs the allreduces on one thread of the
//   communicator, in order; a blocking collective first waits for them.
//   So CPU ranks overlap gradient buckets with backward too.
// - Its rendezvous keys live under "gloo/<n>/", n counting the communicators
//   this rank made over that store; a fresh folder per job attempt is best.
#ifndef DLBATCH_TRAINER_COMM_COMMUNICATOR_GLOO_H_
#define DLBATCH_TRAINER_COMM_COMMUNICATOR_GLOO_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

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

// What MakeGlooCommunicator uses: the fastest bit-identical one for LeNet's
// 431,080 floats on loopback with 2-4 ranks (bench/allreduce_bench.cc; tied
// with kUnifiedBcube at 4 ranks, ahead at 2 and 3; the ring family needs
// 2(n-1) steps to its log2(n) and was ~1.6x slower at 4).
inline constexpr GlooAllreduce kDefaultGlooAllreduce =
    GlooAllreduce::kHalvingDoubling;

const char* GlooAllreduceName(GlooAllreduce algorithm);

// MakeGlooCommunicator with the allreduce algorithm chosen. The classic
// ones (kRing, kRingChunked, kHalvingDoubling) copy through a buffer of
// their own and take at most INT_MAX floats; a larger allreduce goes
// through kUnifiedRing instead (the same on every rank, as the count is).
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicatorWith(
    GlooAllreduce algorithm, Rendezvous* rendezvous, int rank, int size,
    const std::string& host, absl::Duration timeout);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMM_COMMUNICATOR_GLOO_H_
