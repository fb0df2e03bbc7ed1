#include "client/outputs_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::client {
namespace {

TEST(CheckOutputPath, OnlyPlainRelativePaths) {
  EXPECT_TRUE(CheckOutputPath("model.bin").ok());
  EXPECT_TRUE(CheckOutputPath("sub/dir/file").ok());
  EXPECT_TRUE(CheckOutputPath("..hidden").ok());
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a/..",
                          "a//b", "./a", "a/", "a/./b"}) {
    EXPECT_FALSE(CheckOutputPath(bad).ok()) << bad;
  }
}

TEST(CheckSymlinkTarget, InsideOnly) {
  EXPECT_TRUE(CheckSymlinkTarget("latest", "ckpt-100").ok());
  EXPECT_TRUE(CheckSymlinkTarget("a/link", "../b/file").ok());
  EXPECT_TRUE(CheckSymlinkTarget("a/b/link", "../../top").ok());
  EXPECT_TRUE(CheckSymlinkTarget("a/link", "./file").ok());
  EXPECT_TRUE(CheckSymlinkTarget("a/link", "..").ok());  // the outputs
  EXPECT_FALSE(CheckSymlinkTarget("x", "/etc/shadow").ok());
  EXPECT_FALSE(CheckSymlinkTarget("x", "../out").ok());
  EXPECT_FALSE(CheckSymlinkTarget("a/x", "../../out").ok());
  EXPECT_FALSE(CheckSymlinkTarget("x", "").ok());
  // 'dir/..' is resolved from where dir leads, which may be anywhere: a
  // link s -> .. inside sub/ would make sub/s/.. the folder's parent.
  EXPECT_FALSE(CheckSymlinkTarget("x", "sub/s/..").ok());
  EXPECT_FALSE(CheckSymlinkTarget("x", "a/../b").ok());
}

class OutputsDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-fetch-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(OutputsDirTest, FoldersAreMadeButNeverEnteredThroughASymlink) {
  auto out = OutputsDir::Open(root_ + "/out");
  ASSERT_TRUE(out.ok()) << out.status();
  auto parent = out->ParentOf("a/b/file");
  ASSERT_TRUE(parent.ok()) << parent.status();
  EXPECT_EQ(parent->second, "file");
  EXPECT_TRUE(std::filesystem::is_directory(root_ + "/out/a/b"));

  std::filesystem::create_directories(root_ + "/elsewhere");
  std::filesystem::create_directory_symlink(root_ + "/elsewhere",
                                            root_ + "/out/link");
  auto through = out->ParentOf("link/file");
  EXPECT_FALSE(through.ok());
  EXPECT_THAT(std::string(through.status().message()),
              ::testing::HasSubstr("link is a symlink"));

  ASSERT_TRUE(out->MakeSymlink("a/latest", "b/file").ok());
  EXPECT_EQ(std::filesystem::read_symlink(root_ + "/out/a/latest"), "b/file");
  // Made again over the old one, and never followed.
  ASSERT_TRUE(out->MakeSymlink("a/latest", "b").ok());
  EXPECT_EQ(std::filesystem::read_symlink(root_ + "/out/a/latest"), "b");
  EXPECT_FALSE(out->ParentOf("a/latest/x").ok());
}

}  // namespace
}  // namespace dlbatch::client
