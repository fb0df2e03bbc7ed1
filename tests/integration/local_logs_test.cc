// The local cluster's daemon logs are bounded: a relay rotates each at a
// size (8 MiB; DLBATCH_LOCAL_LOG_BYTES here) to LOG.1, keeping one old file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST(LocalCluster, DaemonLogsRotateAtTheirSize) {
  Cluster c;  // only for its temp folder
  const int64_t limit = 1024;
  std::map<std::string, std::string> env = {
      {"XDG_STATE_HOME", c.dir() + "/xdg"},
      {"DLBATCH_SCHEDULER", ""},
      {"DLBATCH_LOCAL_LOG_BYTES", std::to_string(limit)}};
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), BinDir() + "/dlbatch");
    return Exec(args, env, 60000);
  };
  const std::string job = c.JobFile("hi.yaml", "command: [true]\n");
  // Each job adds two lines to the worker's log.
  for (int i = 0; i < 12; ++i) {
    Result r = cli({"submit", "--follow", job});
    ASSERT_EQ(r.code, 0) << r.out << r.err;
  }
  const std::string dir = c.dir() + "/xdg/dlbatch/";
  const int64_t now = FileSize(dir + "worker.log");
  const int64_t old = FileSize(dir + "worker.log.1");
  EXPECT_GT(old, 0) << "worker.log was never rotated";
  EXPECT_LE(old, limit + 512);  // a write may not be split
  EXPECT_GT(now, 0);
  EXPECT_LE(now, limit + 512);
  EXPECT_EQ(FileSize(dir + "worker.log.2"), -1);
  Result stop = cli({"local", "stop"});
  EXPECT_EQ(stop.code, 0) << stop.err;
}

}  // namespace
}  // namespace dlbatch::testing
