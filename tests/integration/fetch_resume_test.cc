// fetch-outputs into a folder that holds some of the outputs already: a
// fetch interrupted with SIGINT goes on from its .part, a complete file is
// kept as it is, and bytes that do not hash to the output's sha256 (a
// corrupt .part, a changed file) are fetched again, through the real
// scheduler, worker and CLI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/files.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kSize = 64 << 20;  // each of the two outputs

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

int64_t SizeOf(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// One job's two outputs of random bytes, a.bin and b.bin (fetched in that
// order), stored once for all the tests, and a fetch of them into an empty
// folder to compare with.
class FetchResumeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = std::make_unique<Cluster>();
    Cluster& c = *cluster_;
    c.StartScheduler();
    c.StartWorker("w1", 1);
    ASSERT_TRUE(c.WaitWorkers(1));
    id_ = c.Submit(c.JobFile(
        "two.yaml",
        "command: [sh, -c, 'for f in a b; do head -c 67108864 /dev/urandom > "
        "$DLBATCH_OUTPUT_DIR/$f.bin || exit 1; done']\n"));
    Result wait = c.Cli({"wait", std::to_string(id_)}, {}, 120000);
    ASSERT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();
    const std::string clean = c.dir() + "/clean";
    Result fetch = c.Cli({"fetch-outputs", std::to_string(id_), "-o", clean});
    ASSERT_EQ(fetch.code, 0) << fetch.out << fetch.err;
    clean_out_ = fetch.out;
    a_ = ReadAll(clean + "/a.bin");
    b_ = ReadAll(clean + "/b.bin");
    ASSERT_EQ(static_cast<int64_t>(a_.size()), kSize);
    ASSERT_EQ(static_cast<int64_t>(b_.size()), kSize);
    ASSERT_NE(a_, b_);
  }
  static void TearDownTestSuite() { cluster_.reset(); }

  Cluster& c() { return *cluster_; }
  Result Fetch(const std::string& target) {
    return c().Cli({"fetch-outputs", std::to_string(id_), "-o", target});
  }
  // Both outputs are in `target`, byte for byte, and nothing else.
  void ExpectComplete(const std::string& target) {
    EXPECT_EQ(Names(target), (std::vector<std::string>{"a.bin", "b.bin"}));
    EXPECT_TRUE(ReadAll(target + "/a.bin") == a_);
    EXPECT_TRUE(ReadAll(target + "/b.bin") == b_);
  }

  // Runs `dlbatch fetch-outputs` into `target`, its stdout and stderr to
  // `log`, and stops it (SIGSTOP) once a.bin is complete and b.bin.part
  // holds bytes: stopped, it writes no more. Returns its pid, or -1 where
  // it got to the end of b.bin before it was stopped (it is reaped then).
  pid_t FetchStoppedInB(const std::string& target, const std::string& log) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    for (const auto& [k, v] : c().CliEnv()) argv.push_back(k + "=" + v);
    for (const std::string& a :
         c().CliArgv({"fetch-outputs", std::to_string(id_), "-o", target})) {
      argv.push_back(a);
    }
    const pid_t pid = SpawnLogged(argv, log);
    const std::string part = target + "/b.bin.part";
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int status = 0;
    while (SizeOf(part) <= 0) {
      if (::waitpid(pid, &status, WNOHANG) == pid) return -1;  // it ended
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        ADD_FAILURE() << "no b.bin.part in 60 s: " << ReadAll(log);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    ::kill(pid, SIGSTOP);
    // Once reported stopped, every thread of it is.
    if (::waitpid(pid, &status, WUNTRACED) != pid || !WIFSTOPPED(status)) {
      return -1;  // it ended before the signal
    }
    if (SizeOf(target + "/b.bin") >= 0) {  // b.bin done just before
      ::kill(pid, SIGKILL);
      ::kill(pid, SIGCONT);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    EXPECT_EQ(SizeOf(target + "/a.bin"), kSize);
    return pid;
  }

  // FetchStoppedInB, tried again while the stop comes too late.
  pid_t FetchStoppedInBSurely(const std::string& target,
                              const std::string& log) {
    pid_t pid = -1;
    for (int attempt = 0; attempt < 5 && pid < 0; ++attempt) {
      fs::remove_all(target);
      pid = FetchStoppedInB(target, log);
    }
    return pid;
  }

  static std::unique_ptr<Cluster> cluster_;
  static int64_t id_;
  static std::string a_, b_;      // the outputs' bytes
  static std::string clean_out_;  // what the fetch into an empty folder said
};

std::unique_ptr<Cluster> FetchResumeTest::cluster_;
int64_t FetchResumeTest::id_ = 0;
std::string FetchResumeTest::a_, FetchResumeTest::b_,
    FetchResumeTest::clean_out_;

// A fetch interrupted in the second file: the next one keeps the first
// (same inode, same mtime) and asks only for the rest of the second.
TEST_F(FetchResumeTest, AnInterruptedFetchGoesOnWhereItStopped) {
  EXPECT_THAT(clean_out_,
              HasSubstr("2 files: 2 fetched (" + HumanBytes(2 * kSize) +
                        "), 0 resumed, 0 skipped"));
  const std::string target = c().dir() + "/interrupted";
  const pid_t pid = FetchStoppedInBSurely(target, c().dir() + "/sigint.log");
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGINT);
  ::kill(pid, SIGCONT);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  const int64_t part = SizeOf(target + "/b.bin.part");
  ASSERT_GT(part, 0);
  ASSERT_LT(part, kSize);
  // SIGINT left the part for the next fetch.
  EXPECT_EQ(Names(target), (std::vector<std::string>{"a.bin", "b.bin.part"}));
  EXPECT_TRUE(ReadAll(target + "/b.bin.part") == b_.substr(0, part));
  struct stat before, after;
  ASSERT_EQ(::stat((target + "/a.bin").c_str(), &before), 0);

  Result again = Fetch(target);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  // Only the bytes b.bin lacked came.
  EXPECT_THAT(again.out,
              HasSubstr("2 files: 0 fetched (0 B), 1 resumed at " +
                        HumanBytes(part) + " (" + HumanBytes(kSize - part) +
                        " received), 1 skipped; sha256 verified, into " +
                        target + "/\n"))
      << again.out;
  EXPECT_THAT(again.out,
              HasSubstr("a.bin: skipped, already here with the same sha256"));
  EXPECT_THAT(again.out, HasSubstr("b.bin: resumed at " + HumanBytes(part)));
  ASSERT_EQ(::stat((target + "/a.bin").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  ExpectComplete(target);  // no .part left

  // Once more: nothing comes.
  Result third = Fetch(target);
  ASSERT_EQ(third.code, 0) << third.out << third.err;
  EXPECT_THAT(third.out, HasSubstr("2 files: 0 fetched (0 B), 0 resumed, "
                                   "2 skipped"));
  ExpectComplete(target);
}

// The scheduler restarts while b.bin comes: the CLI waits for it
// (--retry-for) and goes on from b.bin.part, so no byte comes twice.
TEST_F(FetchResumeTest, ASchedulerRestartMidFetchGoesOnFromThePart) {
  const std::string target = c().dir() + "/restart";
  const std::string log = c().dir() + "/restart.log";
  const pid_t pid = FetchStoppedInBSurely(target, log);
  ASSERT_GT(pid, 0);
  const int64_t part = SizeOf(target + "/b.bin.part");
  c().KillScheduler(SIGKILL);
  ::kill(pid, SIGCONT);
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadAll(log).find("retrying for up to") != std::string::npos;
      },
      20000))
      << ReadAll(log);
  // Cut off, the part is kept, with what came before the cut.
  EXPECT_GE(SizeOf(target + "/b.bin.part"), part);
  c().StartScheduler();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string said = ReadAll(log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << said;
  EXPECT_THAT(said, HasSubstr("2 files: 2 fetched (" + HumanBytes(2 * kSize) +
                              "), 0 resumed, 0 skipped"));
  ExpectComplete(target);
}

// Parts whose bytes are not the output's: one corrupt, one longer than the
// output. The corrupt one is found out by the sha256 and fetched again from
// 0, said so; a sound part that ends mid-block is gone on from.
TEST_F(FetchResumeTest, ACorruptPartIsFetchedAgainFromZero) {
  const std::string target = c().dir() + "/corrupt";
  fs::create_directories(target);
  std::string bad = b_.substr(0, 20 << 20);
  bad[12345] ^= 0x01;
  WriteAll(target + "/b.bin.part", bad);
  const int64_t kept = 10'000'001;  // not a whole number of blocks
  WriteAll(target + "/a.bin.part", a_.substr(0, kept));

  Result fetch = Fetch(target);
  ASSERT_EQ(fetch.code, 0) << fetch.out << fetch.err;
  // b.bin: the rest after the part, then all of it.
  const std::string b_received =
      HumanBytes(kSize - static_cast<int64_t>(bad.size()) + kSize);
  EXPECT_THAT(fetch.out,
              HasSubstr("2 files: 1 fetched (" + b_received +
                        "), 1 resumed at " + HumanBytes(kept) + " (" +
                        HumanBytes(kSize - kept) + " received), 0 skipped"))
      << fetch.out;
  EXPECT_THAT(fetch.out,
              HasSubstr("b.bin: fetched, " + b_received + "; the " +
                        HumanBytes(static_cast<int64_t>(bad.size())) +
                        " kept from an earlier fetch (b.bin.part) did not "
                        "match the sha256, so all of it was fetched again"))
      << fetch.out;
  ExpectComplete(target);

  // A part longer than the output is no part of it: from 0.
  const std::string longer = c().dir() + "/longer";
  fs::create_directories(longer);
  WriteAll(longer + "/a.bin.part", a_ + "x");
  Result fetch2 = Fetch(longer);
  ASSERT_EQ(fetch2.code, 0) << fetch2.out << fetch2.err;
  EXPECT_THAT(fetch2.out,
              HasSubstr("2 files: 2 fetched (" + HumanBytes(2 * kSize) +
                        "), 0 resumed, 0 skipped"))
      << fetch2.out;
  ExpectComplete(longer);
}

// Files already there with other bytes (one changed, one cut short) are
// replaced; a copy of the right size is hashed, not trusted on its size.
TEST_F(FetchResumeTest, ACompleteFileWithOtherBytesIsFetchedAgain) {
  const std::string target = c().dir() + "/changed";
  fs::create_directories(target);
  std::string changed = a_;
  changed[kSize - 1] ^= 0x80;
  WriteAll(target + "/a.bin", changed);
  WriteAll(target + "/b.bin", b_.substr(0, kSize / 2));

  Result fetch = Fetch(target);
  ASSERT_EQ(fetch.code, 0) << fetch.out << fetch.err;
  EXPECT_THAT(fetch.out,
              HasSubstr("2 files: 2 fetched (" + HumanBytes(2 * kSize) +
                        "), 0 resumed, 0 skipped"))
      << fetch.out;
  EXPECT_THAT(fetch.out,
              HasSubstr("a.bin: fetched, " + HumanBytes(kSize) +
                        "; it replaces a copy here with other bytes"));
  EXPECT_THAT(fetch.out,
              HasSubstr("b.bin: fetched, " + HumanBytes(kSize) +
                        "; it replaces a copy here with other bytes"));
  ExpectComplete(target);
}

}  // namespace
}  // namespace dlbatch::testing
