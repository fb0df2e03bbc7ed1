#include "scheduler/store/blob_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMB = 1000 * 1000;

class BlobSpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-blobs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::unique_ptr<BlobStore> Open(int64_t min_free) {
    auto store =
        BlobStore::Open(root_ + "/blobs", min_free,
                        [this]() -> absl::StatusOr<int64_t> { return free_; });
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  std::string root_;
  int64_t free_ = 1000 * kMB;
};

// Two 600 MB uploads on a disk with 1 GB free each passed the check alone,
// then both failed for want of space: the second is refused up front.
TEST_F(BlobSpaceTest, SpaceForUploadsInFlightIsReserved) {
  auto store = Open(64 * kMB);
  auto first = store->NewWriter("", 600 * kMB);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(store->reserved_bytes(), 600 * kMB);

  auto second = store->NewWriter("", 600 * kMB);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("600.0 MB"));
  EXPECT_THAT(second.status().message(), HasSubstr("1.0 GB free"));
  EXPECT_THAT(second.status().message(), HasSubstr("promised to uploads"));

  // Bytes written leave the reservation (statvfs sees them instead).
  ASSERT_TRUE((*first)->Append(std::string(1000, 'x')).ok());
  EXPECT_EQ(store->reserved_bytes(), 600 * kMB - 1000);
  // A writer dropped unfinished gives the rest back.
  first->reset();
  EXPECT_EQ(store->reserved_bytes(), 0);
  EXPECT_TRUE(store->NewWriter("", 600 * kMB).ok());
  EXPECT_EQ(store->reserved_bytes(), 0);  // that one was dropped at once
}

TEST_F(BlobSpaceTest, TheReserveIsKeptFree) {
  auto store = Open(500 * kMB);
  EXPECT_TRUE(store->NewWriter("", 499 * kMB).ok());
  auto refused = store->NewWriter("", 501 * kMB);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(BlobSpaceTest, AnUnnamedUploadLearnsItsDigest) {
  auto store = Open(0);
  auto w = store->NewWriter("", 5);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("hel").ok());
  ASSERT_TRUE((*w)->Append("lo").ok());
  ASSERT_TRUE((*w)->Commit().ok());
  const std::string sha = Sha256Hex("hello");
  EXPECT_EQ((*w)->sha256(), sha);
  EXPECT_EQ(*store->Size(sha), 5);
  EXPECT_EQ(store->reserved_bytes(), 0);
  struct stat st;
  ASSERT_EQ(stat(store->PathFor(sha).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(BlobSpaceTest, ANamedUploadMustMatchItsName) {
  auto store = Open(0);
  auto w = store->NewWriter(Sha256Hex("hello"), 5);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("jello").ok());
  absl::Status s = (*w)->Commit();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(store->Size(Sha256Hex("hello")).ok());
  EXPECT_FALSE(store->Size(Sha256Hex("jello")).ok());
  // Longer than announced is refused as it arrives.
  auto longer = store->NewWriter("", 2);
  ASSERT_TRUE(longer.ok());
  EXPECT_FALSE((*longer)->Append("abc").ok());
}

// Large blobs go past the page cache in aligned blocks, the tail through
// it: pieces of odd sizes, across the staging buffers' edges, must come out
// byte for byte, on a disk and on tmpfs.
TEST_F(BlobSpaceTest, ALargeBlobKeepsEveryByteWhateverThePieces) {
  std::string data(kDirectWriteMinBytes * 2 + 12345, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : data) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  for (const std::string& dir : {root_ + "/disk", std::string("/dev/shm")}) {
    std::string base = dir;
    if (dir == "/dev/shm") {
      char tmpl[] = "/dev/shm/dlbatch-blobs-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) continue;  // no tmpfs here
      base = tmpl;
    }
    auto store = BlobStore::Open(base + "/blobs", 0);
    ASSERT_TRUE(store.ok()) << store.status();
    auto w = (*store)->NewWriter("", static_cast<int64_t>(data.size()));
    ASSERT_TRUE(w.ok()) << w.status();
    size_t at = 0;
    for (size_t piece = 1; at < data.size(); piece = piece * 3 + 7) {
      const size_t n = std::min(piece % (5 << 20), data.size() - at);
      ASSERT_TRUE((*w)->Append(absl::string_view(data).substr(at, n)).ok());
      at += n;
    }
    ASSERT_TRUE((*w)->Commit().ok());
    EXPECT_EQ((*w)->sha256(), Sha256Hex(data)) << dir;
    auto back = ReadFile((*store)->PathFor((*w)->sha256()));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == data) << dir << ": the stored bytes differ";
    EXPECT_EQ((*store)->reserved_bytes(), 0);
    std::filesystem::remove_all(base);
  }
}

// Dropped mid-way with a buffer being written: nothing is left behind.
TEST_F(BlobSpaceTest, ALargeUploadDroppedMidwayLeavesNothing) {
  auto store = Open(0);
  {
    auto w = store->NewWriter("", 64 << 20);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(std::string(9 << 20, 'q')).ok());
  }
  EXPECT_EQ(store->reserved_bytes(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/blobs/tmp"));
}

TEST_F(BlobSpaceTest, ModesArePrivateWhateverTheUmaskAndTheOldFolder) {
  std::filesystem::create_directories(root_ + "/blobs/ab");
  chmod((root_ + "/blobs").c_str(), 0755);
  chmod((root_ + "/blobs/ab").c_str(), 0777);
  mode_t old = umask(0);
  auto store = Open(0);
  auto w = store->NewWriter("", 1);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("z").ok());
  ASSERT_TRUE((*w)->Commit().ok());
  umask(old);
  struct stat st;
  ASSERT_EQ(stat((root_ + "/blobs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((root_ + "/blobs/ab").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::string path = store->PathFor((*w)->sha256());
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(std::filesystem::path(path).parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

}  // namespace
}  // namespace dlbatch::scheduler
