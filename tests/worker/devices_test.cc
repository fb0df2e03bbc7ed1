// The GPUs a worker hands a job: CUDA_VISIBLE_DEVICES in the numbering of
// the worker's own view, which under a CUDA_VISIBLE_DEVICES of its own (a
// node's GPUs shared out between workers) is not the machine's.
#include "worker/devices.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

TEST(ChildVisibleDevices, WithoutAListOfItsOwnAWorkerNamesTheMachinesOrdinals) {
  absl::StatusOr<std::string> v =
      ChildVisibleDevices(std::vector<int32_t>{2, 0}, nullptr);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "2,0");
  v = ChildVisibleDevices(std::vector<int32_t>{}, nullptr);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "");
}

TEST(ChildVisibleDevices, UnderAListOfItsOwnGpuIIsThatListsIthEntry) {
  // A worker given the machine's GPUs 6 and 7 numbers them 0 and 1.
  absl::StatusOr<std::string> v =
      ChildVisibleDevices(std::vector<int32_t>{1}, "6,7");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "7");
  v = ChildVisibleDevices(std::vector<int32_t>{1, 0}, "6,7");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "7,6");
  // UUIDs and MIG instances pass through as written, spaces trimmed.
  v = ChildVisibleDevices(std::vector<int32_t>{0, 2},
                          "GPU-8f3c2d1e-0000-4a5b-9c6d-1234567890ab, 3 "
                          ",MIG-1a2b3c4d-5e6f-7a8b-9c0d-"
                          "112233445566");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v,
            "GPU-8f3c2d1e-0000-4a5b-9c6d-1234567890ab,MIG-1a2b3c4d-5e6f-7a8b-"
            "9c0d-112233445566");
}

TEST(ChildVisibleDevices,
     AGpuBeyondTheWorkersOwnListIsAnErrorThatSaysWhatToDo) {
  for (const char* inherited : {"4", "4,,5", ""}) {
    SCOPED_TRACE(inherited);
    absl::StatusOr<std::string> v =
        ChildVisibleDevices(std::vector<int32_t>{1}, inherited);
    ASSERT_FALSE(v.ok()) << *v;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(v.status().message().find(
                  "GPU 1 is not in its own CUDA_VISIBLE_DEVICES"),
              std::string::npos)
        << v.status();
    EXPECT_NE(v.status().message().find("restart the worker"),
              std::string::npos)
        << v.status();
  }
  EXPECT_FALSE(ChildVisibleDevices(std::vector<int32_t>{-1}, "0").ok());
}

}  // namespace
}  // namespace dlbatch::worker
