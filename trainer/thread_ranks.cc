// A CPU run's mini-batch split over its threads, each a rank.
#include "trainer/thread_ranks.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
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

RunLayout LayoutOf(const TrainRequest& request, int replicas, bool on_gpu,
                   bool split_batch) {
  RunLayout l;
  l.replicas = replicas;
  l.replicas_per_process = request.ranks_per_process;
  if (l.replicas_per_process.empty()) {
    l.replicas_per_process.assign(std::max(1, replicas), 1);
  }
  l.threads_per_replica = on_gpu ? 0 : std::max(0, request.threads);
  l.split_batch = split_batch;
  return l;
}

std::string DescribeLayout(const RunLayout& layout, int mini_batch) {
  const int processes = layout.processes();
  std::string s =
      absl::StrCat(processes, processes == 1 ? " process" : " processes");
  if (layout.threads_per_replica > 0) {
    int all = 0;
    bool alike = true;
    for (int p = 0; p < processes; ++p) {
      all += layout.threads_of(p);
      alike = alike && layout.threads_of(p) == layout.threads_of(0);
    }
    const int each = layout.threads_of(0);
    if (processes == 1) {
      absl::StrAppend(&s, ", ", each, each == 1 ? " thread" : " threads");
    } else if (alike) {
      absl::StrAppend(&s, ", ", each, each == 1 ? " thread" : " threads",
                      " each");
    } else {
      absl::StrAppend(&s, ", ", all, " threads in all");
    }
  }
  if (layout.replicas <= 1) {
    absl::StrAppend(&s, ", mini-batch ", mini_batch);
  } else {
    absl::StrAppend(&s, ", each mini-batch of ", mini_batch, " split over ",
                    layout.replicas, " replicas");
  }
  return s;
}

absl::StatusOr<TrainResult> TrainOnThreadRanks(const TrainRequest& request,
                                               const ThreadRanks& ranks) {
  if (ranks.count < 1 || (ranks.split_batch && ranks.count < 2)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d thread ranks; need at least %d", ranks.count,
                        ranks.split_batch ? 2 : 1));
  }
  const int threads = std::max(1, ranks.threads);
  if (ranks.count > 1) SeparateCpuBackends();
  if (request.diary != nullptr && ranks.split_batch) {
    std::fprintf(request.diary,
                 "Each mini-batch is split over %d threads, each training a "
                 "replica of the network on its share "
                 "(DLBATCH_SPLIT_BATCH=0: one replica over %d threads).\n",
                 ranks.count, ranks.count * threads);
    std::fflush(request.diary);
  }
  // Read once, with every thread, and shared.
  TrainRequest loading = request;
  loading.threads = ranks.count * threads;
  ASSIGN_OR_RETURN(const TrainingData data,
                   LoadTrainingData(loading, [&](const std::string& line) {
                     if (request.diary == nullptr) return;
                     std::fprintf(request.diary, "%s\n", line.c_str());
                     std::fflush(request.diary);
                   }));
  // A rank that stopped coming is reported after far longer than the
  // slowest collective of a healthy run takes (its ranks wait there for a
  // whole evaluation or checkpoint of another, or of another process).
  ThreadGroup group(ranks.count, absl::Minutes(10), ranks.split_batch,
                    ranks.span);
  // For the diary and metrics.json: the ranks each process trains.
  std::vector<int> per_process = {ranks.count};
  if (ranks.span.between != nullptr) {
    const std::vector<int>& first = ranks.span.first_ranks;
    per_process.clear();
    for (size_t i = 0; i < first.size(); ++i) {
      per_process.push_back(
          (i + 1 < first.size() ? first[i + 1] : ranks.span.world) - first[i]);
    }
  }
  std::vector<TrainRequest> requests(ranks.count, request);
  for (int r = 0; r < ranks.count; ++r) {
    TrainRequest& req = requests[r];
    req.data = &data;
    req.communicator = group.communicator(r);
    req.rendezvous = group.rendezvous();
    req.threads = threads;
    req.ranks_per_process = per_process;
    if (r > 0) {
      req.diary = nullptr;
      req.progress = nullptr;
    }
  }
  std::vector<std::optional<absl::StatusOr<TrainResult>>> results(ranks.count);
  const auto run = [&](int r) {
    results[r] = Train(requests[r]);
    if (!results[r]->ok()) group.Abort(results[r]->status());
  };
  std::vector<std::thread> others;
  for (int r = 1; r < ranks.count; ++r) others.emplace_back(run, r);
  run(0);
  for (std::thread& t : others) t.join();
  // The error that ended the group, not a rank's report of its end.
  const absl::Status cause = group.aborted();
  if (!cause.ok()) return cause;
  return *std::move(results[0]);
}

absl::StatusOr<std::vector<int>> MeetProcesses(Rendezvous* rendezvous,
                                               int first, int count, int world,
                                               absl::Duration timeout) {
  if (count < 1 || first < 0 || first + count > world) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks ", first, "..", first + count - 1,
                     " do not fit in a world of ", world));
  }
  constexpr char kKey[] = "processes/first-rank-";
  RETURN_IF_ERROR(
      rendezvous->Set(absl::StrCat(kKey, first), absl::StrCat(count)));
  // Walk the processes from rank 0: each one's count leads to the next.
  std::vector<int> firsts;
  bool mine = false;
  const absl::Time deadline = absl::Now() + timeout;
  for (int at = 0; at < world;) {
    absl::StatusOr<std::string> value =
        rendezvous->Get(absl::StrCat(kKey, at), deadline - absl::Now());
    if (absl::IsDeadlineExceeded(value.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the process of ranks from ", at, " on did not come within ",
          absl::FormatDuration(timeout), " (", value.status().message(), ")"));
    }
    RETURN_IF_ERROR(value.status());
    int n = 0;
    if (!absl::SimpleAtoi(*value, &n) || n < 1 || at + n > world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the process of ranks from ", at, " says it has \"", *value,
          "\" ranks; the processes' ranks must tile the world of ", world,
          " (give each machine its own --first-rank and --ranks)"));
    }
    mine = mine || at == first;
    firsts.push_back(at);
    at += n;
  }
  if (!mine) {
    return absl::InvalidArgumentError(
        absl::StrCat("another process's ranks overlap this one's, from ", first,
                     "; give each machine its own --first-rank and --ranks"));
  }
  return firsts;
}

}  // namespace dlbatch::trainer
