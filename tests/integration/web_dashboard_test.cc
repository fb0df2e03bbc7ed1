// The dashboard in a real browser (headless Debian chromium driven by
// puppeteer-core, tests/web/dashboard_test.mjs) against the real
// dlbatch-scheduler on TCP with its web face, a root worker running the
// jobs as their users (nobody owns them, daemon is the other user), and
// the real CLI: a LeNet train job on Fashion-MNIST whose curve and diary
// grow while the browser watches, a command job whose name and diary hold
// markup, a sweep, an array, and 100,000 jobs in the store for the list.
// The browser's checks are the script's; this test prepares the cluster,
// runs the script, and checks by the CLI what the browser did (a cancel).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr char kXssName[] = "<img src=x onerror=alert(1)>";
constexpr int kBulkArrays = 10;  // of 10,000 jobs each: an array's most
constexpr int kBulkJobs = kBulkArrays * 10000;

std::string Trim(std::string s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.pop_back();
  return s;
}

bool OnPath(const std::string& program) {
  return Exec({"sh", "-c", "command -v " + program}, {}, 10000).code == 0;
}

class WebDashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root: the worker runs the jobs as nobody and "
                      "daemon, the dashboard's two users";
    }
    if (!OnPath("node")) {
      GTEST_SKIP() << "no node on PATH (apt-get install nodejs): the "
                      "browser checks are a node script";
    }
    if (!std::filesystem::exists(FashionMnistDir() +
                                 "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << FashionMnistDir()
                   << " (Debian's dataset-fashion-mnist, or set "
                      "DLBATCH_TEST_DATA_DIR)";
    }
    // The jobs' users must pass through the test's folder to their files.
    ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
    c_.StartScheduler({"--web-listen", "127.0.0.1:0"}, "127.0.0.1:0");
    admin_ = Trim(ReadAll(c_.scheduler_state() + "/token"));
    ASSERT_FALSE(admin_.empty()) << c_.Logs();
    // The CLI and the workers present the first admin's token.
    setenv("DLBATCH_TOKEN", admin_.c_str(), 1);
    port_ = WebPort();
    ASSERT_GT(port_, 0) << c_.Logs();
    owner_ = Issue({"admin", "user", "add", "nobody"});
    other_ = Issue({"admin", "user", "add", "daemon"});
    c_.StartWorker("w1", 4);
    // The bulk jobs' profile has one worker, drained: they stay queued.
    c_.StartWorker("idle", 1, "bulk");
    ASSERT_TRUE(c_.WaitWorkers(2)) << c_.Logs();
    ASSERT_EQ(
        c_.Cli({"admin", "drain", "idle", "--reason", "bulk jobs wait"}).code,
        0);
  }
  void TearDown() override { unsetenv("DLBATCH_TOKEN"); }

  // The port of the log's "web face on https://127.0.0.1:PORT".
  int WebPort() {
    int port = 0;
    WaitFor(
        [&] {
          std::string log = ReadAll(c_.dir() + "/scheduler.log");
          const std::string mark = "web face on https://127.0.0.1:";
          size_t at = log.find(mark);
          if (at != std::string::npos) {
            port = std::atoi(log.c_str() + at + mark.size());
          }
          return port > 0;
        },
        10000);
    return port;
  }
  std::string Issue(const std::vector<std::string>& args) {
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return Trim(r.out);
  }
  // The CLI as `token`'s user.
  Result As(const std::string& token, const std::vector<std::string>& args) {
    return c_.Cli(args, {{"DLBATCH_TOKEN", token}});
  }
  // Submits a job file as the owner; the ids it made, one a line.
  std::vector<int64_t> SubmitAsOwner(const std::string& name,
                                     const std::string& yaml) {
    Result r = As(owner_, {"submit", "-q", c_.JobFile(name, yaml)});
    EXPECT_EQ(r.code, 0) << r.err << c_.Logs();
    std::vector<int64_t> ids;
    size_t start = 0;
    for (size_t nl; (nl = r.out.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      ids.push_back(std::stoll(r.out.substr(start, nl - start)));
    }
    return ids;
  }

  Cluster c_;
  std::string admin_, owner_, other_;
  int port_ = 0;
};

TEST_F(WebDashboardTest, TheDashboardInABrowserAgainstTheRealCluster) {
  // A train job long enough to grow while the browser watches; the
  // browser's owner cancels it at the end.
  std::vector<int64_t> train =
      SubmitAsOwner("train.yaml", LenetJob(FashionMnistDir(),
                                           "    mini_batch_size: 32\n"
                                           "    max_iterations: 1000000\n"
                                           "    verbose_frequency: 5\n",
                                           "name: lenet\n"));
  ASSERT_EQ(train.size(), 1u);

  // Markup, a script, terminal escapes and bytes that are not UTF-8.
  const std::string script = c_.dir() + "/nasty.sh";
  WriteAll(script,
           "printf '%s\\n' '<script>window.pwned=1</script>'\n"
           "printf '\\033[31mred\\033[0m \\033]0;title\\007 bell\\n'\n"
           "printf 'bad utf-8: \\377\\376 \\300\\200 end\\n'\n"
           "printf '%s\\n' '<img src=x onerror=alert(2)>'\n"
           "exec sleep 600\n");
  ASSERT_EQ(chmod(script.c_str(), 0644), 0);
  std::vector<int64_t> xss =
      SubmitAsOwner("xss.yaml", std::string("name: '") + kXssName +
                                    "'\ncommand: [sh, " + script + "]\n");
  ASSERT_EQ(xss.size(), 1u);

  std::vector<int64_t> sweep =
      SubmitAsOwner("sweep.yaml",
                    "name: lr\ncommand: [sh, -c, 'echo \"lr=$LR\"']\n"
                    "sweep:\n  env.LR: ['0.1', '0.01', '0.001']\n");
  ASSERT_EQ(sweep.size(), 3u);
  std::vector<int64_t> array = SubmitAsOwner(
      "array.yaml",
      "name: shard\narray: 0-3\n"
      "command: [sh, -c, 'echo \"shard $DLBATCH_ARRAY_INDEX\"']\n");
  ASSERT_EQ(array.size(), 4u);
  const int64_t sweep_id = JsonInt(c_.ShowJson(sweep[0]), "sweep_id");
  const int64_t array_id = JsonInt(c_.ShowJson(array[0]), "array_id");
  ASSERT_GT(sweep_id, 0);
  ASSERT_GT(array_id, 0);

  // 100,000 queued jobs of the first admin's, in arrays (a submit each).
  const std::string bulk =
      c_.JobFile("bulk.yaml",
                 "name: bulk\nprofile: bulk\narray: 0-9999\ncommand: [true]\n");
  auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kBulkArrays; ++i) {
    Result r = c_.Cli({"submit", "-q", bulk}, {}, 120000);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const double bulk_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  std::printf("submitted %d jobs in %.1f s\n", kBulkJobs, bulk_s);

  // The train job runs and reports before the browser looks.
  ASSERT_TRUE(WaitFor(
      [&] {
        return JsonInt(c_.ShowJson(train[0])["progress"], "iteration") > 0;
      },
      120000))
      << c_.Cli({"diary", std::to_string(train[0])}).out << c_.Logs();
  ASSERT_TRUE(c_.WaitState(xss[0], "JOB_STATE_RUNNING")) << c_.Logs();

  const std::string shots = c_.dir() + "/screenshots";
  Result browser =
      Exec({"node", DLBATCH_WEB_TEST_SCRIPT},
           {{"DLBATCH_WEB_URL", "https://127.0.0.1:" + std::to_string(port_)},
            {"DLBATCH_TOKEN", owner_},
            {"DLBATCH_OTHER_TOKEN", other_},
            {"DLBATCH_SCREENSHOTS", shots},
            {"DLBATCH_TRAIN_ID", std::to_string(train[0])},
            {"DLBATCH_XSS_ID", std::to_string(xss[0])},
            {"DLBATCH_SWEEP_ID", std::to_string(sweep_id)},
            {"DLBATCH_ARRAY_ID", std::to_string(array_id)},
            {"DLBATCH_MIN_TOTAL", std::to_string(kBulkJobs)},
            {"DLBATCH_WEB_TEST_MODULES", DLBATCH_WEB_TEST_MODULES}},
           150000);
  std::printf("%s", browser.out.c_str());
  if (std::filesystem::exists(shots)) {
    const std::string keep = DLBATCH_WEB_SCREENSHOTS_DIR;
    std::filesystem::remove_all(keep);
    std::filesystem::copy(shots, keep,
                          std::filesystem::copy_options::recursive);
    std::printf("screenshots in %s\n", keep.c_str());
  }
  if (browser.code == 77) GTEST_SKIP() << browser.out;
  ASSERT_EQ(browser.code, 0) << browser.out << browser.err << c_.Logs();

  // What the browser did, as the CLI sees it: the owner's cancel took.
  EXPECT_TRUE(c_.WaitState(train[0], "JOB_STATE_CANCELLED", 60000))
      << c_.State(train[0]);
  // The other user's refused cancel did not.
  EXPECT_EQ(c_.State(xss[0]), "JOB_STATE_RUNNING");
}

}  // namespace
}  // namespace dlbatch::testing
