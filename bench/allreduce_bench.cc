// Allreduce of one gradient buffer between local ranks over Gloo's TCP
// transport on 127.0.0.1, for each of Gloo's algorithms: the time per call
// (median and 90th percentile of rank 0 over --iters calls) and whether all
// ranks ended with identical bits.
//
//   allreduce_bench [--count 431080] [--iters 100] [--ranks 2,4]
//                   [--algorithms ring,ring_chunked,...]
//
// Each rank is a process of its own (as the worker starts them), and the
// ranks find each other through a folder rendezvous in a temp folder.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/communicator_gloo.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

struct Options {
  int64_t count = 431080;  // LeNet's parameters
  int iters = 100;
  std::vector<int> ranks = {2, 4};
  std::vector<GlooAllreduce> algorithms = {
      GlooAllreduce::kRing, GlooAllreduce::kRingChunked,
      GlooAllreduce::kHalvingDoubling, GlooAllreduce::kUnifiedRing,
      GlooAllreduce::kUnifiedBcube};
};

constexpr int kWarmup = 5;

// One rank: warm up, time each call, then one more call on fresh data whose
// result's digest goes to the rendezvous. Rank 0 writes the report line.
int RunRank(const Options& opt, GlooAllreduce algorithm, const std::string& dir,
            int rank, int size) {
  auto rdv = OpenFileRendezvous(dir);
  if (!rdv.ok()) return 2;
  auto comm = MakeGlooCommunicatorWith(algorithm, rdv->get(), rank, size,
                                       "127.0.0.1", absl::Seconds(30));
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 3;
  }
  Rng rng(Key(1234, static_cast<uint64_t>(rank)));
  std::vector<float> source(static_cast<size_t>(opt.count));
  for (float& x : source) x = static_cast<float>(rng.Uniform() - 0.5);
  std::vector<float> data = source;

  std::vector<double> micros;
  for (int i = 0; i < kWarmup + opt.iters; ++i) {
    std::copy(source.begin(), source.end(), data.begin());  // keep sums finite
    const absl::Time start = absl::Now();
    absl::Status s = (*comm)->AllreduceSum(data.data(), opt.count);
    const absl::Duration took = absl::Now() - start;
    if (!s.ok()) {
      fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return 4;
    }
    if (i >= kWarmup) micros.push_back(absl::ToDoubleMicroseconds(took));
  }
  std::copy(source.begin(), source.end(), data.begin());
  if (!(*comm)->AllreduceSum(data.data(), opt.count).ok()) return 4;
  const std::string digest = Sha256Hex(absl::string_view(
      reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float)));
  if (!(*rdv)->Set(absl::StrCat("digest_", rank), digest).ok()) return 5;
  if (!(*comm)->Barrier().ok()) return 6;  // nobody closes while others run
  if (rank != 0) return 0;

  bool identical = true;
  for (int r = 1; r < size; ++r) {
    auto other = (*rdv)->Get(absl::StrCat("digest_", r), absl::Seconds(30));
    if (!other.ok()) return 7;
    identical = identical && *other == digest;
  }
  std::sort(micros.begin(), micros.end());
  const double median = micros[micros.size() / 2];
  const double p90 = micros[micros.size() * 9 / 10];
  const double gbps = opt.count * sizeof(float) / (median * 1e-6) / 1e9;
  printf("%-18s %5d %10.0f %10.0f %10.2f  %s\n", GlooAllreduceName(algorithm),
         size, median, p90, gbps, identical ? "yes" : "NO");
  fflush(stdout);
  return 0;
}

bool Run(const Options& opt, GlooAllreduce algorithm, int size) {
  char tmpl[] = "/tmp/allreduce_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return false;
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(opt, algorithm, dir, rank, size));
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  (void)RemoveTree(dir);
  return ok;
}

bool ParseArgs(int argc, char** argv, Options* opt) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--count") {
      if (!absl::SimpleAtoi(value, &opt->count) || opt->count <= 0)
        return false;
    } else if (flag == "--iters") {
      if (!absl::SimpleAtoi(value, &opt->iters) || opt->iters <= 0)
        return false;
    } else if (flag == "--ranks") {
      opt->ranks.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 2) return false;
        opt->ranks.push_back(n);
      }
    } else if (flag == "--algorithms") {
      std::vector<GlooAllreduce> all = opt->algorithms;
      opt->algorithms.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        auto it = std::find_if(all.begin(), all.end(), [&](GlooAllreduce a) {
          return part == GlooAllreduceName(a);
        });
        if (it == all.end()) return false;
        opt->algorithms.push_back(*it);
      }
    } else {
      return false;
    }
  }
  return argc % 2 == 1;
}

}  // namespace
}  // namespace dlbatch::trainer

int main(int argc, char** argv) {
  using namespace dlbatch::trainer;
  Options opt;
  if (!ParseArgs(argc, argv, &opt)) {
    fprintf(stderr,
            "usage: %s [--count N] [--iters N] [--ranks 2,4] "
            "[--algorithms ring,ring_chunked,halving_doubling,"
            "allreduce(ring),allreduce(bcube)]\n",
            argv[0]);
    return 2;
  }
  printf("allreduce of %lld floats (%.2f MB), %d calls, ranks on 127.0.0.1\n",
         static_cast<long long>(opt.count), opt.count * 4 / 1e6, opt.iters);
  printf("%-18s %5s %10s %10s %10s  %s\n", "algorithm", "ranks", "median_us",
         "p90_us", "GB/s", "bit-identical");
  fflush(stdout);
  bool ok = true;
  for (int size : opt.ranks) {
    for (GlooAllreduce algorithm : opt.algorithms) {
      ok = Run(opt, algorithm, size) && ok;
    }
  }
  return ok ? 0 : 1;
}
