// execution_environment -> the backend a rank trains on.
#include "trainer/backend_select.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/communicator_nccl.h"

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

TEST(ChooseBackend, CpuIsTheCpuWhateverIsVisible) {
  for (int gpus : {0, 4}) {
    auto c = ChooseBackend("cpu", 4, 1, gpus, true);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->gpu);
  }
}

TEST(ChooseBackend, AutoTakesTheGpuOfASingleRankWhereOneIsVisible) {
  auto c = ChooseBackend("auto", 1, 0, 2, true);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gpu);
  EXPECT_EQ(c->device, 0);
  c = ChooseBackend("", 1, 0, 2, true);  // unset is auto
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gpu);
  for (auto [gpus, built] : {std::pair{0, true}, std::pair{2, false}}) {
    c = ChooseBackend("auto", 1, 0, gpus, built);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->gpu);
    EXPECT_EQ(c->note, "");
  }
}

TEST(ChooseBackend, AutoWithSeveralRanksTakesTheirGpusWithNcclElseTheCpu) {
  auto c = ChooseBackend("auto", 4, 2, 4, true);
  ASSERT_TRUE(c.ok());
  if (NcclBuilt()) {
    EXPECT_TRUE(c->gpu);
    EXPECT_EQ(c->device, 2);
    EXPECT_EQ(c->note, "");
  } else {
    EXPECT_FALSE(c->gpu);
    EXPECT_THAT(c->note, HasSubstr("NCCL"));
  }
}

TEST(ChooseBackend, SeveralGpuRanksNeedAGpuEachWithNccl) {
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";
  auto c = ChooseBackend("multi-gpu", 4, 3, 2, true);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("one rank per GPU"));
}

TEST(ChooseBackend, AskingForAGpuThatIsNotThereSaysWhatToChange) {
  auto c = ChooseBackend("gpu", 1, 0, 0, true);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("no CUDA device is visible"));
  EXPECT_THAT(c.status().message(), HasSubstr("use cpu or auto"));
  c = ChooseBackend("multi-gpu", 1, 0, 4, false);
  EXPECT_THAT(c.status().message(), HasSubstr("built without the GPU backend"));
  c = ChooseBackend("multi-gpu", 4, 0, 4, true);
  if (NcclBuilt()) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->gpu);
    EXPECT_EQ(c->device, 0);
  } else {
    EXPECT_THAT(c.status().message(), HasSubstr("NCCL"));
  }
  c = ChooseBackend("tpu", 1, 0, 4, true);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChooseBackend, ARankGetsTheGpuOfItsLocalRank) {
  auto c = ChooseBackend("gpu", 1, 0, 8, true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->device, 0);
  c = ChooseBackend("gpu", 1, 3, 2, true);
  EXPECT_FALSE(c.ok());
}

TEST(ChooseBackend, ThisMachineTrainsOnItsCpuUnderAuto) {
  // Holds wherever the tests run without a GPU; on a GPU machine auto takes it.
  auto c = MakeChosenBackend(BackendChoice{}, 1, false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT((*c)->Describe(), HasSubstr("cpu"));
}

}  // namespace
}  // namespace dlbatch::trainer
