// A CPU run's mini-batch split over its threads, each a rank.
#include "trainer/thread_ranks.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/comm/thread_group.h"

namespace dlbatch::trainer {

int SplitBatchRanks(int mini_batch, int threads, std::optional<bool> forced) {
  if (forced == false || threads < 2 || mini_batch < 2) return 1;
  const int per_rank = forced == true ? 1 : kMinSamplesPerSplitRank;
  for (int ranks = std::min(threads, mini_batch / per_rank); ranks >= 2;
       --ranks) {
    if (threads % ranks == 0) return ranks;
  }
  return 1;
}

absl::StatusOr<std::optional<bool>> SplitBatchSwitch() {
  return EnvironmentSwitch(
      "DLBATCH_SPLIT_BATCH",
      "split every mini-batch over the threads, a sample each at least",
      "one replica of the network over all the threads");
}

absl::StatusOr<TrainResult> TrainOnThreadRanks(const TrainRequest& request,
                                               int ranks) {
  if (ranks < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a split over %d ranks; need at least 2", ranks));
  }
  const int threads = std::max(1, request.threads / ranks);
  SeparateCpuBackends();
  if (request.diary != nullptr) {
    std::fprintf(request.diary,
                 "Each mini-batch is split over %d threads, each training a "
                 "replica of the network on its share "
                 "(DLBATCH_SPLIT_BATCH=0: one replica over %d threads).\n",
                 ranks, request.threads);
    std::fflush(request.diary);
  }
  // Read once, with every thread, and shared.
  ASSIGN_OR_RETURN(const TrainingData data,
                   LoadTrainingData(request, [&](const std::string& line) {
                     if (request.diary == nullptr) return;
                     std::fprintf(request.diary, "%s\n", line.c_str());
                     std::fflush(request.diary);
                   }));
  // A rank that stopped coming is reported after far longer than the
  // slowest collective of a healthy run takes (its ranks wait there for a
  // whole evaluation or checkpoint of another).
  ThreadGroup group(ranks, absl::Minutes(10));
  std::vector<TrainRequest> requests(ranks, request);
  for (int r = 0; r < ranks; ++r) {
    TrainRequest& req = requests[r];
    req.data = &data;
    req.communicator = group.communicator(r);
    req.rendezvous = group.rendezvous();
    req.threads = threads;
    if (r > 0) {
      req.diary = nullptr;
      req.progress = nullptr;
    }
  }
  std::vector<std::optional<absl::StatusOr<TrainResult>>> results(ranks);
  const auto run = [&](int r) {
    results[r] = Train(requests[r]);
    if (!results[r]->ok()) group.Abort(results[r]->status());
  };
  std::vector<std::thread> others;
  for (int r = 1; r < ranks; ++r) others.emplace_back(run, r);
  run(0);
  for (std::thread& t : others) t.join();
  // The error that ended the group, not a rank's report of its end.
  const absl::Status cause = group.aborted();
  if (!cause.ok()) return cause;
  return *std::move(results[0]);
}

}  // namespace dlbatch::trainer
