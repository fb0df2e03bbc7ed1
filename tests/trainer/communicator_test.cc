// The folder rendezvous and the Gloo communicator: real files, real TCP on
// 127.0.0.1, ranks as threads of this process or as forked processes.
#include "trainer/comm/communicator.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/comm/communicator_gloo.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kCount = 400000;
constexpr char kHost[] = "127.0.0.1";

std::string MakeTempDir() {
  std::string tmpl = testing::TempDir() + "/comm_test_XXXXXX";
  char* made = mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  return tmpl;
}

// Rank `rank`'s gradient: uniform in [-1, 1), different on every rank.
std::vector<float> RankData(int rank, int64_t count, uint64_t seed = 7) {
  Rng rng(Key(seed, static_cast<uint64_t>(rank)));
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = static_cast<float>(rng.Uniform() * 2.0 - 1.0);
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

// Checks `sum` against the exact sum of every rank's RankData.
void ExpectSumOfRanks(const std::vector<float>& sum, int size) {
  std::vector<double> exact(sum.size(), 0.0);
  for (int r = 0; r < size; ++r) {
    std::vector<float> d = RankData(r, static_cast<int64_t>(sum.size()));
    for (size_t i = 0; i < d.size(); ++i) exact[i] += d[i];
  }
  size_t bad = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    if (std::fabs(sum[i] - exact[i]) > 1e-5) ++bad;
  }
  EXPECT_EQ(bad, 0u) << "elements off the exact sum, of " << sum.size();
}

// Forks one process per rank in `ranks`; each runs `body(rank)` and exits
// with its result (0 for success). Call before this process starts any
// Gloo thread of its own.
std::vector<pid_t> ForkRanks(const std::vector<int>& ranks,
                             const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    pid_t pid = fork();
    if (pid == 0) _exit(body(rank));
    EXPECT_GT(pid, 0);
    pids.push_back(pid);
  }
  return pids;
}

// Waits for `pid` up to `limit`; kills it past that. Returns its exit code,
// or -1 if it was killed or died by a signal.
int WaitFor(pid_t pid, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "rank process " << pid << " hung; killed";
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ---------------------------------------------------------------- rendezvous

TEST(FileRendezvous, SetThenGet) {
  const std::string dir = MakeTempDir() + "/nested/store";
  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok()) << rdv.status();
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE((*rdv)->Set("job/7/rank_0", binary).ok());
  ASSERT_TRUE((*rdv)->Set("key.tmp", "dots").ok());
  ASSERT_TRUE((*rdv)->Set("key", "plain").ok());

  auto got = (*rdv)->Get("job/7/rank_0", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, binary);
  EXPECT_EQ(*(*rdv)->Get("key.tmp", absl::Seconds(1)), "dots");
  EXPECT_EQ(*(*rdv)->Get("key", absl::Seconds(1)), "plain");

  // A second store over the same folder (another rank) sees the same keys,
  // and a later Set replaces the value whole.
  auto other = OpenFileRendezvous(dir + "/");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Set("key", "replaced").ok());
  EXPECT_EQ(*(*rdv)->Get("key", absl::Seconds(1)), "replaced");
  EXPECT_FALSE((*rdv)->Set("", "x").ok());
}

TEST(FileRendezvous, GetWaitsForALaterSet) {
  auto rdv = OpenFileRendezvous(MakeTempDir());
  ASSERT_TRUE(rdv.ok());
  const absl::Time start = absl::Now();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(150));
    ASSERT_TRUE((*rdv)->Set("late", "arrived").ok());
  });
  auto got = (*rdv)->Get("late", absl::Seconds(10));
  const absl::Duration waited = absl::Now() - start;
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "arrived");
  EXPECT_GE(waited, absl::Milliseconds(140));
  EXPECT_LT(waited, absl::Seconds(2)) << "polling far too slowly";
}

TEST(FileRendezvous, TimeoutNamesKeyFolderAndRank) {
  const std::string dir = MakeTempDir();
  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok());
  const absl::Time start = absl::Now();
  auto got = (*rdv)->Get("gloo/0/rank_3", absl::Milliseconds(200));
  const absl::Duration waited = absl::Now() - start;
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded)
      << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("'gloo/0/rank_3'"));
  EXPECT_THAT(got.status().message(), HasSubstr(dir));
  EXPECT_THAT(got.status().message(), HasSubstr("rank 3 likely never arrived"));
  EXPECT_GE(waited, absl::Milliseconds(190));
  EXPECT_LT(waited, absl::Seconds(2));

  auto plain = (*rdv)->Get("weights", absl::ZeroDuration());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(plain.status().message(), Not(HasSubstr("never arrived")));
}

TEST(FileRendezvous, RefusesAFolderItCannotMake) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/file", "x").ok());
  EXPECT_FALSE(OpenFileRendezvous(dir + "/file/sub").ok());
}

// ---------------------------------------------------------------- solo

TEST(SoloCommunicator, CollectivesLeaveDataAlone) {
  auto solo = MakeSoloCommunicator();
  EXPECT_EQ(solo->rank(), 0);
  EXPECT_EQ(solo->size(), 1);
  std::vector<float> v = {1.5f, -2.0f};
  ASSERT_TRUE(solo->AllreduceSum(v.data(), 2).ok());
  ASSERT_TRUE(solo->Broadcast(v.data(), 2, 0).ok());
  ASSERT_TRUE(solo->Barrier().ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_FALSE(solo->Broadcast(v.data(), 2, 1).ok());
  // Started allreduces are the blocking ones: done at once.
  ASSERT_TRUE(solo->StartAllreduceSum(v.data(), 2).ok());
  ASSERT_TRUE(solo->WaitAll().ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_FALSE(solo->StartAllreduceSum(v.data(), -1).ok());
  // No device work waits on its collectives: WaitOnDevice polls until done.
  int polls = 0;
  ASSERT_TRUE(solo->WaitOnDevice([&] { return ++polls == 5; }, "work").ok());
  EXPECT_EQ(polls, 5);
}

// ---------------------------------------------------------------- Gloo

// One rank's work in the process tests: allreduce, broadcast from the last
// rank, and a barrier that must hold every rank back until all arrived.
// Results go to files in `dir`; returns a process exit code.
int RankCollectives(const std::string& dir, int rank, int size) {
  auto rdv = OpenFileRendezvous(dir + "/rdv");
  if (!rdv.ok()) return 10;
  auto comm =
      MakeGlooCommunicator(rdv->get(), rank, size, kHost, absl::Seconds(10));
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 11;
  }
  if ((*comm)->rank() != rank || (*comm)->size() != size) return 12;

  std::vector<float> data = RankData(rank, kCount);
  if (!(*comm)->AllreduceSum(data.data(), kCount).ok()) return 13;
  if (!WriteFileAtomic(absl::StrCat(dir, "/sum_", rank), Bytes(data)).ok())
    return 14;

  std::vector<float> b = RankData(rank, 1000, /*seed=*/99);
  if (!(*comm)->Broadcast(b.data(), 1000, size - 1).ok()) return 15;
  if (!WriteFileAtomic(absl::StrCat(dir, "/bcast_", rank), Bytes(b)).ok())
    return 16;

  // Later ranks arrive later; nobody may pass the barrier before the last.
  absl::SleepFor(absl::Milliseconds(60 * rank));
  if (!WriteFileAtomic(absl::StrCat(dir, "/arrived_", rank), "").ok())
    return 17;
  if (!(*comm)->Barrier().ok()) return 18;
  for (int r = 0; r < size; ++r) {
    if (!ReadFile(absl::StrCat(dir, "/arrived_", r)).ok()) return 19;
  }
  return 0;
}

class GlooProcesses : public testing::TestWithParam<int> {};

TEST_P(GlooProcesses, AllreduceBroadcastBarrier) {
  const int size = GetParam();
  const std::string dir = MakeTempDir();
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(r);
  std::vector<pid_t> pids = ForkRanks(
      ranks, [&](int rank) { return RankCollectives(dir, rank, size); });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(WaitFor(pids[r], absl::Seconds(15)), 0) << "rank " << r;
  }

  auto first = ReadFile(dir + "/sum_0");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), kCount * sizeof(float));
  for (int r = 1; r < size; ++r) {
    auto other = ReadFile(absl::StrCat(dir, "/sum_", r));
    ASSERT_TRUE(other.ok());
    EXPECT_TRUE(*other == *first) << "rank " << r << " holds other bits";
  }
  std::vector<float> sum(kCount);
  std::memcpy(sum.data(), first->data(), first->size());
  ExpectSumOfRanks(sum, size);

  const std::string root = Bytes(RankData(size - 1, 1000, 99));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(*ReadFile(absl::StrCat(dir, "/bcast_", r)), root) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooProcesses, testing::Values(2, 4));

// Runs `body(rank, communicator)` on one thread per rank, each with its own
// Gloo device and context, then a barrier.
void RunThreadRanks(GlooAllreduce algorithm, int size, Rendezvous* rdv,
                    const std::function<void(int, Communicator*)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = MakeGlooCommunicatorWith(algorithm, rdv, rank, size, kHost,
                                           absl::Seconds(10));
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(rank, comm->get());
      // Closing a communicator closes its connections: a peer still inside
      // the last collective (waiting on an unflushed notification) would
      // fail, so ranks part at a barrier, as a training job ends.
      absl::Status parted = (*comm)->Barrier();
      EXPECT_TRUE(parted.ok()) << parted;
    });
  }
  for (auto& t : threads) t.join();
}

class GlooAlgorithms
    : public testing::TestWithParam<std::tuple<GlooAllreduce, int>> {};

// Threads, 3 and 4 ranks, every algorithm: right sums; identical bits on
// every rank for all but the plain ring (which is why it is not used).
TEST_P(GlooAlgorithms, ThreadRanksSum) {
  const auto [algorithm, kSize] = GetParam();
  auto rdv = OpenFileRendezvous(MakeTempDir());
  ASSERT_TRUE(rdv.ok());
  std::vector<std::vector<float>> out(kSize);
  RunThreadRanks(algorithm, kSize, rdv->get(), [&](int rank, Communicator* c) {
    out[rank] = RankData(rank, kCount);
    // Twice: the second call reuses what the first set up.
    absl::Status first = c->AllreduceSum(out[rank].data(), kCount);
    ASSERT_TRUE(first.ok()) << first;
    std::vector<float> again = RankData(rank, kCount);
    absl::Status second = c->AllreduceSum(again.data(), kCount);
    ASSERT_TRUE(second.ok()) << second;
    EXPECT_TRUE(again == out[rank]);
  });
  ExpectSumOfRanks(out[0], kSize);
  for (int r = 1; r < kSize; ++r) {
    ExpectSumOfRanks(out[r], kSize);
    if (algorithm == GlooAllreduce::kRing) continue;
    EXPECT_TRUE(out[r] == out[0]) << "rank " << r << " holds other bits";
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, GlooAlgorithms,
    testing::Combine(testing::Values(GlooAllreduce::kRing,
                                     GlooAllreduce::kRingChunked,
                                     GlooAllreduce::kHalvingDoubling,
                                     GlooAllreduce::kUnifiedRing,
                                     GlooAllreduce::kUnifiedBcube),
                     testing::Values(3, 4)),
    [](const auto& info) {
      std::string name =
          absl::StrCat(GlooAllreduceName(std::get<0>(info.param)), "_",
                       std::get<1>(info.param), "ranks");
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

class GlooStartedAllreduce
    : public testing::TestWithParam<std::tuple<GlooAllreduce, int>> {};

// Buckets as backward starts them (highest first, of uneven sizes), with
// blocking collectives called in between: the same bits as the blocking
// allreduce of the same slices, on every rank, and (2 ranks: one addition
// per element) as one blocking allreduce of the whole buffer.
TEST_P(GlooStartedAllreduce, SumsAsTheBlockingOneWithCollectivesBetween) {
  const auto [algorithm, size] = GetParam();
  const std::vector<int64_t> bounds = {0,      1000,       1001,
                                       150000, kCount - 1, kCount};
  auto rdv = OpenFileRendezvous(MakeTempDir());
  ASSERT_TRUE(rdv.ok());
  std::vector<std::vector<float>> out(size);
  RunThreadRanks(
      algorithm, size, rdv->get(), [&, size = size](int rank, Communicator* c) {
        const float small_sum = static_cast<float>(size * (size + 1) / 2);
        // Twice: the second round reuses what the first set up.
        for (int round = 0; round < 2; ++round) {
          std::vector<float> started = RankData(rank, kCount);
          std::vector<float> blocking = started;
          std::vector<float> small(3, static_cast<float>(rank + 1));
          std::vector<float> bcast(5, static_cast<float>(rank));
          for (size_t i = bounds.size() - 1; i > 0; --i) {
            const int64_t first = bounds[i - 1], count = bounds[i] - first;
            ASSERT_TRUE(
                c->StartAllreduceSum(started.data() + first, count).ok());
            if (i == bounds.size() - 2) {
              ASSERT_TRUE(c->AllreduceSum(small.data(), 3).ok());
              ASSERT_TRUE(c->Broadcast(bcast.data(), 5, size - 1).ok());
              EXPECT_EQ(small, std::vector<float>(3, small_sum));
              EXPECT_EQ(bcast,
                        std::vector<float>(5, static_cast<float>(size - 1)));
            }
          }
          ASSERT_TRUE(c->StartAllreduceSum(started.data(), 0).ok());
          EXPECT_EQ(c->StartAllreduceSum(nullptr, 5).code(),
                    absl::StatusCode::kInvalidArgument);
          absl::Status waited = c->WaitAll();
          ASSERT_TRUE(waited.ok()) << waited;
          EXPECT_TRUE(c->WaitAll().ok());  // nothing left to wait for

          for (size_t i = bounds.size() - 1; i > 0; --i) {
            const int64_t first = bounds[i - 1];
            ASSERT_TRUE(
                c->AllreduceSum(blocking.data() + first, bounds[i] - first)
                    .ok());
          }
          EXPECT_TRUE(started == blocking)
              << "rank " << rank << " round " << round;
          if (size == 2) {
            std::vector<float> whole = RankData(rank, kCount);
            ASSERT_TRUE(c->AllreduceSum(whole.data(), kCount).ok());
            EXPECT_TRUE(started == whole)
                << "rank " << rank << " round " << round;
          }
          out[rank] = std::move(started);
        }
      });
  for (int r = 0; r < size; ++r) {
    ExpectSumOfRanks(out[r], size);
    EXPECT_TRUE(out[r] == out[0]) << "rank " << r << " holds other bits";
  }
}

INSTANTIATE_TEST_SUITE_P(
    BitIdentical, GlooStartedAllreduce,
    testing::Combine(testing::Values(GlooAllreduce::kHalvingDoubling,
                                     GlooAllreduce::kRingChunked,
                                     GlooAllreduce::kUnifiedRing),
                     testing::Values(2, 3)),
    [](const auto& info) {
      std::string name =
          absl::StrCat(GlooAllreduceName(std::get<0>(info.param)), "_",
                       std::get<1>(info.param), "ranks");
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// A peer killed between steps: the started allreduces fail, and WaitAll
// says so within the timeout; the communicator refuses everything after.
TEST(GlooCommunicator, KilledPeerFailsWaitAll) {
  const std::string dir = MakeTempDir();
  const absl::Duration timeout = absl::Seconds(3);
  std::vector<pid_t> pids = ForkRanks({1}, [&](int rank) {
    auto rdv = OpenFileRendezvous(dir);
    if (!rdv.ok()) return 10;
    auto comm = MakeGlooCommunicator(rdv->get(), rank, 2, kHost, timeout);
    if (!comm.ok()) return 11;
    std::vector<float> v = RankData(rank, kCount);
    if (!(*comm)->StartAllreduceSum(v.data(), kCount).ok()) return 12;
    if (!(*comm)->WaitAll().ok()) return 13;
    if (!WriteFileAtomic(absl::StrCat(dir, "/done_", rank), "").ok()) return 14;
    absl::SleepFor(absl::Seconds(60));  // killed here
    return 15;
  });
  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok());
  auto comm = MakeGlooCommunicator(rdv->get(), 0, 2, kHost, timeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> v = RankData(0, kCount);
  ASSERT_TRUE((*comm)->StartAllreduceSum(v.data(), kCount).ok());
  ASSERT_TRUE((*comm)->WaitAll().ok());
  ASSERT_TRUE(rdv->get()->Get("done_1", absl::Seconds(5)).ok());
  kill(pids[0], SIGKILL);
  EXPECT_EQ(WaitFor(pids[0], absl::Seconds(5)), -1);

  const absl::Time start = absl::Now();
  for (int64_t first : {300000, 100000, 0}) {
    // Starting never waits on the peer; the failure comes from WaitAll.
    EXPECT_TRUE((*comm)->StartAllreduceSum(v.data() + first, 100000).ok());
  }
  absl::Status failed = (*comm)->WaitAll();
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(),
              HasSubstr("allreduce of 100000 floats on rank 0 of 2"));
  EXPECT_LT(took, timeout + absl::Seconds(1));
  EXPECT_TRUE((*comm)->WaitAll().ok());  // reported once
  EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*comm)->StartAllreduceSum(v.data(), 10).ok());
  EXPECT_EQ((*comm)->WaitAll().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GlooCommunicator, SeveralPerJobAndOddSizes) {
  auto rdv = OpenFileRendezvous(MakeTempDir());
  ASSERT_TRUE(rdv.ok());
  // Two communicators in a row over one store, and counts that do not split
  // evenly over the ranks (and none at all).
  for (int round = 0; round < 2; ++round) {
    RunThreadRanks(
        kDefaultGlooAllreduce, 3, rdv->get(), [&](int rank, Communicator* c) {
          for (int64_t count :
               {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}}) {
            std::vector<float> v(count, static_cast<float>(rank + 1));
            ASSERT_TRUE(c->AllreduceSum(v.data(), count).ok());
            for (float x : v) ASSERT_EQ(x, 6.0f);
          }
          EXPECT_FALSE(c->Broadcast(nullptr, 5, 0).ok());
          EXPECT_FALSE(c->Broadcast(nullptr, 0, 3).ok());
          ASSERT_TRUE(c->Barrier().ok());  // still usable after argument errors
        });
  }
}

// A peer killed mid-job: the survivors' next collective fails within the
// timeout, and later ones refuse at once.
TEST(GlooCommunicator, KilledPeerFailsTheNextCollective) {
  const std::string dir = MakeTempDir();
  constexpr int kSize = 3;
  const absl::Duration timeout = absl::Seconds(5);
  // Rank 1 is the victim; rank 2 must see the failure too and exit 0.
  std::vector<pid_t> pids = ForkRanks({1, 2}, [&](int rank) {
    auto rdv = OpenFileRendezvous(dir);
    if (!rdv.ok()) return 10;
    auto comm = MakeGlooCommunicator(rdv->get(), rank, kSize, kHost, timeout);
    if (!comm.ok()) return 11;
    std::vector<float> v = RankData(rank, kCount);
    if (!(*comm)->AllreduceSum(v.data(), kCount).ok()) return 12;
    if (!WriteFileAtomic(absl::StrCat(dir, "/done_", rank), "").ok()) return 14;
    absl::Status second = (*comm)->AllreduceSum(v.data(), kCount);
    return second.ok() ? 13 : 0;
  });

  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok());
  auto comm = MakeGlooCommunicator(rdv->get(), 0, kSize, kHost, timeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> v = RankData(0, kCount);
  ASSERT_TRUE((*comm)->AllreduceSum(v.data(), kCount).ok());

  // Rank 0 leaving a collective does not mean the others did: wait until
  // both children finished the first one too.
  for (int rank : {1, 2}) {
    auto done = rdv->get()->Get(absl::StrCat("done_", rank), absl::Seconds(5));
    ASSERT_TRUE(done.ok()) << done.status();
  }
  kill(pids[0], SIGKILL);
  EXPECT_EQ(WaitFor(pids[0], absl::Seconds(5)), -1);
  const absl::Time start = absl::Now();
  absl::Status failed = (*comm)->AllreduceSum(v.data(), kCount);
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(failed.ok());
  EXPECT_LT(took, timeout + absl::Seconds(1));
  EXPECT_THAT(failed.message(),
              HasSubstr("allreduce of 400000 floats on rank 0 of 3"));
  EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  // Rank 2 may be waiting on rank 0, not on the dead rank: it fails within
  // its timeout, or at once when rank 0 gives up and closes, as a failed
  // trainer does.
  comm->reset();
  EXPECT_EQ(WaitFor(pids[1], timeout + absl::Seconds(3)), 0)
      << "the other survivor did not get an error";
}

// A peer that stays silent (stopped, not dead): the allreduce gives up
// after the timeout with DeadlineExceeded.
TEST(GlooCommunicator, SilentPeerTimesOut) {
  const std::string dir = MakeTempDir();
  const absl::Duration timeout = absl::Seconds(1);
  std::vector<pid_t> pids = ForkRanks({1}, [&](int rank) {
    auto rdv = OpenFileRendezvous(dir);
    if (!rdv.ok()) return 10;
    auto comm = MakeGlooCommunicator(rdv->get(), rank, 2, kHost, timeout);
    if (!comm.ok()) return 11;
    if (!(*comm)->Barrier().ok()) return 12;
    raise(SIGSTOP);
    return 0;
  });
  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok());
  auto comm = MakeGlooCommunicator(rdv->get(), 0, 2, kHost, timeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->Barrier().ok());

  const absl::Time start = absl::Now();
  std::vector<float> v = RankData(0, kCount);
  absl::Status failed = (*comm)->AllreduceSum(v.data(), kCount);
  const absl::Duration took = absl::Now() - start;
  kill(pids[0], SIGKILL);
  WaitFor(pids[0], absl::Seconds(5));
  EXPECT_EQ(failed.code(), absl::StatusCode::kDeadlineExceeded) << failed;
  EXPECT_THAT(std::string(failed.message()),
              HasSubstr("did not answer in time"));
  EXPECT_GE(took, timeout - absl::Milliseconds(100));
  EXPECT_LT(took, timeout + absl::Seconds(2));
}

// Ranks 0 and 1 of 3 come; rank 2 never does.
TEST(GlooCommunicator, MissingRankIsDeadlineExceeded) {
  auto rdv = OpenFileRendezvous(MakeTempDir());
  ASSERT_TRUE(rdv.ok());
  const absl::Duration timeout = absl::Milliseconds(500);
  std::vector<absl::Status> got(2);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      got[rank] =
          MakeGlooCommunicator(rdv->get(), rank, 3, kHost, timeout).status();
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(got[rank].code(), absl::StatusCode::kDeadlineExceeded)
        << got[rank];
    EXPECT_THAT(std::string(got[rank].message()),
                HasSubstr("rank 2 likely never arrived"));
  }
  EXPECT_LT(took, timeout * 3 + absl::Seconds(1));
}

TEST(GlooCommunicator, RefusesBadArguments) {
  auto rdv = OpenFileRendezvous(MakeTempDir());
  ASSERT_TRUE(rdv.ok());
  EXPECT_FALSE(
      MakeGlooCommunicator(nullptr, 0, 2, kHost, absl::Seconds(1)).ok());
  EXPECT_FALSE(
      MakeGlooCommunicator(rdv->get(), 2, 2, kHost, absl::Seconds(1)).ok());
  EXPECT_FALSE(
      MakeGlooCommunicator(rdv->get(), 0, 2, "", absl::Seconds(1)).ok());
  EXPECT_FALSE(
      MakeGlooCommunicator(rdv->get(), 0, 2, kHost, absl::ZeroDuration()).ok());
  auto one = MakeGlooCommunicator(rdv->get(), 0, 1, kHost, absl::Seconds(1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->size(), 1);
}

}  // namespace
}  // namespace dlbatch::trainer
