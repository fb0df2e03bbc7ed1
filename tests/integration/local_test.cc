// The embedded local cluster: no scheduler configured, the CLI starts one.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

TEST(LocalCluster, StartsOnFirstUseRunsAJobAndStops) {
  Cluster c;  // only for its temp folder
  std::map<std::string, std::string> env = {
      {"XDG_STATE_HOME", c.dir() + "/xdg"}, {"DLBATCH_SCHEDULER", ""}};
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), BinDir() + "/dlbatch");
    return Exec(args, env, 60000);
  };
  Result status = cli({"local", "status"});
  EXPECT_EQ(status.code, 3);
  EXPECT_NE(status.out.find("not running"), std::string::npos) << status.out;

  c.JobFile(
      "hello.yaml",
      "name: hello\ncommand: [sh, -c, 'echo hello from $DLBATCH_JOB_ID']\n");
  Result submit = cli({"submit", "--follow", c.dir() + "/hello.yaml"});
  EXPECT_EQ(submit.code, 0) << submit.out << submit.err;
  EXPECT_NE(submit.out.find("Submitted job 1"), std::string::npos)
      << submit.out;
  EXPECT_NE(submit.out.find("hello from 1"), std::string::npos) << submit.out;

  struct stat st;
  ASSERT_EQ(stat((c.dir() + "/xdg/dlbatch").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  Result running = cli({"local", "status"});
  EXPECT_EQ(running.code, 0) << running.out;
  EXPECT_NE(running.out.find("scheduler:    running"), std::string::npos)
      << running.out;
  Result profiles = cli({"profiles"});
  EXPECT_NE(profiles.out.find("local"), std::string::npos);

  // While a job runs, stop refuses and says so, unless --force.
  Result sleeper = cli({"submit", "-q", "--", "sleep", "60"});
  ASSERT_EQ(sleeper.code, 0) << sleeper.err;
  ASSERT_TRUE(WaitFor(
      [&] {
        return cli({"jobs", "--state", "running", "--format", "id"}).out !=
               "ID\n";
      },
      15000));
  Result refused = cli({"local", "stop"});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("1 job runs on the local cluster (2)"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("--force"), std::string::npos) << refused.err;
  EXPECT_EQ(cli({"local", "status"}).code, 0);
  Result stop = cli({"local", "stop", "--force"});
  EXPECT_EQ(stop.code, 0) << stop.err;
  EXPECT_NE(stop.out.find("stopped the local scheduler"), std::string::npos)
      << stop.out;
  Result after = cli({"local", "status"});
  EXPECT_EQ(after.code, 3) << after.out;
  EXPECT_NE(after.out.find("scheduler:    not running"), std::string::npos)
      << after.out;
  // The job's record survives a restart of the local cluster.
  Result show = cli({"show", "1"});
  EXPECT_EQ(show.code, 0) << show.err;
  EXPECT_NE(show.out.find("finished"), std::string::npos) << show.out;
  cli({"local", "stop", "--force"});
}

}  // namespace
}  // namespace dlbatch::testing
