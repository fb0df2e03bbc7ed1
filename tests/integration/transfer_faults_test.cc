// Files a job or a user hands over that are not plain files: symlinks,
// hard links, FIFOs, sockets and devices among a job's outputs and in its
// attachments, and outputs far larger than the store, through the real
// scheduler, worker and CLI.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

namespace fs = std::filesystem;

bool IsSymlink(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A job leaves in its outputs: a symlink to /etc/shadow, one climbing out
// with '..', one inside, a hard link, a FIFO and a socket.
TEST(TransferFaults, OutputLinksAndSpecialFilesAreStoredSafely) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile(
      "links.yaml",
      "command: [sh, -c, 'cd $DLBATCH_OUTPUT_DIR && echo data > real.txt && "
      "mkdir sub && echo in > sub/in.txt && ln -s /etc/shadow x && "
      "ln -s ../../../../../../etc/passwd up && ln -s sub/in.txt inside && "
      "ln -s ../real.txt sub/back && ln real.txt hard.txt && mkfifo pipe && "
      "/usr/bin/python3 -c \"import socket; "
      "socket.socket(socket.AF_UNIX).bind(\\\"sock\\\")\" && echo made']\n"));
  Result wait = c.Cli({"wait", std::to_string(id)}, {}, 30000);
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();
  Result diary = c.Cli({"diary", std::to_string(id)});
  EXPECT_NE(diary.out.find("made"), std::string::npos) << diary.out;
  EXPECT_NE(diary.out.find("'pipe' skipped: it is a FIFO"), std::string::npos)
      << diary.out;
  EXPECT_NE(diary.out.find("'sock' skipped: it is a socket"), std::string::npos)
      << diary.out;

  // The links are stored as links: /etc/shadow was never read.
  Result list = c.Cli({"fetch-outputs", "--list", std::to_string(id)});
  EXPECT_NE(list.out.find("x -> /etc/shadow"), std::string::npos) << list.out;
  EXPECT_EQ(list.out.find("pipe"), std::string::npos) << list.out;

  const std::string box = c.dir() + "/box";
  const std::string target = box + "/out";
  fs::create_directories(box);
  Result fetch = c.Cli({"fetch-outputs", std::to_string(id), "-o", target});
  ASSERT_EQ(fetch.code, 0) << fetch.out << fetch.err;
  EXPECT_EQ(ReadAll(target + "/real.txt"), "data\n");
  EXPECT_EQ(ReadAll(target + "/hard.txt"), "data\n");
  EXPECT_EQ(ReadAll(target + "/sub/in.txt"), "in\n");
  ASSERT_TRUE(IsSymlink(target + "/inside"));
  EXPECT_EQ(fs::read_symlink(target + "/inside").string(), "sub/in.txt");
  EXPECT_EQ(ReadAll(target + "/inside"), "in\n");
  ASSERT_TRUE(IsSymlink(target + "/sub/back"));
  EXPECT_EQ(ReadAll(target + "/sub/back"), "data\n");
  // The links out are reported and not made.
  EXPECT_FALSE(Exists(target + "/x"));
  EXPECT_FALSE(Exists(target + "/up"));
  EXPECT_NE(fetch.err.find("skipped x -> /etc/shadow"), std::string::npos)
      << fetch.err;
  EXPECT_NE(fetch.err.find("skipped up -> ../../"), std::string::npos)
      << fetch.err;
  EXPECT_EQ(Names(box), std::vector<std::string>{"out"});

  // A symlink already in the target folder is never written through.
  const std::string again = c.dir() + "/again";
  const std::string elsewhere = c.dir() + "/elsewhere";
  fs::create_directories(again);
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, again + "/sub");
  Result fetch2 = c.Cli({"fetch-outputs", std::to_string(id), "-o", again});
  EXPECT_EQ(fetch2.code, 0) << fetch2.err;
  EXPECT_EQ(ReadAll(again + "/real.txt"), "data\n");
  EXPECT_TRUE(Names(elsewhere).empty());
  EXPECT_NE(fetch2.err.find("skipped sub/in.txt"), std::string::npos)
      << fetch2.err;
}

// Two jobs each leave a sparse 20 GB output, more than the store has room
// for: refused on its size, before a byte is hashed, and a small job beside
// them ends at once.
TEST(TransferFaults, LargeSparseOutputsDoNotHoldUpASmallJob) {
  Cluster c;
  struct statvfs vfs;
  ASSERT_EQ(statvfs(c.dir().c_str(), &vfs), 0);
  const int64_t free_mb =
      static_cast<int64_t>(vfs.f_bavail) * vfs.f_frsize / (1 << 20);
  // Room for small outputs, not for 20 GB.
  const int64_t keep_mb = std::max<int64_t>(1, free_mb - 2048);
  c.StartScheduler({"--min-free-mb", std::to_string(keep_mb)});
  c.StartWorker("w1", 3);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::vector<int64_t> big;
  for (const char* name : {"big1.yaml", "big2.yaml"}) {
    big.push_back(c.Submit(c.JobFile(
        name,
        "command: [sh, -c, 'truncate -s 20G $DLBATCH_OUTPUT_DIR/huge.bin && "
        "echo made']\n")));
  }
  // Both have written their file and are storing it.
  for (int64_t id : big) {
    ASSERT_TRUE(WaitFor(
        [&] {
          return c.Cli({"diary", std::to_string(id)}).out.find("made") !=
                 std::string::npos;
        },
        20000));
  }
  auto start = std::chrono::steady_clock::now();
  int64_t ok = c.Submit(c.JobFile("ok.yaml", "command: [echo, ok]\n"));
  ASSERT_TRUE(c.WaitState(ok, "JOB_STATE_FINISHED", 5000))
      << c.State(ok) << c.Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int64_t id : big) {
    ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FAILED", 20000)) << c.State(id);
    std::string reason = c.ShowJson(id)["reason"].get<std::string>();
    EXPECT_NE(reason.find("too full for a file of 21.5 GB"), std::string::npos)
        << reason;
  }
}

// The README links a data set's files into the job's data folder.
TEST(TransferFaults, AttachmentsFollowSymlinksAndRefuseSpecialFiles) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string real = c.dir() + "/real";
  fs::create_directories(real + "/folder");
  WriteAll(real + "/a.txt", "alpha\n");
  WriteAll(real + "/folder/b.txt", "beta\n");
  fs::create_directories(c.dir() + "/data");
  fs::create_symlink(real + "/a.txt", c.dir() + "/data/a.txt");
  fs::create_directory_symlink(real + "/folder", c.dir() + "/data/folder");
  int64_t id =
      c.Submit(c.JobFile("attach.yaml",
                         "attach: [data/]\n"
                         "command: [sh, -c, 'cat data/a.txt data/folder/b.txt; "
                         "test ! -L data/a.txt && echo copied']\n"));
  Result wait = c.Cli({"wait", std::to_string(id)}, {}, 30000);
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err;
  EXPECT_EQ(c.Cli({"diary", std::to_string(id)}).out, "alpha\nbeta\ncopied\n");

  // A FIFO in the folder, a symlink to /dev/zero, /dev/zero itself: each
  // refused at once, naming the path; none is opened.
  const std::string fifo_dir = c.dir() + "/fifo";
  fs::create_directories(fifo_dir);
  WriteAll(fifo_dir + "/fine.txt", "x");
  ASSERT_EQ(mkfifo((fifo_dir + "/pipe").c_str(), 0600), 0);
  const std::string zero_dir = c.dir() + "/zero";
  fs::create_directories(zero_dir);
  fs::create_symlink("/dev/zero", zero_dir + "/zeros");
  struct Case {
    std::string attach;
    std::string path;
    std::string kind;
  };
  for (const Case& k :
       {Case{"fifo/", fifo_dir + "/pipe", "a FIFO"},
        Case{"zero/", zero_dir + "/zeros", "a character device"},
        Case{"/dev/zero", "/dev/zero", "a character device"}}) {
    auto start = std::chrono::steady_clock::now();
    Result r = c.Cli({"submit", c.JobFile("bad.yaml", "attach: [" + k.attach +
                                                          "]\n"
                                                          "command: [true]\n")},
                     {}, 10000);
    EXPECT_NE(r.code, 0) << k.attach;
    EXPECT_NE(r.err.find(k.path + " is " + k.kind), std::string::npos)
        << k.attach << ": " << r.err;
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::seconds(5));
  }
}

}  // namespace
}  // namespace dlbatch::testing
