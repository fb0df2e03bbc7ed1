// The credential table (tokens found by their hash) and the registry that
// ends a revoked credential's open calls.
#include "scheduler/rpc/credentials.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace dlbatch::scheduler {
namespace {

CredentialRecord Record(const std::string& name, const std::string& token,
                        bool worker = false) {
  CredentialRecord r;
  r.name = name;
  r.worker = worker;
  r.token_sha256 = TokenSha256(token);
  return r;
}

TEST(Credentials, NewTokensAreDistinctAndSayTheirKind) {
  auto user = NewToken(false);
  auto worker = NewToken(true);
  ASSERT_TRUE(user.ok() && worker.ok());
  EXPECT_EQ(user->substr(0, 5), "dlbu_");
  EXPECT_EQ(worker->substr(0, 5), "dlbw_");
  EXPECT_EQ(user->size(), 5u + 64u);
  EXPECT_NE(user->substr(5), worker->substr(5));
  EXPECT_EQ(TokenSha256("abc").size(), 64u);
}

TEST(Credentials, NamesAreLoginLike) {
  EXPECT_TRUE(CheckCredentialName("alice").ok());
  EXPECT_TRUE(CheckCredentialName("gpu-nodes.rack_2").ok());
  for (const char* bad : {"", "-rf", "a b", "a/b", "é", "x;y"}) {
    EXPECT_FALSE(CheckCredentialName(bad).ok()) << bad;
  }
  EXPECT_FALSE(CheckCredentialName(std::string(65, 'a')).ok());
}

TEST(CredentialTable, FindsByTokenAndForgetsRemovedOrReplacedOnes) {
  CredentialTable table;
  EXPECT_TRUE(table.empty());
  table.Reset({Record("alice", "ta"), Record("nodes", "tw", true)});
  ASSERT_TRUE(table.FindByToken("ta").has_value());
  EXPECT_EQ(table.FindByToken("ta")->name, "alice");
  EXPECT_EQ(table.FindByToken("ta")->Key(), "user:alice");
  EXPECT_EQ(table.FindByToken("tw")->Key(), "worker:nodes");
  EXPECT_FALSE(table.FindByToken("t").has_value());
  EXPECT_FALSE(table.FindByToken("").has_value());
  // A name holds one token: a new one replaces the old.
  table.Put(Record("alice", "ta2"));
  EXPECT_FALSE(table.FindByToken("ta").has_value());
  EXPECT_TRUE(table.FindByToken("ta2").has_value());
  // A user and a worker credential of one name are apart.
  table.Remove("nodes", /*worker=*/false);
  EXPECT_TRUE(table.FindByToken("tw").has_value());
  table.Remove("nodes", /*worker=*/true);
  EXPECT_FALSE(table.FindByToken("tw").has_value());
}

TEST(CredentialTable, OneJobCredentialsAreTheirJobsAlone) {
  auto token = NewJobToken();
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->substr(0, 5), "dlbj_");
  EXPECT_EQ(token->size(), 5u + 64u);
  CredentialTable table;
  // A worker credential that happens to be named like a job's.
  CredentialRecord named;
  named.name = "job-7";
  named.worker = true;
  named.token_sha256 = TokenSha256("dlbw_named");
  table.Put(named);
  table.Put(JobCredential(7, TokenSha256(*token)));
  auto found = table.FindByToken(*token);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->job_id, 7);
  EXPECT_TRUE(found->worker);
  EXPECT_FALSE(found->admin);
  EXPECT_EQ(found->Key(), "job:7");
  // Neither replaces nor removes the other.
  ASSERT_TRUE(table.FindByToken("dlbw_named").has_value());
  EXPECT_EQ(table.FindByToken("dlbw_named")->Key(), "worker:job-7");
  table.Remove("job-7", /*worker=*/true);
  EXPECT_FALSE(table.FindByToken("dlbw_named").has_value());
  EXPECT_TRUE(table.FindByToken(*token).has_value());
  table.RemoveJob(7);
  EXPECT_FALSE(table.FindByToken(*token).has_value());
}

TEST(OpenCalls, EndAllEndsOnlyThatCredentialsCallsOnce) {
  OpenCalls calls;
  int a = 0, b = 0;
  int64_t a1 = calls.Add("user:alice", [&] { ++a; });
  calls.Add("user:alice", [&] { ++a; });
  calls.Add("user:bob", [&] { ++b; });
  calls.Remove(a1);  // done before the revoke: not ended
  EXPECT_EQ(calls.EndAll("user:alice"), 1);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(calls.EndAll("user:alice"), 0);
  EXPECT_EQ(a, 1);
}

TEST(OpenCalls, AnEndThatRemovesItsOwnCallDoesNotDeadlock) {
  // gRPC may run a cancelled reactor's OnDone inline, which removes it.
  OpenCalls calls;
  int64_t id = 0;
  bool ended = false;
  id = calls.Add("user:alice", [&] {
    ended = true;
    calls.Remove(id);
  });
  EXPECT_EQ(calls.EndAll("user:alice"), 1);
  EXPECT_TRUE(ended);
}

TEST(OpenCalls, RemoveWaitsForAnEndRunningOnAnotherThread) {
  OpenCalls calls;
  std::atomic<bool> in_end{false}, release{false}, removed{false};
  int64_t id = calls.Add("user:alice", [&] {
    in_end = true;
    while (!release) std::this_thread::yield();
  });
  std::thread revoker([&] { calls.EndAll("user:alice"); });
  while (!in_end) std::this_thread::yield();
  std::thread done([&] {
    calls.Remove(id);
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed) << "the call's state must outlive its end";
  release = true;
  revoker.join();
  done.join();
  EXPECT_TRUE(removed);
}

}  // namespace
}  // namespace dlbatch::scheduler
