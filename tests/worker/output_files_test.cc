#include "worker/output_files.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-outputs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(
        std::filesystem::path(dir_ + "/" + rel).parent_path());
    std::ofstream(dir_ + "/" + rel) << text;
  }
  std::string ReadFd(int fd) {
    std::string out(4096, '\0');
    ssize_t n = pread(fd, out.data(), out.size(), 0);
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
  }
  std::vector<std::string> Paths(const OutputScan& scan) {
    std::vector<std::string> out;
    for (const auto& e : scan.entries) {
      for (const auto& p : e.paths) out.push_back(p);
    }
    return out;
  }

  std::string dir_;
};

TEST_F(OutputFilesTest, SymlinksAreKeptAsTextAndNeverFollowed) {
  Write("a.txt", "alpha");
  Write("sub/b.txt", "beta");
  ASSERT_EQ(symlink("/etc/shadow", (dir_ + "/x").c_str()), 0);
  ASSERT_EQ(symlink("sub/b.txt", (dir_ + "/inside").c_str()), 0);
  // A folder symlink is not entered either.
  ASSERT_EQ(symlink("/etc", (dir_ + "/etc").c_str()), 0);

  auto scan = ScanOutputs(dir_, 0);
  ASSERT_TRUE(scan.ok()) << scan.status();
  EXPECT_THAT(Paths(*scan),
              ElementsAre("a.txt", "etc", "inside", "sub/b.txt", "x"));
  std::map<std::string, std::string> links;
  for (const auto& e : scan->entries) {
    if (e.kind == OutputEntry::Kind::kSymlink) links[e.paths[0]] = e.target;
  }
  EXPECT_EQ(links["x"], "/etc/shadow");
  EXPECT_EQ(links["inside"], "sub/b.txt");
  EXPECT_EQ(links["etc"], "/etc");
  EXPECT_EQ(scan->files, 2);
  EXPECT_EQ(scan->total_bytes, 9);
  EXPECT_TRUE(scan->skipped.empty());
}

TEST_F(OutputFilesTest, HardLinksAreOneContentUnderEveryPath) {
  Write("one", "shared bytes");
  ASSERT_EQ(link((dir_ + "/one").c_str(), (dir_ + "/two").c_str()), 0);
  auto scan = ScanOutputs(dir_, 0);
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->entries.size(), 1u);
  EXPECT_THAT(scan->entries[0].paths, ElementsAre("one", "two"));
  EXPECT_EQ(scan->total_bytes, 12);

  int uploads = 0;
  auto stored =
      StoreOutputs(*scan,
                   [&](int fd, int64_t size,
                       const std::string&) -> absl::StatusOr<LocalBlob> {
                     ++uploads;
                     EXPECT_EQ(ReadFd(fd), "shared bytes");
                     return LocalBlob{std::string(64, 'a'), size};
                   });
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(uploads, 1);
  ASSERT_EQ(stored->size(), 2u);
  EXPECT_EQ((*stored)[0].path(), "one");
  EXPECT_EQ((*stored)[1].path(), "two");
  EXPECT_EQ((*stored)[1].sha256(), std::string(64, 'a'));
  EXPECT_EQ((*stored)[1].size(), 12);
}

TEST_F(OutputFilesTest, FifosSocketsAndDevicesAreSkippedWithALine) {
  Write("keep", "k");
  ASSERT_EQ(mkfifo((dir_ + "/pipe").c_str(), 0600), 0);
  int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::string sock_path = dir_ + "/sock";
  ASSERT_LT(sock_path.size(), sizeof(addr.sun_path));
  std::strcpy(addr.sun_path, sock_path.c_str());
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(sock);
  bool device = mknod((dir_ + "/zero").c_str(), S_IFCHR | 0600,
                      makedev(1, 5)) == 0;  // needs root

  auto scan = ScanOutputs(dir_, 0);
  ASSERT_TRUE(scan.ok()) << scan.status();
  EXPECT_THAT(Paths(*scan), ElementsAre("keep"));
  ASSERT_EQ(scan->skipped.size(), device ? 3u : 2u);
  EXPECT_THAT(scan->skipped[0], HasSubstr("'pipe' skipped: it is a FIFO"));
  EXPECT_THAT(scan->skipped[1], HasSubstr("'sock' skipped: it is a socket"));
  if (device) {
    EXPECT_THAT(scan->skipped[2], HasSubstr("a character device"));
  }
}

TEST_F(OutputFilesTest, ASparseOutputOverTheQuotaIsRefusedBeforeAnyRead) {
  Write("small", "s");
  int fd = open((dir_ + "/huge").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, int64_t{20} << 30), 0);  // 20 GiB, no blocks
  close(fd);
  auto start = std::chrono::steady_clock::now();
  auto scan = ScanOutputs(dir_, int64_t{1} << 30);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(scan.ok());
  EXPECT_EQ(scan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(scan.status().message(), HasSubstr("21474836480 bytes"));
  EXPECT_THAT(scan.status().message(), HasSubstr("limit of 1.1 GB"));
  // Sizes only: reading 20 GiB would take many seconds.
  EXPECT_LT(took, std::chrono::seconds(2));

  // Without a limit the size is what is announced, and nothing was read.
  auto unlimited = ScanOutputs(dir_, 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->total_bytes, (int64_t{20} << 30) + 1);
}

TEST_F(OutputFilesTest, AFileSwappedForASymlinkAfterTheScanIsNotOpened) {
  Write("sub/data", "mine");
  auto scan = ScanOutputs(dir_, 0);
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->entries.size(), 1u);
  // A job process swaps the file, then its folder, for symlinks.
  std::filesystem::remove(dir_ + "/sub/data");
  ASSERT_EQ(symlink("/etc/passwd", (dir_ + "/sub/data").c_str()), 0);
  auto fd = scan->OpenFile(scan->entries[0]);
  EXPECT_FALSE(fd.ok());
  std::filesystem::remove_all(dir_ + "/sub");
  ASSERT_EQ(symlink("/etc", (dir_ + "/sub").c_str()), 0);
  fd = scan->OpenFile(scan->entries[0]);
  EXPECT_FALSE(fd.ok());
  // The upload fails naming the output; nothing of /etc was read.
  auto stored = StoreOutputs(
      *scan,
      [&](int, int64_t, const std::string&) -> absl::StatusOr<LocalBlob> {
        ADD_FAILURE() << "uploaded a swapped file";
        return absl::InternalError("no");
      });
  EXPECT_FALSE(stored.ok());
  EXPECT_THAT(stored.status().message(), HasSubstr("sub/data"));
}

TEST_F(OutputFilesTest, NamesThatAreNotUtf8AreSkipped) {
  Write("fine", "f");
  Write("bad\xff", "b");
  auto scan = ScanOutputs(dir_, 0);
  ASSERT_TRUE(scan.ok());
  EXPECT_THAT(Paths(*scan), ElementsAre("fine"));
  ASSERT_EQ(scan->skipped.size(), 1u);
  EXPECT_THAT(scan->skipped[0], HasSubstr("bad\\xff"));
}

TEST_F(OutputFilesTest, AnOutputFolderReplacedByASymlinkIsNotFollowed) {
  ASSERT_EQ(symlink("/etc", (dir_ + "/out").c_str()), 0);
  auto scan = ScanOutputs(dir_ + "/out", 0);
  ASSERT_FALSE(scan.ok());
  EXPECT_EQ(scan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(scan.status().message(), HasSubstr("replaced its output folder"));
}

TEST_F(OutputFilesTest, AMissingFolderHoldsNothing) {
  auto scan = ScanOutputs(dir_ + "/absent", 10);
  ASSERT_TRUE(scan.ok());
  EXPECT_TRUE(scan->entries.empty());
}

}  // namespace
}  // namespace dlbatch::worker
