#include "client/outputs_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

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

using Kind = FoundOutput::Kind;
using Action = FetchStep::Action;

FoundOutput Found(Kind file, int64_t file_size, bool matches, Kind part,
                  int64_t part_size) {
  FoundOutput f;
  f.file = file;
  f.file_size = file_size;
  f.file_matches = matches;
  f.part = part;
  f.part_size = part_size;
  return f;
}

TEST(PlanFetch, TheCases) {
  constexpr int64_t kSize = 1000;
  // Nothing here: from 0.
  FetchStep s =
      PlanFetch(Found(Kind::kAbsent, 0, false, Kind::kAbsent, 0), kSize);
  EXPECT_EQ(s.action, Action::kFetch);
  EXPECT_FALSE(s.replaces);
  // The file, complete: kept, and a stale part beside it removed.
  s = PlanFetch(Found(Kind::kFile, kSize, true, Kind::kAbsent, 0), kSize);
  EXPECT_EQ(s.action, Action::kSkip);
  EXPECT_FALSE(s.remove_part);
  s = PlanFetch(Found(Kind::kFile, kSize, true, Kind::kFile, 10), kSize);
  EXPECT_EQ(s.action, Action::kSkip);
  EXPECT_TRUE(s.remove_part);
  // The file with other bytes of the same size: replaced.
  s = PlanFetch(Found(Kind::kFile, kSize, false, Kind::kAbsent, 0), kSize);
  EXPECT_EQ(s.action, Action::kFetch);
  EXPECT_TRUE(s.replaces);
  // A part: gone on from, whatever NAME is.
  s = PlanFetch(Found(Kind::kAbsent, 0, false, Kind::kFile, 212), kSize);
  EXPECT_EQ(s.action, Action::kResume);
  EXPECT_EQ(s.offset, 212);
  EXPECT_FALSE(s.replaces);
  s = PlanFetch(Found(Kind::kFile, 5, false, Kind::kFile, 212), kSize);
  EXPECT_EQ(s.action, Action::kResume);
  EXPECT_TRUE(s.replaces);
  // A part with every byte: only checked and renamed.
  s = PlanFetch(Found(Kind::kAbsent, 0, false, Kind::kFile, kSize), kSize);
  EXPECT_EQ(s.action, Action::kResume);
  EXPECT_EQ(s.offset, kSize);
  // Too long, empty, or not a file: from 0.
  for (FoundOutput f : {Found(Kind::kAbsent, 0, false, Kind::kFile, kSize + 1),
                        Found(Kind::kAbsent, 0, false, Kind::kFile, 0),
                        Found(Kind::kAbsent, 0, false, Kind::kOther, 10)}) {
    s = PlanFetch(f, kSize);
    EXPECT_EQ(s.action, Action::kFetch);
    EXPECT_EQ(s.offset, 0);
  }
  // A folder or a symlink where the file goes: replaced, not skipped.
  s = PlanFetch(Found(Kind::kOther, kSize, false, Kind::kAbsent, 0), kSize);
  EXPECT_EQ(s.action, Action::kFetch);
  EXPECT_TRUE(s.replaces);
}

// Every combination of what may be found, against the contract.
TEST(PlanFetch, EveryCombinationKeepsTheContract) {
  for (int64_t size : {0, 1, 4096, 1000}) {
    for (Kind file : {Kind::kAbsent, Kind::kFile, Kind::kOther}) {
      for (int64_t file_size : {int64_t{0}, size - 1, size, size + 1}) {
        for (bool matches : {false, true}) {
          for (Kind part : {Kind::kAbsent, Kind::kFile, Kind::kOther}) {
            for (int64_t part_size :
                 {int64_t{0}, int64_t{1}, size - 1, size, size + 1}) {
              if (file_size < 0 || part_size < 0) continue;
              const FoundOutput f =
                  Found(file, file_size, matches, part, part_size);
              const FetchStep s = PlanFetch(f, size);
              const std::string what =
                  ::testing::PrintToString(std::vector<int64_t>{
                      size, static_cast<int>(file), file_size, matches,
                      static_cast<int>(part), part_size});
              const bool complete =
                  file == Kind::kFile && file_size == size && matches;
              EXPECT_EQ(s.action == Action::kSkip, complete) << what;
              EXPECT_EQ(s.remove_part, complete && part != Kind::kAbsent)
                  << what;
              EXPECT_EQ(s.replaces, !complete && file != Kind::kAbsent) << what;
              const bool resumable =
                  part == Kind::kFile && part_size > 0 && part_size <= size;
              EXPECT_EQ(s.action == Action::kResume, !complete && resumable)
                  << what;
              EXPECT_EQ(s.offset, s.action == Action::kResume ? part_size : 0)
                  << what;
              EXPECT_LE(s.offset, size) << what;
            }
          }
        }
      }
    }
  }
}

TEST(FetchSummary, SaysWhatCameAndWhatWasKept) {
  FetchTally t;
  t.files = 2;
  t.fetched = 1;
  t.fetched_bytes = 500'000'000;
  t.resumed = 1;
  t.resumed_at = 212'000'000;
  t.resumed_bytes = 288'000'000;
  EXPECT_EQ(FetchSummary(t),
            "2 files: 1 fetched (500.0 MB), 1 resumed at 212.0 MB "
            "(288.0 MB received), 0 skipped; sha256 verified");
  t.resumed = 2;
  t.skipped = 3;
  t.files = 6;
  t.links = 1;
  t.not_fetched = 2;
  EXPECT_EQ(FetchSummary(t),
            "6 files: 1 fetched (500.0 MB), 2 resumed (212.0 MB kept, "
            "288.0 MB received), 3 skipped; 1 link; 2 not fetched (see "
            "below); sha256 verified");
  FetchTally one;
  one.files = 1;
  one.skipped = 1;
  EXPECT_EQ(FetchSummary(one),
            "1 file: 0 fetched (0 B), 0 resumed, 1 skipped; sha256 verified");
}

TEST_F(OutputsDirTest, InspectOutputHashesOnlyAFileOfTheRightSize) {
  auto out = OutputsDir::Open(root_ + "/out");
  ASSERT_TRUE(out.ok()) << out.status();
  auto parent = out->ParentOf("sub/model.bin");
  ASSERT_TRUE(parent.ok()) << parent.status();
  const int dir = parent->first.get();
  const std::string sha_abc =
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

  auto found = InspectOutput(dir, "model.bin", 3, sha_abc);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->file, Kind::kAbsent);
  EXPECT_EQ(found->part, Kind::kAbsent);

  const std::string base = root_ + "/out/sub/model.bin";
  {
    std::FILE* f = std::fopen(base.c_str(), "w");
    std::fputs("abc", f);
    std::fclose(f);
    f = std::fopen((base + ".part").c_str(), "w");
    std::fputs("ab", f);
    std::fclose(f);
  }
  found = InspectOutput(dir, "model.bin", 3, sha_abc);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->file, Kind::kFile);
  EXPECT_EQ(found->file_size, 3);
  EXPECT_TRUE(found->file_matches);
  EXPECT_EQ(found->part, Kind::kFile);
  EXPECT_EQ(found->part_size, 2);
  // Another sha256, or another size: no match.
  found = InspectOutput(dir, "model.bin", 3, std::string(64, '0'));
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->file_matches);
  found = InspectOutput(dir, "model.bin", 4, sha_abc);
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->file_matches);

  // Symlinks are looked at, never followed; a FIFO part is no part.
  std::filesystem::remove(base);
  std::filesystem::remove(base + ".part");
  std::filesystem::create_symlink("/etc/passwd", base);
  ASSERT_EQ(mkfifo((base + ".part").c_str(), 0600), 0);
  found = InspectOutput(dir, "model.bin", 3, sha_abc);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->file, Kind::kOther);
  EXPECT_FALSE(found->file_matches);
  EXPECT_EQ(found->part, Kind::kOther);
  EXPECT_EQ(PlanFetch(*found, 3).action, Action::kFetch);
}

}  // namespace
}  // namespace dlbatch::client
