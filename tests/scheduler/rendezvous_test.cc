// The train jobs' rendezvous: keys per attempt, secrets, waits, limits.
#include "scheduler/rendezvous.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace dlbatch::scheduler {
namespace {

TEST(RendezvousStore, ARankSetsAndAnotherGets) {
  RendezvousStore store("key");
  store.Open(7, 1);
  const std::string secret = store.SecretFor(7, 1);
  ASSERT_TRUE(store.Set(7, 1, secret, "rank_0", "10.0.0.1:4000").ok());
  auto value = store.Get(7, 1, secret, "rank_0", 0, nullptr);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "10.0.0.1:4000");
}

TEST(RendezvousStore, AGetWaitsForTheSetOfAnotherRank) {
  RendezvousStore store("key");
  store.Open(7, 1);
  const std::string secret = store.SecretFor(7, 1);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store.Set(7, 1, secret, "rank_1", "there").ok());
  });
  auto value = store.Get(7, 1, secret, "rank_1", 5000, nullptr);
  later.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "there");
}

TEST(RendezvousStore, AMissingKeyIsNotFoundAfterTheTimeout) {
  RendezvousStore store("key");
  store.Open(7, 1);
  auto value = store.Get(7, 1, store.SecretFor(7, 1), "rank_3", 20, nullptr);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(value.status().message().find("rank_3"), std::string::npos);
}

TEST(RendezvousStore, AWaitEndsWhenTheCallerLeaves) {
  RendezvousStore store("key");
  store.Open(7, 1);
  std::atomic<bool> gone{false};
  std::thread leave([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto value = store.Get(7, 1, store.SecretFor(7, 1), "never", 10000,
                         [&] { return gone.load(); });
  leave.join();
  EXPECT_FALSE(value.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(RendezvousStore, SecretsBelongToOneAttemptOfOneJob) {
  RendezvousStore store("key");
  store.Open(7, 2);
  EXPECT_EQ(store.Set(7, 2, "wrong", "k", "v").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.Set(7, 2, store.SecretFor(7, 1), "k", "v").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.Set(7, 2, store.SecretFor(8, 2), "k", "v").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_NE(RendezvousStore("other key").SecretFor(7, 2),
            store.SecretFor(7, 2));
  EXPECT_TRUE(store.Set(7, 2, store.SecretFor(7, 2), "k", "v").ok());
}

TEST(RendezvousStore, AnAttemptThatEndedOrWasReplacedIsClosed) {
  RendezvousStore store("key");
  store.Open(7, 1);
  ASSERT_TRUE(store.Set(7, 1, store.SecretFor(7, 1), "k", "old").ok());
  // Requeued: attempt 2 starts with no keys, attempt 1's processes are shut
  // out.
  store.Open(7, 2);
  EXPECT_EQ(store.Set(7, 1, store.SecretFor(7, 1), "k", "v").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      store.Get(7, 2, store.SecretFor(7, 2), "k", 0, nullptr).status().code(),
      absl::StatusCode::kNotFound);
  store.Drop(7);
  EXPECT_EQ(store.open_jobs(), 0u);
  EXPECT_EQ(
      store.Get(7, 2, store.SecretFor(7, 2), "k", 0, nullptr).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousStore, AWaitingGetLearnsThatTheAttemptEnded) {
  RendezvousStore store("key");
  store.Open(7, 1);
  std::thread end([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store.Drop(7);
  });
  auto value = store.Get(7, 1, store.SecretFor(7, 1), "k", 10000, nullptr);
  end.join();
  EXPECT_EQ(value.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousStore, OversizedValuesAndEmptyKeysAreRefused) {
  RendezvousStore store("key");
  store.Open(7, 1);
  const std::string secret = store.SecretFor(7, 1);
  EXPECT_EQ(store.Set(7, 1, secret, "", "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store
                .Set(7, 1, secret, "big",
                     std::string(RendezvousStore::kMaxValueBytes + 1, 'x'))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store
                  .Set(7, 1, secret, "fits",
                       std::string(RendezvousStore::kMaxValueBytes, 'x'))
                  .ok());
}

}  // namespace
}  // namespace dlbatch::scheduler
