// Ranks as threads of one process (trainer/comm/thread_group.h): their
// collectives and rendezvous over shared memory, and how a rank's failure
// or absence ends the others' waits; groups of two processes over Gloo as
// one run; and (trainer/thread_ranks.h) over how many threads
// dlbatch-train splits a mini-batch, how processes of thread ranks find
// each other, and the words for a run's layout.
#include "trainer/comm/thread_group.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/thread_ranks.h"
#include "trainer/thread_ranks.h"

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

// Runs body(rank, communicator) for every rank of `group` on a thread of
// its own; returns each rank's status.
std::vector<absl::Status> RunRanks(
    ThreadGroup& group,
    const std::function<absl::Status(int, Communicator*)>& body) {
  std::vector<absl::Status> statuses(group.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = body(r, group.communicator(r));
      if (!statuses[r].ok()) group.Abort(statuses[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

// Rank r's value of element i: sums of them in rank order are exact but
// for the rounding each addition makes, which the test repeats.
float Value(int r, int64_t i) {
  return 1.0f / static_cast<float>(3 + 7 * r + i % 101) +
         static_cast<float>(r) * 1e3f;
}

TEST(ThreadGroup, AllreduceSumsInRankOrderEveryCountAndSize) {
  for (int size : {1, 2, 3, 5}) {
    // Counts below, at and off the ranks' 16-float shares.
    for (int64_t count : {0, 1, 2, 15, 16, 17, 33, 1000, 4099}) {
      ThreadGroup group(size, absl::Seconds(60));
      std::vector<std::vector<float>> data(size);
      const std::vector<absl::Status> s =
          RunRanks(group, [&](int r, Communicator* c) {
            EXPECT_EQ(c->rank(), r);
            EXPECT_EQ(c->size(), size);
            data[r].resize(count);
            for (int64_t i = 0; i < count; ++i) data[r][i] = Value(r, i);
            // Twice: the second sums the first's results, from every rank.
            RETURN_IF_ERROR(c->AllreduceSum(data[r].data(), count));
            return c->AllreduceSum(data[r].data(), count);
          });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(s[r].ok()) << s[r];
        for (int64_t i = 0; i < count; ++i) {
          float once = Value(0, i);
          for (int k = 1; k < size; ++k) once += Value(k, i);
          float twice = once;
          for (int k = 1; k < size; ++k) twice += once;
          ASSERT_EQ(data[r][i], twice) << "size " << size << " count " << count
                                       << " rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST(ThreadGroup, BroadcastAndBarrierAndCollectivesInTurn) {
  constexpr int kSize = 3;
  ThreadGroup group(kSize, absl::Seconds(60));
  std::vector<std::vector<float>> data(kSize, std::vector<float>(40));
  std::vector<int> before(kSize), after(kSize);
  std::atomic<int> arrived{0};
  const std::vector<absl::Status> s =
      RunRanks(group, [&](int r, Communicator* c) {
        for (int i = 0; i < 40; ++i) data[r][i] = Value(r, i);
        RETURN_IF_ERROR(c->Broadcast(data[r].data(), 40, 2));
        // No rank leaves a barrier before every rank has come to it.
        before[r] = arrived.fetch_add(1) + 1;
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        RETURN_IF_ERROR(c->Barrier());
        after[r] = arrived.load();
        // A bad root is refused on the rank that names it, before it
        // meets anyone.
        absl::Status bad = c->Broadcast(data[r].data(), 40, kSize);
        EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
        float one = 1;
        RETURN_IF_ERROR(c->StartAllreduceSum(&one, 1));
        RETURN_IF_ERROR(c->WaitAll());
        EXPECT_EQ(one, kSize);
        return absl::OkStatus();
      });
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(s[r].ok()) << s[r];
    for (int i = 0; i < 40; ++i) EXPECT_EQ(data[r][i], Value(2, i));
    EXPECT_EQ(after[r], kSize) << "rank " << r << " left the barrier early";
  }
  EXPECT_TRUE(group.aborted().ok());
}

// Started allreduces are summed together at WaitAll, or before the next
// collective, as every communicator's are.
TEST(ThreadGroup, StartedAllreducesAreSummedByWaitAllOrTheNextCollective) {
  constexpr int kSize = 2;
  ThreadGroup group(kSize, absl::Seconds(60));
  std::vector<std::vector<float>> a(kSize, std::vector<float>(70)),
      b(kSize, std::vector<float>(3)), c(kSize, std::vector<float>(1));
  const std::vector<absl::Status> s =
      RunRanks(group, [&](int r, Communicator* comm) {
        for (int i = 0; i < 70; ++i) a[r][i] = Value(r, i);
        for (int i = 0; i < 3; ++i) b[r][i] = Value(r, 100 + i);
        c[r][0] = static_cast<float>(r + 1);
        RETURN_IF_ERROR(comm->StartAllreduceSum(a[r].data(), 70));
        RETURN_IF_ERROR(comm->StartAllreduceSum(b[r].data(), 3));
        RETURN_IF_ERROR(comm->WaitAll());
        RETURN_IF_ERROR(comm->WaitAll());  // nothing started: no meeting
        RETURN_IF_ERROR(comm->StartAllreduceSum(c[r].data(), 1));
        return comm->Barrier();
      });
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(s[r].ok()) << s[r];
    for (int i = 0; i < 70; ++i) EXPECT_EQ(a[r][i], Value(0, i) + Value(1, i));
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(b[r][i], Value(0, 100 + i) + Value(1, 100 + i));
    }
    EXPECT_EQ(c[r][0], 3.0f);
  }
}

TEST(ThreadGroup, RanksOfDifferentCollectivesAreStoppedSayingSo) {
  ThreadGroup group(2, absl::Seconds(60));
  const std::vector<absl::Status> s =
      RunRanks(group, [&](int r, Communicator* c) {
        std::vector<float> data(r == 0 ? 10 : 12);
        return c->AllreduceSum(data.data(), static_cast<int64_t>(data.size()));
      });
  for (const absl::Status& status : s) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    EXPECT_THAT(status.message(), HasSubstr("the ranks' collectives differ"));
  }
}

TEST(ThreadGroup, AFailingRankEndsTheOthersWaitsWithItsStatus) {
  ThreadGroup group(3, absl::Minutes(10));
  const auto start = absl::Now();
  const std::vector<absl::Status> s =
      RunRanks(group, [&](int r, Communicator* c) -> absl::Status {
        if (r == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return absl::OutOfRangeError("the training loss became nan");
        }
        // The others wait: in a collective, and for a key nobody sets.
        float x = 1;
        RETURN_IF_ERROR(c->AllreduceSum(&x, 1));
        return group.rendezvous()->Get("never", absl::Minutes(10)).status();
      });
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (const absl::Status& status : s) {
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  }
  EXPECT_EQ(group.aborted().message(), "the training loss became nan");
  // Later waits end at once too.
  EXPECT_EQ(group.communicator(0)->Barrier().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(ThreadGroup, ARankThatNeverComesTimesTheOthersOut) {
  ThreadGroup group(2, absl::Milliseconds(300));
  absl::Status waited = group.communicator(0)->Barrier();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("a rank stopped coming"));
  EXPECT_THAT(waited.message(), HasSubstr("a barrier"));
  // The group is over for the late rank too.
  EXPECT_EQ(group.communicator(1)->Barrier().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(ThreadGroup, RendezvousGetsWhatAnotherRankSets) {
  ThreadGroup group(2, absl::Seconds(60));
  Rendezvous* rdv = group.rendezvous();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(rdv->Set("tuning", "0\tconv").ok());
  });
  absl::StatusOr<std::string> got = rdv->Get("tuning", absl::Seconds(30));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "0\tconv");
  absl::StatusOr<std::string> missing =
      rdv->Get("other", absl::Milliseconds(100));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(), HasSubstr("\"other\""));
}

// Two processes' groups (here threads of this test, meeting over Gloo as
// processes would), of 1 and 3 ranks: one run of 4 ranks, whose sums are
// each process's in rank order, then the processes'.
TEST(ThreadGroup, GroupsOfProcessesSumBroadcastAndMeetAsOneRun) {
  const std::vector<int> firsts = {0, 1};
  constexpr int kWorld = 4;
  constexpr int64_t kCount = 1000;
  std::vector<std::vector<float>> a(kWorld, std::vector<float>(kCount)),
      b(kWorld, std::vector<float>(3)), c(kWorld, std::vector<float>(40));
  std::vector<std::string> tuning(kWorld);
  const std::vector<absl::Status> processes = testing::RunRendezvousRanks(
      2, [&](int p, Rendezvous* rdv) -> absl::Status {
        ASSIGN_OR_RETURN(
            std::unique_ptr<Communicator> between,
            MakeGlooCommunicator(rdv, p, 2, "127.0.0.1", absl::Seconds(30)));
        ThreadGroup group(p == 0 ? 1 : 3, absl::Seconds(60),
                          /*splits_batch=*/false,
                          {between.get(), firsts, kWorld, rdv});
        const std::vector<absl::Status> ranks =
            RunRanks(group, [&](int r, Communicator* comm) -> absl::Status {
              const int rank = firsts[p] + r;
              EXPECT_EQ(comm->rank(), rank);
              EXPECT_EQ(comm->size(), kWorld);
              EXPECT_FALSE(comm->splits_batch());
              for (int64_t i = 0; i < kCount; ++i) a[rank][i] = Value(rank, i);
              for (int i = 0; i < 3; ++i) b[rank][i] = Value(rank, 500 + i);
              for (int i = 0; i < 40; ++i) c[rank][i] = Value(rank, i);
              RETURN_IF_ERROR(comm->StartAllreduceSum(a[rank].data(), kCount));
              RETURN_IF_ERROR(comm->StartAllreduceSum(b[rank].data(), 3));
              RETURN_IF_ERROR(comm->WaitAll());
              // From a rank of the other process than rank 0's, not its
              // first.
              RETURN_IF_ERROR(comm->Broadcast(c[rank].data(), 40, 2));
              absl::Status bad = comm->Broadcast(c[rank].data(), 40, kWorld);
              EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
              // Rank 0's key reaches the other process's ranks.
              if (rank == 0) {
                RETURN_IF_ERROR(group.rendezvous()->Set("tuning", "conv 3"));
              }
              ASSIGN_OR_RETURN(tuning[rank], group.rendezvous()->Get(
                                                 "tuning", absl::Seconds(30)));
              return comm->Barrier();
            });
        for (const absl::Status& s : ranks) RETURN_IF_ERROR(s);
        return absl::OkStatus();
      });
  for (const absl::Status& s : processes) ASSERT_TRUE(s.ok()) << s;
  for (int rank = 0; rank < kWorld; ++rank) {
    for (int64_t i = 0; i < kCount; ++i) {
      const float second = Value(1, i) + Value(2, i) + Value(3, i);
      ASSERT_EQ(a[rank][i], Value(0, i) + second)
          << "rank " << rank << " element " << i;
    }
    for (int i = 0; i < 3; ++i) {
      const float second =
          Value(1, 500 + i) + Value(2, 500 + i) + Value(3, 500 + i);
      EXPECT_EQ(b[rank][i], Value(0, 500 + i) + second);
    }
    for (int i = 0; i < 40; ++i) EXPECT_EQ(c[rank][i], Value(2, i));
    EXPECT_EQ(tuning[rank], "conv 3");
  }
}

// A process that leaves ends the other process's collectives on every one
// of its threads, with the reason its first thread met.
TEST(ThreadGroup, AProcessThatLeavesEndsTheOtherProcessesThreads) {
  const std::vector<int> firsts = {0, 1};
  std::vector<absl::Status> ranks;
  absl::Status aborted;
  testing::RunRendezvousRanks(2, [&](int p, Rendezvous* rdv) -> absl::Status {
    ASSIGN_OR_RETURN(
        std::unique_ptr<Communicator> between,
        MakeGlooCommunicator(rdv, p, 2, "127.0.0.1", absl::Seconds(30)));
    if (p == 0) return absl::OkStatus();  // its connections close
    ThreadGroup group(2, absl::Seconds(60), false,
                      {between.get(), firsts, 3, rdv});
    ranks = RunRanks(group, [&](int, Communicator* comm) {
      std::vector<float> x(100, 1.0f);
      return comm->AllreduceSum(x.data(), 100);
    });
    aborted = group.aborted();
    return absl::OkStatus();
  });
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_FALSE(aborted.ok());
  for (const absl::Status& s : ranks) {
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s, aborted);
  }
}

TEST(MeetProcesses, EachProcessLearnsEveryOnesFirstRank) {
  const std::vector<int> firsts = {0, 2, 3}, counts = {2, 1, 3};
  std::vector<std::vector<int>> seen(3);
  const std::vector<absl::Status> s = testing::RunRendezvousRanks(
      3, [&](int p, Rendezvous* rdv) -> absl::Status {
        ASSIGN_OR_RETURN(seen[p], MeetProcesses(rdv, firsts[p], counts[p], 6,
                                                absl::Seconds(30)));
        return absl::OkStatus();
      });
  for (int p = 0; p < 3; ++p) {
    ASSERT_TRUE(s[p].ok()) << s[p];
    EXPECT_EQ(seen[p], firsts);
  }
}

TEST(MeetProcesses, AMissingOrBadProcessIsNamed) {
  testing::RunRendezvousRanks(1, [&](int, Rendezvous* rdv) -> absl::Status {
    absl::StatusOr<std::vector<int>> alone =
        MeetProcesses(rdv, 0, 2, 4, absl::Milliseconds(200));
    EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(alone.status().message(),
                HasSubstr("the process of ranks from 2 on did not come"));
    EXPECT_TRUE(rdv->Set("processes/first-rank-2", "9").ok());
    absl::StatusOr<std::vector<int>> bad =
        MeetProcesses(rdv, 0, 2, 4, absl::Seconds(5));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("says it has \"9\" ranks"));
    EXPECT_EQ(MeetProcesses(rdv, 3, 2, 4, absl::Seconds(5)).status().code(),
              absl::StatusCode::kInvalidArgument);
    return absl::OkStatus();
  });
}

TEST(DescribeLayout, NamesProcessesThreadsAndReplicas) {
  TrainRequest req;
  req.threads = 1;
  req.ranks_per_process = {2};
  EXPECT_EQ(DescribeLayout(LayoutOf(req, 2, false, true), 64),
            "1 process, 2 threads, each mini-batch of 64 split over 2 "
            "replicas");
  req.ranks_per_process = {2, 2};
  EXPECT_EQ(DescribeLayout(LayoutOf(req, 4, false, false), 32),
            "2 processes, 2 threads each, each mini-batch of 32 split over 4 "
            "replicas");
  req.ranks_per_process = {1, 3};
  EXPECT_EQ(DescribeLayout(LayoutOf(req, 4, false, false), 32),
            "2 processes, 4 threads in all, each mini-batch of 32 split over "
            "4 replicas");
  // A process per rank (launched ranks), and one rank.
  req.ranks_per_process.clear();
  EXPECT_EQ(DescribeLayout(LayoutOf(req, 2, false, false), 64),
            "2 processes, 1 thread each, each mini-batch of 64 split over 2 "
            "replicas");
  req.threads = 4;
  EXPECT_EQ(DescribeLayout(LayoutOf(req, 1, false, false), 64),
            "1 process, 4 threads, mini-batch 64");
  // A GPU's threads are not counted.
  EXPECT_EQ(DescribeLayout(LayoutOf(req, 2, true, false), 64),
            "2 processes, each mini-batch of 64 split over 2 replicas");
  EXPECT_EQ(LayoutOf(req, 2, true, false).threads_per_replica, 0);
}

TEST(SplitBatchRanks, SplitsOverThreadsThatDivideTheBatch) {
  EXPECT_EQ(SplitBatchRanks(64, 2, std::nullopt), 2);
  EXPECT_EQ(SplitBatchRanks(64, 1, std::nullopt), 1);
  // 16 samples a rank at least: batch 64 over 8 threads is 4 ranks of 2.
  EXPECT_EQ(SplitBatchRanks(64, 8, std::nullopt), 4);
  EXPECT_EQ(SplitBatchRanks(512, 8, std::nullopt), 8);
  EXPECT_EQ(SplitBatchRanks(16, 2, std::nullopt), 1);
  // Ranks divide the threads: 3 threads are 3 ranks or none.
  EXPECT_EQ(SplitBatchRanks(64, 3, std::nullopt), 3);
  EXPECT_EQ(SplitBatchRanks(40, 3, std::nullopt), 1);
  // DLBATCH_SPLIT_BATCH=1: down to a sample a rank; =0: never.
  EXPECT_EQ(SplitBatchRanks(16, 2, true), 2);
  EXPECT_EQ(SplitBatchRanks(3, 4, true), 2);
  EXPECT_EQ(SplitBatchRanks(64, 2, false), 1);
}

}  // namespace
}  // namespace dlbatch::trainer
