// execution_environment -> the backend a rank trains on.
#include "trainer/backend_select.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/thread_ranks.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

// A process with `visible` GPUs and the GPU backend loaded (with NCCL where
// `nccl`); or, where `loaded` is false, without it for the reason given.
GpuSupport Gpus(int visible, bool nccl = true, bool loaded = true) {
  GpuSupport g;
  g.visible_gpus = visible;
  g.nccl = nccl;
  g.backend = loaded ? absl::OkStatus()
                     : absl::NotFoundError(
                           "the GPU backend is not installed (no "
                           "libdlbatch-gpu.so): install the dlbatch-gpu "
                           "package");
  return g;
}

TEST(ChooseBackend, CpuIsTheCpuWhateverIsVisible) {
  for (int gpus : {0, 4}) {
    auto c = ChooseBackend("cpu", 4, 4, 1, Gpus(gpus));
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->gpu);
  }
}

TEST(ChooseBackend, AutoTakesTheGpuOfASingleRankWhereOneIsVisible) {
  auto c = ChooseBackend("auto", 1, 1, 0, Gpus(2));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gpu);
  EXPECT_EQ(c->device, 0);
  c = ChooseBackend("", 1, 1, 0, Gpus(2));  // unset is auto
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gpu);
  c = ChooseBackend("auto", 1, 1, 0, Gpus(0));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->gpu);
  EXPECT_EQ(c->note, "");
  // No GPU backend and no GPU (a machine without CUDA): the CPU, nothing
  // to say.
  c = ChooseBackend("auto", 1, 1, 0, Gpus(0, false, false));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->gpu);
  EXPECT_EQ(c->note, "");
}

// GPUs the driver sees, but a GPU backend that is not there (or does not
// load): auto trains on the CPU and says why, with what to install.
TEST(ChooseBackend, AutoSaysWhyItLeavesVisibleGpusIdle) {
  auto c = ChooseBackend("auto", 1, 1, 0, Gpus(2, true, false));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->gpu);
  EXPECT_THAT(c->note, HasSubstr("2 GPU(s) visible"));
  EXPECT_THAT(c->note, HasSubstr("install the dlbatch-gpu package"));
  EXPECT_THAT(c->note, HasSubstr("training on the CPU"));
}

TEST(ChooseBackend, AutoWithSeveralRanksTakesTheirGpusWithNcclElseTheCpu) {
  auto c = ChooseBackend("auto", 4, 4, 2, Gpus(4));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gpu);
  EXPECT_EQ(c->device, 2);
  EXPECT_EQ(c->note, "");
  c = ChooseBackend("auto", 4, 4, 2, Gpus(4, /*nccl=*/false));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->gpu);
  EXPECT_THAT(c->note, HasSubstr("NCCL"));
}

TEST(ChooseBackend, SeveralGpuRanksNeedAGpuEachWithNccl) {
  auto c = ChooseBackend("multi-gpu", 4, 4, 3, Gpus(2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("one rank per GPU"));
}

TEST(ChooseBackend, AskingForAGpuThatIsNotThereSaysWhatToChange) {
  auto c = ChooseBackend("gpu", 1, 1, 0, Gpus(0));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("no CUDA device is visible"));
  EXPECT_THAT(c.status().message(), HasSubstr("use cpu or auto"));
  // Without the GPU backend, its reason: what to install.
  for (int gpus : {0, 4}) {
    c = ChooseBackend("multi-gpu", 1, 1, 0, Gpus(gpus, true, false));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(c.status().message(),
                HasSubstr("asks for a GPU, but the GPU backend is not "
                          "installed"));
    EXPECT_THAT(c.status().message(),
                HasSubstr("install the dlbatch-gpu package"));
    EXPECT_THAT(c.status().message(), HasSubstr("use cpu or auto"));
  }
  c = ChooseBackend("multi-gpu", 4, 4, 0, Gpus(4));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu);
  EXPECT_EQ(c->device, 0);
  c = ChooseBackend("multi-gpu", 4, 4, 0, Gpus(4, /*nccl=*/false));
  EXPECT_THAT(c.status().message(), HasSubstr("NCCL"));
  c = ChooseBackend("tpu", 1, 1, 0, Gpus(4));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChooseBackend, ARankGetsTheGpuOfItsLocalRank) {
  auto c = ChooseBackend("gpu", 1, 1, 0, Gpus(8));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->device, 0);
  c = ChooseBackend("gpu", 1, 1, 3, Gpus(2));
  EXPECT_FALSE(c.ok());
}

// A job over two machines of two GPUs each (pool 4): each machine has a
// GPU per rank, so auto takes them; before, 4 ranks against 2 GPUs seen
// sent the whole job to the CPUs.
TEST(ChooseBackend, AutoOverMachinesTakesEachMachinesGpus) {
  auto c = ChooseBackend("auto", 4, 2, 1, Gpus(2));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu);
  EXPECT_EQ(c->device, 1);
  // Without NCCL several ranks never take GPUs.
  c = ChooseBackend("auto", 4, 2, 1, Gpus(2, /*nccl=*/false));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->gpu);
  EXPECT_THAT(c->note, HasSubstr("need NCCL"));
  c = ChooseBackend("auto", 4, 3, 1, Gpus(2));  // 3 ranks here, 2 GPUs
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->gpu);
  EXPECT_THAT(c->note,
              HasSubstr("3 rank(s) on this machine and 2 visible GPU(s)"));
}

// This process's: a CPU run never looks for the GPU backend; the backend's
// answer is the module's (loaded beside this test where the build made it).
TEST(GpuSupportHere, CpuLooksForNothingAndGpuAsksTheModule) {
  GpuSupport cpu = GpuSupportHere("cpu");
  EXPECT_FALSE(cpu.backend.ok());
  EXPECT_EQ(cpu.visible_gpus, 0);
  GpuSupport gpu = GpuSupportHere("gpu");
  EXPECT_EQ(gpu.backend.ok(), GpuBackendBuilt()) << gpu.backend;
  EXPECT_EQ(gpu.backend, GpuBackendStatus());
  if (!gpu.backend.ok()) {
    EXPECT_EQ(gpu.visible_gpus, 0);
    EXPECT_THAT(std::string(gpu.backend.message()),
                ::testing::AnyOf(HasSubstr("built without the GPU backend"),
                                 HasSubstr("install")));
  }
}

// Ranks as threads over a folder rendezvous: each returns what
// AgreeOnBackend gives it from its own choice.
std::vector<absl::StatusOr<BackendChoice>> Agree(
    const std::string& environment, const std::vector<BackendChoice>& mine,
    absl::Duration timeout) {
  const int world = static_cast<int>(mine.size());
  std::vector<absl::StatusOr<BackendChoice>> got(world,
                                                 absl::UnknownError("not run"));
  testing::RunRendezvousRanks(world, [&](int rank, Rendezvous* rdv) {
    got[rank] =
        AgreeOnBackend(environment, rdv, rank, world, mine[rank], timeout);
    return got[rank].status();
  });
  return got;
}

BackendChoice Gpu(int device) { return BackendChoice{true, device, ""}; }

TEST(AgreeOnBackend, EveryRankOnItsGpuWhereEachHasOne) {
  auto got = Agree("auto", {Gpu(0), Gpu(1), Gpu(0), Gpu(1)}, absl::Seconds(30));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_TRUE(got[r]->gpu) << r;
    EXPECT_EQ(got[r]->device, r % 2);
  }
}

// One machine without GPUs for its ranks: all train on CPUs (NCCL and Gloo
// do not meet), and the note says which rank had none.
TEST(AgreeOnBackend, OneRankWithoutAGpuTakesEveryRankToTheCpu) {
  BackendChoice cpu;
  cpu.note =
      "2 rank(s) on this machine and 0 visible GPU(s): training on the CPU";
  auto got = Agree("", {Gpu(0), Gpu(1), cpu, cpu}, absl::Seconds(30));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_FALSE(got[r]->gpu) << r;
    EXPECT_THAT(got[r]->note,
                HasSubstr("rank 2: 2 rank(s) on this machine and 0 visible"));
    EXPECT_THAT(got[r]->note, HasSubstr("every rank trains on the CPU"));
  }
}

// No GPU anywhere: the CPU, without a note (nothing was left idle).
TEST(AgreeOnBackend, NoGpuAnywhereIsTheCpuWithoutAWord) {
  auto got = Agree("auto", {BackendChoice{}, BackendChoice{}, BackendChoice{}},
                   absl::Seconds(30));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_FALSE(got[r]->gpu);
    EXPECT_EQ(got[r]->note, "");
  }
  // GPUs on some machines only: those ranks say so, naming the first rank
  // without.
  got = Agree("auto", {Gpu(0), BackendChoice{}}, absl::Seconds(30));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_FALSE(got[r]->gpu);
    EXPECT_THAT(got[r]->note, HasSubstr("rank 1: no GPU usable"));
  }
}

// Only auto decides together; an environment that names the device, or a
// single rank, keeps its own choice without a word exchanged (no
// rendezvous given).
TEST(AgreeOnBackend, OnlyAutoWithSeveralRanksExchangesChoices) {
  for (const char* environment : {"gpu", "multi-gpu", "cpu"}) {
    auto c =
        AgreeOnBackend(environment, nullptr, 1, 4, Gpu(1), absl::Seconds(1));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->gpu);
  }
  auto c = AgreeOnBackend("auto", nullptr, 0, 1, Gpu(0), absl::Seconds(1));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu);
}

// A rank that never comes: rank 0 gives up after the timeout, naming it.
TEST(AgreeOnBackend, ARankThatNeverComesIsAnErrorNamingIt) {
  const std::string dir =
      ::testing::TempDir() + "/agree-missing-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto rdv = OpenFileRendezvous(dir);
  ASSERT_TRUE(rdv.ok()) << rdv.status();
  auto c =
      AgreeOnBackend("auto", rdv->get(), 0, 2, Gpu(0), absl::Milliseconds(300));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded)
      << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("backend-rank1"));
  std::filesystem::remove_all(dir);
}

TEST(ChooseBackend, ThisMachineTrainsOnItsCpuUnderAuto) {
  // Holds wherever the tests run without a GPU; on a GPU machine auto takes it.
  auto c = MakeChosenBackend(BackendChoice{}, 1, "fp32");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT((*c)->Describe(), HasSubstr("cpu"));
}

// precision: bf16 and fp16 on the GPU are no longer refused as unbuilt:
// with a GPU they make a backend computing in them (fp16 asking for loss
// scaling); without one the error is the missing device's.
TEST(MakeChosenBackend, Bf16AndFp16RunOnTheGpu) {
  BackendChoice gpu;
  gpu.gpu = true;
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    auto b = MakeChosenBackend(gpu, 1, precision);
    if (!b.ok()) {
      EXPECT_THAT(std::string(b.status().message()),
                  ::testing::Not(HasSubstr("not implemented")));
      if (b.status().code() == absl::StatusCode::kFailedPrecondition) {
        // A GPU without the tensor cores (GpuLowPrecisionSupport).
        EXPECT_THAT(std::string(b.status().message()),
                    HasSubstr("compute capability"));
      } else {
        // No device (UNAVAILABLE), or no GPU backend (NOT_FOUND).
        EXPECT_THAT(b.status().code(),
                    ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                     absl::StatusCode::kNotFound))
            << b.status();
      }
      continue;
    }
    EXPECT_TRUE((*b)->on_gpu());
    EXPECT_THAT((*b)->Describe(), HasSubstr(precision));
    EXPECT_EQ((*b)->scales_loss(), std::string(precision) == "fp16");
  }
}

TEST(MakeChosenBackend, Fp16IsStillRefusedOnTheCpu) {
  auto b = MakeChosenBackend(BackendChoice{}, 1, "fp16");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("precision: fp16 runs on GPUs only"));
  auto fp32 = MakeChosenBackend(BackendChoice{}, 1, "fp32");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_FALSE((*fp32)->scales_loss());
}

TEST(GpuLowPrecisionSupport, Bf16NeedsAmpereAndFp16Volta) {
  EXPECT_TRUE(GpuLowPrecisionSupport(true, 0, "NVIDIA A100", 8, 0).ok());
  EXPECT_TRUE(GpuLowPrecisionSupport(true, 0, "NVIDIA H100", 9, 0).ok());
  EXPECT_TRUE(GpuLowPrecisionSupport(false, 0, "Tesla V100", 7, 0).ok());

  absl::Status s = GpuLowPrecisionSupport(true, 1, "Tesla V100-SXM2", 7, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "precision: bf16 needs a GPU with bf16 tensor cores (compute "
            "capability 8.0 or later), but gpu 1 (Tesla V100-SXM2) has "
            "compute capability 7.0; use precision: fp16 (with loss scaling) "
            "or precision: fp32 on it");
  s = GpuLowPrecisionSupport(true, 0, "Tesla P100", 6, 0);
  EXPECT_THAT(std::string(s.message()), HasSubstr("; use precision: fp32"));
  s = GpuLowPrecisionSupport(false, 0, "Tesla P100", 6, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("precision: fp16 needs a GPU with fp16 tensor cores "
                        "(compute capability 7.0 or later)"));
}

}  // namespace
}  // namespace dlbatch::trainer
