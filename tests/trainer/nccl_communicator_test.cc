// The NCCL communicator.
// - NcclCommunicator.*: arguments, and a build without NCCL or a machine
//   without GPUs failing with a clear status. Run everywhere (label unit).
// - NcclCommunicatorGpu.*: collectives between ranks on GPUs, blocking and
//   started (gradient buckets) on the backend's stream (label gpu); each
//   skips, saying why, with fewer CUDA devices than it needs.
// Ranks are processes: this binary again, forked and exec'd (so no CUDA
// state crosses a fork), running only NcclRankProcess.Run with its rank,
// world and rendezvous folder in the environment. ctest never lists
// NcclRankProcess (CMake's filters leave it out).
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/communicator_nccl.h"
#include "trainer/cuda/backend_cuda.h"

extern char** environ;

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

constexpr char kRankEnv[] = "DLBATCH_NCCL_TEST_RANK";
constexpr char kWorldEnv[] = "DLBATCH_NCCL_TEST_WORLD";
constexpr char kDirEnv[] = "DLBATCH_NCCL_TEST_DIR";

// A store in memory that remembers whether anyone used it.
class MemoryRendezvous : public Rendezvous {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration /*timeout*/) override {
    ++gets_;
    auto it = values_.find(key);
    if (it == values_.end()) return absl::DeadlineExceededError(key);
    return it->second;
  }
  bool used() const { return gets_ > 0 || !values_.empty(); }

 private:
  std::map<std::string, std::string> values_;
  int gets_ = 0;
};

std::string MakeTempDir() {
  std::string tmpl = testing::TempDir() + "/nccl_test_XXXXXX";
  const char* made = mkdtemp(tmpl.data());
  return made == nullptr ? std::string() : tmpl;
}

// Buckets as training starts them, on the backend's stream: the data is
// written and doubled on that stream, summed in three uneven started
// allreduces (highest first), then halved there again once WaitAll has
// ordered the stream after them, and read back. Every value is exact.
// Returns the first failure as text; "" if none.
std::string StartedAllreducesOnTheBackendStream(Communicator& c,
                                                Backend& backend) {
  const int world = c.size();
  const int rank = c.rank();
  c.SetComputeStream(backend.native_stream());
  if (backend.native_stream() == nullptr)
    return "the GPU backend has no stream";
  constexpr int64_t kCount = (int64_t{1} << 20) + 5;
  auto buffer = backend.Allocate(kCount * sizeof(float));
  if (!buffer.ok()) return buffer.status().ToString();
  float* data = buffer->f32();
  std::vector<float> host(kCount), out(kCount);
  for (int round = 0; round < 2; ++round) {
    for (int64_t i = 0; i < kCount; ++i) host[i] = 0.5f * (rank + 1) + i % 5;
    backend.CopyToDevice(data, host.data(), kCount * sizeof(float));
    backend.Scale(kCount, 2.0f, data);
    const int64_t bounds[] = {0, 7, 300001, kCount};
    for (int b = 3; b > 0; --b) {
      absl::Status s =
          c.StartAllreduceSum(data + bounds[b - 1], bounds[b] - bounds[b - 1]);
      if (!s.ok()) return s.ToString();
    }
    absl::Status s = c.StartAllreduceSum(data, 0);
    if (!s.ok()) return s.ToString();
    if (c.StartAllreduceSum(nullptr, 3).code() !=
        absl::StatusCode::kInvalidArgument) {
      return "StartAllreduceSum took a null buffer";
    }
    s = c.WaitAll();
    if (!s.ok()) return s.ToString();
    backend.Scale(kCount, 0.5f, data);
    backend.CopyToHost(out.data(), data, kCount * sizeof(float));
    const float base = 0.25f * world * (world + 1);
    for (int64_t i = 0; i < kCount; ++i) {
      const float want = base + world * static_cast<float>(i % 5);
      if (out[i] != want) {
        return absl::StrCat("round ", round, ": element ", i, " is ", out[i],
                            ", not ", want);
      }
    }
  }
  absl::Status s = c.WaitAll();  // nothing started: nothing to wait for
  if (!s.ok()) return s.ToString();
  // A blocking collective after the compute stream's work, by event.
  backend.Fill(data, kCount, 1.0f);
  s = c.AllreduceSum(data, kCount);
  if (!s.ok()) return s.ToString();
  backend.CopyToHost(out.data(), data, kCount * sizeof(float));
  for (int64_t i = 0; i < kCount; ++i) {
    if (out[i] != static_cast<float>(world)) {
      return absl::StrCat("blocking: element ", i, " is ", out[i]);
    }
  }
  s = c.Barrier();
  c.SetComputeStream(nullptr);
  return s.ok() ? "" : s.ToString();
}

TEST(NcclCommunicator, RejectsBadArguments) {
  MemoryRendezvous rdv;
  const absl::Duration t = absl::Seconds(1);
  EXPECT_EQ(MakeNcclCommunicator(nullptr, 0, 2, 0, t).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (auto [rank, size] :
       {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    auto c = MakeNcclCommunicator(&rdv, rank, size, 0, t);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
        << c.status();
  }
  auto c = MakeNcclCommunicator(&rdv, 0, 2, -1, t);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  c = MakeNcclCommunicator(&rdv, 0, 2, 0, absl::ZeroDuration());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(rdv.used());
}

TEST(NcclCommunicator, SaysWhyWithoutNcclOrADevice) {
  const int devices = CudaDeviceCount();
  if (NcclBuilt() && devices > 0) {
    GTEST_SKIP() << "NCCL is built and " << devices
                 << " CUDA devices are visible: NcclCommunicatorGpu covers it";
  }
  MemoryRendezvous rdv;
  auto c = MakeNcclCommunicator(&rdv, 0, 2, 0, absl::Seconds(1));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_THAT(c.status().message(),
              HasSubstr(NcclBuilt() ? "is not visible" : "built without NCCL"));
  EXPECT_THAT(c.status().message(), HasSubstr("execution_environment: cpu"));
  // Nothing published that other ranks would wait on in vain.
  EXPECT_FALSE(rdv.used());
}

// This binary as rank `rank` of `world`; returns its pid (or -1).
pid_t StartRank(int rank, int world, const std::string& dir) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "DLBATCH_NCCL_TEST_", 18) != 0) env.push_back(*e);
  }
  env.push_back(absl::StrCat(kRankEnv, "=", rank));
  env.push_back(absl::StrCat(kWorldEnv, "=", world));
  env.push_back(absl::StrCat(kDirEnv, "=", dir));
  std::vector<std::string> args = {"nccl_communicator_test",
                                   "--gtest_filter=NcclRankProcess.Run"};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

// Waits for `pids` up to `limit`; kills what is left. Their exit codes, or
// -1 for one killed or not exited normally.
std::vector<int> WaitForRanks(const std::vector<pid_t>& pids,
                              std::chrono::seconds limit) {
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  size_t left = pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      done[i] = true;
      --left;
      if (WIFEXITED(status)) codes[i] = WEXITSTATUS(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    kill(pids[i], SIGKILL);
    waitpid(pids[i], nullptr, 0);
  }
  return codes;
}

TEST(NcclCommunicatorGpu, RanksAllreduceAndBroadcastDeviceArrays) {
  const int devices = CudaDeviceCount();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";
  if (devices < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices: " << devices << " visible";
  }
  const int world = std::min(devices, 4);
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = StartRank(r, world, dir);
    ASSERT_GT(pid, 0) << "fork: " << std::strerror(errno);
    pids.push_back(pid);
  }
  const std::vector<int> codes = WaitForRanks(pids, std::chrono::seconds(180));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << world
                           << " failed (its test output is above)";
  }
}

TEST(NcclCommunicatorGpu, ARankThatNeverComesEndsInAnErrorNotAHang) {
  const int devices = CudaDeviceCount();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";
  if (devices < 1) GTEST_SKIP() << "needs 1 CUDA device: 0 visible";
  MemoryRendezvous rdv;
  // A device past the visible ones is refused before the rendezvous.
  auto c = MakeNcclCommunicator(&rdv, 0, 2, devices, absl::Seconds(2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_FALSE(rdv.used());
  // Rank 1 whose rank 0 never published the id: the rendezvous times out.
  c = MakeNcclCommunicator(&rdv, 1, 2, 0, absl::Seconds(2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded)
      << c.status();
  // Rank 0 whose rank 1 never joins: ncclCommInitRankConfig times out.
  const auto start = std::chrono::steady_clock::now();
  c = MakeNcclCommunicator(&rdv, 0, 2, 0, absl::Seconds(3));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded)
      << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("ncclCommInitRankConfig"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

// One rank alone still goes through NCCL, the backend's stream and the
// events: the calls and their checks, on one GPU.
TEST(NcclCommunicatorGpu, OneRankStartsAndWaitsOnTheBackendStream) {
  const int devices = CudaDeviceCount();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";
  if (devices < 1) GTEST_SKIP() << "needs 1 CUDA device: 0 visible";
  MemoryRendezvous rdv;
  auto comm = MakeNcclCommunicator(&rdv, 0, 1, 0, absl::Seconds(60));
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ(StartedAllreducesOnTheBackendStream(**comm, **backend), "");
}

// The host's wait for device work that may wait on collectives
// (WaitOnDevice, the training loop's wait for a batch slot's upload):
// done at once when the work is, bounded by the timeout when it never is,
// and then the communicator is aborted, as after a failed collective.
TEST(NcclCommunicatorGpu, WaitOnDeviceIsBoundedAndAbortsWhenItTimesOut) {
  const int devices = CudaDeviceCount();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";
  if (devices < 1) GTEST_SKIP() << "needs 1 CUDA device: 0 visible";
  MemoryRendezvous rdv;
  // The timeout bounds NCCL's set-up too: room for a cold start.
  auto comm = MakeNcclCommunicator(&rdv, 0, 1, 0, absl::Seconds(10));
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  Backend& b = **backend;
  (*comm)->SetComputeStream(b.native_stream());

  // A real upload, waited for through its token.
  constexpr int64_t kCount = 1 << 20;
  Buffer device = *b.Allocate(kCount * sizeof(float));
  void* host = b.AllocateHost(kCount * sizeof(float));
  ASSERT_NE(host, nullptr);
  std::fill_n(static_cast<float*>(host), kCount, 3.0f);
  const uint64_t token = b.Upload(device.f32(), host, kCount * sizeof(float));
  EXPECT_TRUE(
      (*comm)
          ->WaitOnDevice([&] { return b.Uploaded(token); }, "the upload")
          .ok());
  EXPECT_TRUE(b.Uploaded(token));
  b.UseUploads();
  std::vector<float> back(kCount);
  b.CopyToHost(back.data(), device.f32(), kCount * sizeof(float));
  EXPECT_EQ(back, std::vector<float>(kCount, 3.0f));
  b.FreeHost(host);

  const auto start = std::chrono::steady_clock::now();
  const absl::Status never =
      (*comm)->WaitOnDevice([] { return false; }, "the step before last");
  EXPECT_EQ(never.code(), absl::StatusCode::kDeadlineExceeded) << never;
  EXPECT_THAT(never.message(),
              HasSubstr("the step before last did not finish"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  Buffer d = *b.Allocate(sizeof(float));
  const absl::Status after = (*comm)->AllreduceSum(d.f32(), 1);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  (*comm)->SetComputeStream(nullptr);
}

// One rank of RanksAllreduceAndBroadcastDeviceArrays, on GPU `rank`, with
// the GPU backend's buffers (so the backend's stream feeds the collectives,
// as in training).
TEST(NcclRankProcess, Run) {
  const char* rank_s = std::getenv(kRankEnv);
  const char* world_s = std::getenv(kWorldEnv);
  const char* dir = std::getenv(kDirEnv);
  if (rank_s == nullptr || world_s == nullptr || dir == nullptr) {
    GTEST_SKIP() << "a rank of NcclCommunicatorGpu's tests, which start it";
  }
  int rank = 0, world = 0;
  ASSERT_TRUE(absl::SimpleAtoi(rank_s, &rank) &&
              absl::SimpleAtoi(world_s, &world));
  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok()) << rdv.status();
  auto comm =
      MakeNcclCommunicator(rdv->get(), rank, world, rank, absl::Seconds(60));
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  EXPECT_EQ(c.rank(), rank);
  EXPECT_EQ(c.size(), world);
  auto backend = MakeCudaBackend(rank);
  ASSERT_TRUE(backend.ok()) << backend.status();

  // Odd, and large enough for NCCL to split it into several chunks. Halves
  // and small integers: every sum is exact in float.
  constexpr int64_t kCount = (int64_t{1} << 20) + 3;
  const size_t bytes = kCount * sizeof(float);
  auto buffer = (*backend)->Allocate(bytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* data = buffer->f32();
  std::vector<float> host(kCount), out(kCount);
  for (int64_t i = 0; i < kCount; ++i) host[i] = 0.5f * (rank + 1) + i % 7;
  (*backend)->CopyToDevice(data, host.data(), bytes);
  absl::Status s = c.AllreduceSum(data, kCount);
  ASSERT_TRUE(s.ok()) << s;
  (*backend)->CopyToHost(out.data(), data, bytes);
  const float base = 0.25f * world * (world + 1);
  for (int64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(out[i], base + world * static_cast<float>(i % 7)) << "at " << i;
  }

  const int root = world - 1;
  for (int64_t i = 0; i < kCount; ++i) host[i] = 1000.0f * rank + i % 13;
  (*backend)->CopyToDevice(data, host.data(), bytes);
  s = c.Broadcast(data, kCount, root);
  ASSERT_TRUE(s.ok()) << s;
  (*backend)->CopyToHost(out.data(), data, bytes);
  for (int64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(out[i], 1000.0f * root + static_cast<float>(i % 13))
        << "at " << i;
  }

  // Argument errors leave the communicator usable.
  EXPECT_EQ(c.Broadcast(data, 1, world).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllreduceSum(data, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.AllreduceSum(data, 0).ok());
  s = c.Barrier();
  EXPECT_TRUE(s.ok()) << s;

  // Gradient buckets: started on the comm stream after the backend's
  // stream, waited for with events.
  EXPECT_EQ(StartedAllreducesOnTheBackendStream(c, **backend), "");
}

}  // namespace
}  // namespace dlbatch::trainer
