// The worker as dlbatch-worker.service runs it: systemd (Delegate=yes)
// starts it inside the unit's own cgroup and hands it that subtree. Played
// here by a cgroup made under this test's own and the worker moved into it
// before it starts: the job's cgroup must be made under that cgroup (the
// worker reads /proc/self/cgroup), never beside it, and go with the job.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

// The cgroup2 mount point and this process's cgroup in it, or "".
std::string OwnCgroup2Dir() {
  std::string mount;
  std::istringstream info(ReadAll("/proc/self/mountinfo"));
  for (std::string line; std::getline(info, line);) {
    size_t dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string f;
    for (int i = 0; i < 5 && fields >> f; ++i) mount = f;
    break;
  }
  if (mount.empty()) return "";
  std::istringstream cgroup(ReadAll("/proc/self/cgroup"));
  for (std::string line; std::getline(cgroup, line);) {
    if (line.rfind("0::", 0) == 0) {
      std::string own = line.substr(3);
      return own == "/" ? mount : mount + own;
    }
  }
  return "";
}

TEST(DelegatedCgroup, JobCgroupsAreMadeUnderTheWorkersOwn) {
  if (geteuid() != 0) GTEST_SKIP() << "cgroups need root to make here";
  const std::string own = OwnCgroup2Dir();
  if (own.empty()) GTEST_SKIP() << "no cgroup2 hierarchy is mounted";
  const std::string unit = absl::StrCat(own, "/dlbatch-unit-test-", getpid());
  if (mkdir(unit.c_str(), 0755) != 0) {
    GTEST_SKIP() << "cannot make a cgroup under " << own << ": "
                 << strerror(errno);
  }
  {
    Cluster c;
    c.StartScheduler();
    // As systemd starts a unit's main process: already in the unit's cgroup.
    c.StartWorker("delegated", 1, "local", {},
                  {"/bin/sh", "-c",
                   "echo $$ > \"$0\"/cgroup.procs && exec \"$@\"", unit});
    ASSERT_TRUE(c.WaitWorkers(1)) << c.Logs();
    const std::string job = c.JobFile("where.yaml",
                                      "name: where\npool: 1\n"
                                      "command: [cat, /proc/self/cgroup]\n");
    const int64_t id = c.Submit(job);
    ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED")) << c.Logs();
    Result diary = c.Cli({"diary", std::to_string(id)});
    ASSERT_EQ(diary.code, 0) << diary.err;
    // 0::/<own>/dlbatch-unit-test-N/dlbatch-<mark>/w<pid>/job-...
    const std::string unit_rel = unit.substr(unit.find("/dlbatch-unit-test-"));
    const size_t at = diary.out.find(unit_rel + "/dlbatch-");
    ASSERT_NE(at, std::string::npos)
        << "the job ran outside the worker's cgroup " << unit << ":\n"
        << diary.out << c.Logs();
    EXPECT_NE(diary.out.find("/w", at), std::string::npos) << diary.out;
    EXPECT_NE(diary.out.find("/job-", at), std::string::npos) << diary.out;
    c.KillWorker(0, SIGTERM);
  }
  // The worker's subtree is gone with it; the unit's cgroup is left empty.
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string procs = ReadAll(unit + "/cgroup.procs");
        return procs.empty() || procs == "\n";
      },
      10000));
  // Whatever the worker's guard leaves is removed deepest first.
  ASSERT_EQ(system(absl::StrCat("find ", unit,
                                " -depth -type d -exec rmdir {} + 2>/dev/null;"
                                " test ! -e ",
                                unit)
                       .c_str()),
            0)
      << "cgroups left under " << unit;
}

}  // namespace
}  // namespace dlbatch::testing
