// Stored checkpoints of command jobs through the real scheduler, workers
// and CLI: the newest three kept and listed by `show --json`, and with
// `checkpoint: per-part` every part's own folder stored, a lost worker's
// job resumed from the newest step all its parts stored, each part finding
// its own files of it.
#include <signal.h>
#include <sys/stat.h>

#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

// Writes "part P step S" into $DLBATCH_CHECKPOINT_DIR/state.txt (whole,
// under a temporary name) and announces it, for each step of argv[2] (a
// comma-separated list per part: "10,20,30/10,20"), then waits until the
// test has seen it stored (SHARED/ack-P-S). Part 1 is the slower one. After
// its steps a first attempt waits (for SHARED/go, at most 5 minutes, so
// that nothing outlives the test); a resumed one writes what it found
// (SHARED/found-P: "$DLBATCH_RESUMED_FROM:state.txt") and stores one step
// more before it ends.
constexpr char kScript[] = R"(import os, sys, time
import dlbatch
shared = sys.argv[1]
part = int(os.environ["DLBATCH_PART"])
steps = [int(s) for s in sys.argv[2].split("/")[part].split(",")]
ckpt = dlbatch.checkpoint_dir()

def wait_for(name, seconds):
    end = time.time() + seconds
    while not os.path.exists(os.path.join(shared, name)):
        if time.time() > end:
            return False
        time.sleep(0.02)
    return True

def store(step):
    with open(os.path.join(ckpt, "state.tmp"), "w") as f:
        f.write("part %d step %d" % (part, step))
    os.replace(os.path.join(ckpt, "state.tmp"), os.path.join(ckpt, "state.txt"))
    dlbatch.checkpoint_saved(step)

resumed = dlbatch.resumed_from()
if resumed is None:
    for step in steps:
        if part == 1:
            time.sleep(0.5)
        store(step)
        wait_for("ack-%d-%d" % (part, step), 120)
    wait_for("go", 300)
    sys.exit(3)
with open(os.path.join(ckpt, "state.txt")) as f:
    found = f.read()
with open(os.path.join(shared, "found.tmp-%d" % part), "w") as f:
    f.write("%s:%s" % (os.environ.get("DLBATCH_RESUMED_FROM", ""), found))
os.replace(os.path.join(shared, "found.tmp-%d" % part),
           os.path.join(shared, "found-%d" % part))
store(resumed + 100)
time.sleep(1)
)";

// part -> the steps `show --json`'s checkpoints list for it.
std::map<int, std::set<int64_t>> KeptSteps(const nlohmann::json& show) {
  std::map<int, std::set<int64_t>> out;
  if (!show.contains("checkpoints")) return out;
  for (const auto& k : show["checkpoints"])
    out[k.value("part", -1)].insert(k.value("iteration", int64_t{-1}));
  return out;
}

// Writes SHARED/ack-P-S for every checkpoint `show` lists.
void Acknowledge(const nlohmann::json& show, const std::string& shared) {
  for (const auto& [part, steps] : KeptSteps(show)) {
    for (int64_t step : steps) {
      const std::string ack =
          shared + "/ack-" + std::to_string(part) + "-" + std::to_string(step);
      if (ReadAll(ack).empty()) WriteAll(ack, "ok");
    }
  }
}

class CheckpointParts : public ::testing::Test {
 protected:
  void SetUp() override {
    shared_ = c_.dir() + "/shared";
    ASSERT_EQ(mkdir(shared_.c_str(), 0777), 0);
    ASSERT_EQ(chmod(shared_.c_str(), 0777), 0);
    WriteAll(c_.dir() + "/steps.py", kScript);
  }
  // Lets every first attempt still waiting end.
  void TearDown() override { WriteAll(shared_ + "/go", "go"); }

  Cluster c_;
  std::string shared_;
};

// A job of one part storing six checkpoints: `show --json` never lists
// more than its newest three, and the newest is the one resumed from.
TEST_F(CheckpointParts, ShowListsAtMostTheNewestThree) {
  c_.StartScheduler();
  c_.StartWorker("a", 1);
  ASSERT_TRUE(c_.WaitWorkers(1));
  const int64_t id =
      c_.Submit(c_.JobFile("job.yaml",
                           "name: six\nattach: [steps.py]\n"
                           "command: [/usr/bin/python3, steps.py, " +
                               shared_ + ", '10,20,30,40,50,60']\n"));
  nlohmann::json show;
  size_t most = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        show = c_.ShowJson(id);
        most = std::max(most, show["checkpoints"].size());
        Acknowledge(show, shared_);
        return KeptSteps(show)[0].contains(60);
      },
      120000))
      << show.dump(2) << c_.Cli({"diary", std::to_string(id)}).out;
  EXPECT_LE(most, 3u);
  ASSERT_EQ(show["checkpoints"].size(), 3u) << show.dump(2);
  EXPECT_EQ(KeptSteps(show)[0], (std::set<int64_t>{40, 50, 60}));
  const nlohmann::json& newest = show["checkpoints"][2];
  EXPECT_EQ(newest.value("iteration", 0), 60);
  EXPECT_EQ(newest.value("attempt", 0), 1);
  EXPECT_TRUE(newest.value("resume", false));
  EXPECT_FALSE(show["checkpoints"][0].value("resume", true));
  ASSERT_EQ(newest["files"].size(), 1u);
  EXPECT_EQ(newest["files"][0].value("path", ""), "state.txt");
  // The `checkpoint` key is the resumed one's files, as before.
  ASSERT_EQ(show["checkpoint"].size(), 1u);
  EXPECT_EQ(show["checkpoint"][0].value("sha256", "x"),
            newest["files"][0].value("sha256", "y"));
  EXPECT_EQ(JsonInt(show["progress"], "checkpoint_iteration"), 60);
  EXPECT_EQ(c_.Cli({"cancel", std::to_string(id)}).code, 0);
}

// Part 0 stores 10, 20, 30; part 1, slower, 10 and 20. Part 0's worker is
// killed: attempt 2 (on the survivor and a third worker) resumes from 20,
// the newest step both stored, each part from its own files of it.
TEST_F(CheckpointParts, PerPartResumesEachPartFromItsOwnNewestCommonStep) {
  c_.StartScheduler(
      {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s"});
  const int a = c_.StartWorker("a", 1);
  const int b = c_.StartWorker("b", 1);
  ASSERT_TRUE(c_.WaitWorkers(2));
  const int64_t id = c_.Submit(
      c_.JobFile("job.yaml",
                 "name: parts\npool: 2\nmax_nodes: 2\ncheckpoint: per-part\n"
                 "attach: [steps.py]\n"
                 "command: [/usr/bin/python3, steps.py, " +
                     shared_ + ", '10,20,30/10,20']\n"));
  nlohmann::json show;
  ASSERT_TRUE(WaitFor(
      [&] {
        show = c_.ShowJson(id);
        Acknowledge(show, shared_);
        auto kept = KeptSteps(show);
        return kept[0].contains(30) && kept[1].contains(20);
      },
      120000))
      << show.dump(2) << c_.Cli({"diary", std::to_string(id)}).out;
  EXPECT_EQ(KeptSteps(show)[0], (std::set<int64_t>{10, 20, 30}));
  EXPECT_EQ(KeptSteps(show)[1], (std::set<int64_t>{10, 20}));
  EXPECT_EQ(JsonInt(show["progress"], "checkpoint_iteration"), 20);
  ASSERT_EQ(show["placement"].size(), 2u);
  // placement is in part order: part 0's worker goes.
  const std::string part0_worker =
      show["placement"][0].value("worker_name", "");
  c_.KillWorker(part0_worker == "a" ? a : b, SIGKILL);
  c_.StartWorker("c", 1);

  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  const std::string diary = c_.Cli({"diary", std::to_string(id)}).out;
  ASSERT_EQ(wait.code, 0) << diary << c_.Logs();
  show = c_.ShowJson(id);
  EXPECT_EQ(show.value("attempt", 0), 2);
  // Each part found its own state of step 20, and was told so.
  EXPECT_EQ(ReadAll(shared_ + "/found-0"), "20:part 0 step 20") << diary;
  EXPECT_EQ(ReadAll(shared_ + "/found-1"), "20:part 1 step 20") << diary;
  EXPECT_NE(diary.find("resumes from the checkpoint stored at step 20 (by "
                       "attempt 1), each part from its own"),
            std::string::npos)
      << diary;
  // Part 0's 30 was of the run no attempt continued; each part keeps at
  // most three.
  for (const auto& [part, steps] : KeptSteps(show)) {
    EXPECT_LE(steps.size(), 3u) << part;
    EXPECT_TRUE(steps.contains(20)) << part;
    EXPECT_FALSE(steps.contains(30)) << part;
  }
}

}  // namespace
}  // namespace dlbatch::testing
