// dlbatch jobs on a real Slurm (tests/slurm/slurm-cluster.sh: two slurmd,
// two fake GPUs each), through the real scheduler, ephemeral workers and
// CLI: a 1-GPU command job (its diary live, its CUDA_VISIBLE_DEVICES, its
// outputs fetched after the Slurm job is gone), a job over both nodes (and
// one whose second node's worker is killed: requeued, nothing left in
// Slurm), cancel of a pending and a running job, a time limit, a drained node's
// pending reason, a scheduler killed mid-job (the job adopted, finishing
// once; an unknown Slurm job of its instance's name cancelled), two
// schedulers sharing the Slurm (a restart touches only its own jobs), a
// Slurm job cancelled by hand (reported with Slurm's reason), Slurm's own
// preemption under PreemptMode=CANCEL and REQUEUE, and dlbatch's
// preemption of its own jobs on a Slurm profile (a command job, and a
// train job resuming from its checkpoint at the signal); on a CPU-only
// profile, the pool's CPUs asked of Slurm and offered by its workers, a pool
// no node holds refused at submit, and a worker short of CPUs failing its
// job at once.
//
// Label slurm: every test skips, saying why, where Slurm cannot start.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/integration/harness.h"
#include "tests/integration/train_weights.h"
#include "trainer/output/checkpoint.h"

namespace dlbatch::testing {
namespace {

namespace fs = std::filesystem;

struct SlurmRow {
  int64_t id = 0;
  std::string name, state, reason, nodes;
};

class SlurmJobs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/dlbatch-slurm-jobs-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      skip_ = "cannot make a temp folder";
      return;
    }
    rig_ = tmpl;
    chmod(tmpl, 0711);  // Slurm runs other users' jobs from inside it
    const std::string start =
        absl::StrCat(DLBATCH_SLURM_CLUSTER_SCRIPT, " start ", rig_,
                     "/slurm 2 >", rig_, "/start.log 2>&1");
    const int rc = system(start.c_str());
    started_ = true;
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
      skip_ =
          absl::StrCat("Slurm cannot run here: ", ReadAll(rig_ + "/start.log"));
      return;
    }
    setenv("SLURM_CONF", (rig_ + "/slurm/slurm.conf").c_str(), 1);
  }
  static void TearDownTestSuite() {
    if (started_) {
      (void)system(
          absl::StrCat(DLBATCH_SLURM_CLUSTER_SCRIPT, " stop ", rig_, "/slurm")
              .c_str());
    }
    if (!rig_.empty()) fs::remove_all(rig_);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    // Each test starts with both nodes up and no job of an earlier one.
    Exec({"scancel", "--partition=gpu"});
    Exec({"scancel", "--partition=low"});
    Exec({"scancel", "--partition=high"});
    Exec({"scancel", "--partition=requeue"});
    Exec({"scontrol", "update", "nodename=n1,n2", "state=resume"});
    ASSERT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
        << Squeue();
    node_dir_ = c_.dir() + "/nodes";
    fs::create_directories(node_dir_);
    config_ = c_.dir() + "/scheduler.yaml";
    // `narrow`'s workers run on one processor whatever Slurm gave their
    // node (as a task plugin's affinity or cpuset may narrow them): the
    // CPU slots they offer fall short of what their job was given.
    const std::string narrow_bin = c_.dir() + "/narrow-bin";
    fs::create_directories(narrow_bin);
    WriteAll(narrow_bin + "/dlbatch-worker",
             absl::StrCat("#!/bin/sh\nexec taskset -c 0 ", BinDir(),
                          "/dlbatch-worker \"$@\"\n"));
    fs::permissions(narrow_bin + "/dlbatch-worker",
                    fs::perms::owner_all | fs::perms::group_read |
                        fs::perms::group_exec | fs::perms::others_read |
                        fs::perms::others_exec);
    auto profile = [&](const std::string& name, int gpus,
                       const std::string& bin) {
      return absl::StrCat("  ", name,
                          ":\n"
                          "    type: slurm\n"
                          "    partition: gpu\n"
                          "    gpus_per_node: ",
                          gpus, "\n    bin_dir: ", bin,
                          "\n    node_dir: ", node_dir_, "\n");
    };
    // The test Slurm's nodes have 2 CPUs each (slurm-cluster.sh).
    // `low` runs in the partition Slurm preempts for `high`'s jobs.
    std::string low = profile("low", 2, BinDir());
    low.replace(low.find("partition: gpu"), 14, "partition: low");
    // `requeue` runs in the partition of PreemptMode=REQUEUE.
    std::string requeue = profile("requeue", 2, BinDir());
    requeue.replace(requeue.find("partition: gpu"), 14, "partition: requeue");
    // dlbatch preempts `urgent`'s own jobs for its higher-priority ones.
    const std::string urgent =
        profile("urgent", 2, BinDir()) +
        "    preemption:\n      mode: priority\n      grace: 30s\n"
        "      min_run: 0\n";
    WriteAll(config_,
             absl::StrCat("profiles:\n", profile("hpc", 2, BinDir()), low,
                          requeue, urgent, profile("cpus", 0, BinDir()),
                          profile("narrow", 0, narrow_bin)));
    c_.StartScheduler({"--config", config_, "--heartbeat-timeout", "5s"},
                      "127.0.0.1:0");
    UseScheduler(c_);
  }
  // The CLI presents `c`'s first admin token over TCP from now on.
  static void UseScheduler(const Cluster& c) {
    std::string token = ReadAll(c.scheduler_state() + "/token");
    while (!token.empty() && token.back() == '\n') token.pop_back();
    setenv("DLBATCH_TOKEN", token.c_str(), 1);
  }
  // `c`'s instance id, as its log says at start: its Slurm jobs are named
  // dlbatch-<instance>-<job id>.
  static std::string InstanceOf(const Cluster& c) {
    const std::string logs = c.Logs();
    const std::string mark = "are named dlbatch-";
    const size_t at = logs.find(mark);
    return at == std::string::npos ? "" : logs.substr(at + mark.size(), 8);
  }
  void TearDown() override {
    if (HasFailure()) {
      std::cerr << Squeue() << c_.Logs();
      for (const auto& e : fs::directory_iterator(node_dir_)) {
        if (e.path().extension() == ".out") {
          std::cerr << "--- " << e.path() << "\n" << ReadAll(e.path());
        }
      }
    }
  }

  static std::string Squeue() {
    return Exec({"squeue", "-h", "--states=all", "-o", "%i|%j|%T|%r|%N"}).out;
  }
  static std::vector<SlurmRow> SlurmJobsNamed(const std::string& prefix) {
    std::vector<SlurmRow> rows;
    for (absl::string_view line :
         absl::StrSplit(Squeue(), '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, '|');
      if (f.size() < 5 || !absl::StartsWith(f[1], prefix)) continue;
      SlurmRow row;
      (void)absl::SimpleAtoi(f[0], &row.id);
      row.name = f[1];
      row.state = f[2];
      row.reason = f[3];
      row.nodes = f[4];
      rows.push_back(row);
    }
    return rows;
  }
  // Slurm jobs of dlbatch's names that still wait or run.
  static std::vector<SlurmRow> LiveSlurmJobs() {
    std::vector<SlurmRow> live;
    for (const SlurmRow& r : SlurmJobsNamed("dlbatch-")) {
      if (r.state == "PENDING" || r.state == "RUNNING" ||
          r.state == "CONFIGURING" || r.state == "COMPLETING") {
        live.push_back(r);
      }
    }
    return live;
  }
  // The newest Slurm job of dlbatch job `id` (an earlier test's job of the
  // same number may still be listed as ended).
  std::optional<SlurmRow> SlurmJobOf(int64_t id, const Cluster* c = nullptr) {
    const std::string name =
        absl::StrCat("dlbatch-", InstanceOf(c == nullptr ? c_ : *c), "-", id);
    std::optional<SlurmRow> newest;
    for (const SlurmRow& r : SlurmJobsNamed(name)) {
      if (r.name == name && (!newest || r.id > newest->id)) {
        newest = r;
      }
    }
    return newest;
  }

  // On `c` (null: c_), whose token the CLI must present (UseScheduler).
  int64_t SubmitCommand(const std::string& name, const std::string& script,
                        const std::string& header = "pool: 1\n",
                        Cluster* c = nullptr) {
    if (c == nullptr) c = &c_;
    std::string yaml = absl::StrCat("name: ", name, "\nprofile: hpc\n", header,
                                    "command:\n  - sh\n  - -c\n  - |\n");
    for (absl::string_view line : absl::StrSplit(script, '\n')) {
      absl::StrAppend(&yaml, "    ", line, "\n");
    }
    return c->Submit(c->JobFile(name + ".yaml", yaml));
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }
  // The pid of the ephemeral worker of node `node` of Slurm job `slurm_id`
  // (both nodes' workers run on this machine); 0 if none runs.
  static pid_t WorkerOfNode(int64_t slurm_id, int node) {
    const std::string job = absl::StrCat("SLURM_JOB_ID=", slurm_id);
    const std::string index = absl::StrCat("SLURM_NODEID=", node);
    for (const auto& e : fs::directory_iterator("/proc")) {
      int pid = 0;
      if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
      if (!absl::StrContains(ReadAll(e.path() / "cmdline"), "dlbatch-worker"))
        continue;
      std::vector<std::string> env =
          absl::StrSplit(ReadAll(e.path() / "environ"), '\0');
      if (std::find(env.begin(), env.end(), job) != env.end() &&
          std::find(env.begin(), env.end(), index) != env.end()) {
        return pid;
      }
    }
    return 0;
  }
  // Slurm's own preemption of a job of `profile` (its partition's
  // PreemptMode), for a job of the high partition.
  void ExpectSlurmsPreemptionRequeues(const std::string& profile);
  std::string Field(int64_t id, const char* key) {
    nlohmann::json j = c_.ShowJson(id);
    if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
    return j[key].get<std::string>();
  }

  static inline std::string rig_;
  static inline std::string skip_;
  static inline bool started_ = false;
  Cluster c_;
  std::string node_dir_;
  std::string config_;
};

// `scontrol show job`'s fields of Slurm job `slurm_id` (Slurm keeps an
// ended job for MinJobAge, 60 s on the test Slurm).
std::string ScontrolJob(int64_t slurm_id) {
  return Exec({"scontrol", "show", "job", std::to_string(slurm_id)}).out;
}

TEST_F(SlurmJobs, OneGpuCommandJobDiaryLiveOutputsAfterSlurmJobIsGone) {
  const int64_t id =
      SubmitCommand("one-gpu",
                    "echo \"first line on $(hostname)\"\n"
                    "echo \"gpus=${CUDA_VISIBLE_DEVICES:-none}\"\n"
                    "echo made-in-slurm > \"$DLBATCH_OUTPUT_DIR/result.txt\"\n"
                    "sleep 4\n"
                    "echo last line");
  // Live: the first line is in the diary while the job still runs.
  ASSERT_TRUE(WaitFor(
      [&] { return absl::StrContains(Diary(id), "first line"); }, 60000))
      << c_.ShowJson(id).dump(2);
  EXPECT_EQ(c_.State(id), "JOB_STATE_RUNNING");
  EXPECT_FALSE(absl::StrContains(Diary(id), "last line"));
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  EXPECT_EQ(slurm->state, "RUNNING");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 60000))
      << c_.ShowJson(id).dump(2);
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "gpus=0")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "last line")) << diary;
  // The Slurm job is gone (its worker left), then the outputs come from the
  // scheduler alone.
  ASSERT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
  const std::string out = c_.dir() + "/fetched";
  Result fetched = c_.Cli({"fetch-outputs", std::to_string(id), "-o", out});
  ASSERT_EQ(fetched.code, 0) << fetched.out << fetched.err;
  EXPECT_EQ(ReadAll(out + "/result.txt"), "made-in-slurm\n");
  // Its worker served one job: it is forgotten, not listed offline.
  EXPECT_TRUE(WaitFor(
      [&] {
        Result workers = c_.Cli({"workers", "--json"});
        return workers.code == 0 && !absl::StrContains(workers.out, "\"slurm-");
      },
      10000))
      << c_.Cli({"workers"}).out;
}

TEST_F(SlurmJobs, JobOverTwoNodesRunsOnePartOnEach) {
  const int64_t id =
      SubmitCommand("two-nodes",
                    "echo \"part $DLBATCH_PART of $DLBATCH_PARTS "
                    "gpus=$CUDA_VISIBLE_DEVICES\"\nsleep 2",
                    "pool: 4\nmax_nodes: 2\n");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(id).dump(2);
  // One Slurm job on both nodes, one worker (and part) on each.
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  EXPECT_EQ(slurm->nodes, "n[1-2]");
  nlohmann::json running = c_.ShowJson(id);
  ASSERT_EQ(running["placement"].size(), 2u) << running.dump(2);
  // A core beside each GPU: two on each node.
  EXPECT_TRUE(absl::StrContains(ScontrolJob(slurm->id), "CPUs/Task=2 "))
      << ScontrolJob(slurm->id);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 60000))
      << c_.ShowJson(id).dump(2);
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "part 0 of 2")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "part 1 of 2")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "gpus=0,1")) << diary;
  // A pool that cannot split over the nodes is refused at submit.
  Result refused =
      c_.Cli({"submit", c_.JobFile("five.yaml",
                                   "name: five\nprofile: hpc\npool: 5\n"
                                   "max_nodes: 3\ncommand: [true]\n")});
  EXPECT_NE(refused.code, 0);
  EXPECT_TRUE(absl::StrContains(refused.err, "nodes")) << refused.err;
  // More nodes than the partition has: refused from sinfo's limits.
  Result too_big =
      c_.Cli({"submit", c_.JobFile("six.yaml",
                                   "name: six\nprofile: hpc\npool: 6\n"
                                   "max_nodes: 3\ncommand: [true]\n")});
  EXPECT_NE(too_big.code, 0);
  EXPECT_TRUE(absl::StrContains(too_big.err, "Slurm partition 'gpu' has 2"))
      << too_big.err;
}

// A CPU-only profile (gpus_per_node: 0): the pool's CPU slots are asked of
// Slurm as each node's CPUs (--cpus-per-task, one task per node), the
// node's worker offers the CPUs Slurm gave it, and the job runs.
TEST_F(SlurmJobs, CpuJobOfPoolTwoRunsOnTheCpusSlurmGaveItsNode) {
  const int64_t id = c_.Submit(c_.JobFile(
      "cpu-two.yaml",
      "name: cpu-two\nprofile: cpus\npool: 2\n"
      "command: [sh, -c, 'echo \"part $DLBATCH_PART of $DLBATCH_PARTS "
      "devices=$DLBATCH_DEVICES pool=$DLBATCH_POOL\"']\n"));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 60000))
      << c_.ShowJson(id).dump(2) << Squeue();
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "part 0 of 1 devices=0,1 pool=2"))
      << diary;
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  const std::string shown = ScontrolJob(slurm->id);
  EXPECT_TRUE(absl::StrContains(shown, "NumCPUs=2 ")) << shown;
  EXPECT_TRUE(absl::StrContains(shown, "CPUs/Task=2 ")) << shown;
  EXPECT_TRUE(absl::StrContains(
      c_.Logs(), absl::StrCat("worker 'slurm-", slurm->id, "-0' (#")))
      << c_.Logs();
  EXPECT_TRUE(absl::StrContains(c_.Logs(), "profile 'cpus' with 2 slots"))
      << c_.Logs();

  // A pool over both nodes' CPUs: as few nodes as hold it, an even share
  // (a node's CPUs) on each.
  const int64_t spread = c_.Submit(c_.JobFile(
      "cpu-four.yaml",
      "name: cpu-four\nprofile: cpus\npool: 4\nmax_nodes: 2\n"
      "command: [sh, -c, 'echo \"part $DLBATCH_PART of $DLBATCH_PARTS "
      "devices=$DLBATCH_DEVICES\"']\n"));
  ASSERT_TRUE(c_.WaitState(spread, "JOB_STATE_FINISHED", 60000))
      << c_.ShowJson(spread).dump(2) << Squeue();
  const std::string spread_diary = Diary(spread);
  EXPECT_TRUE(absl::StrContains(spread_diary, "part 0 of 2 devices=0,1"))
      << spread_diary;
  EXPECT_TRUE(absl::StrContains(spread_diary, "part 1 of 2 devices=0,1"))
      << spread_diary;
  std::optional<SlurmRow> spread_slurm = SlurmJobOf(spread);
  ASSERT_TRUE(spread_slurm.has_value()) << Squeue();
  EXPECT_EQ(spread_slurm->nodes, "n[1-2]");
  EXPECT_TRUE(absl::StrContains(ScontrolJob(spread_slurm->id), "NumCPUs=4 "))
      << ScontrolJob(spread_slurm->id);
}

// A pool no node of the partition can hold is refused at submit, from
// sinfo's CPUs per node, rather than left to wait in Slurm for good.
TEST_F(SlurmJobs, CpuPoolLargerThanANodesCpusIsRefusedAtSubmit) {
  Result refused =
      c_.Cli({"submit", c_.JobFile("cpu-three.yaml",
                                   "name: cpu-three\nprofile: cpus\npool: 3\n"
                                   "command: [true]\n")});
  EXPECT_NE(refused.code, 0) << refused.out;
  EXPECT_TRUE(absl::StrContains(
      refused.err, "pool 3 needs 2 nodes of profile 'cpus' (2 CPUs each)"))
      << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "max_nodes")) << refused.err;
  Result jobs = c_.Cli({"jobs", "--json"});
  EXPECT_FALSE(absl::StrContains(jobs.out, "cpu-three")) << jobs.out;
  EXPECT_TRUE(LiveSlurmJobs().empty()) << Squeue();
}

// A worker offering fewer CPU slots than its job was given on the node:
// the job fails at once, saying why, and its allocation is given back.
TEST_F(SlurmJobs, AnAllocationThatCannotHoldTheJobFailsAtOnceAndIsReleased) {
  const int64_t id = c_.Submit(c_.JobFile(
      "narrow.yaml",
      "name: narrow\nprofile: narrow\npool: 2\ncommand: [sleep, '300']\n"));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FAILED", 60000))
      << c_.ShowJson(id).dump(2) << Squeue();
  const std::string reason = Field(id, "reason");
  EXPECT_TRUE(absl::StrContains(
      reason, "Slurm gave node 0 1 CPU; the job needs 2 on each node"))
      << reason;
  EXPECT_TRUE(absl::StrContains(Diary(id), "Slurm gave node 0 1 CPU"))
      << Diary(id);
  // Released without the linger an ended job's Slurm job gets (15 s).
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 10000))
      << Squeue();
  // Ended either way the release races: the worker leaves when the
  // scheduler refuses it (the Slurm job COMPLETED), or the scancel the
  // scheduler sends when the job ends gets there first (CANCELLED).
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  EXPECT_TRUE(absl::StartsWith(slurm->state, "CANCELLED") ||
              slurm->state == "COMPLETED")
      << Squeue();
}

TEST_F(SlurmJobs, NodesWorkerKilledMidTwoNodeJobRequeuesItLeavingNothing) {
  const int64_t id = SubmitCommand("lose-node", "echo started\nsleep 300",
                                   "pool: 4\nmax_nodes: 2\n");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(id).dump(2);
  std::optional<SlurmRow> first = SlurmJobOf(id);
  ASSERT_TRUE(first.has_value()) << Squeue();
  pid_t worker = 0;
  ASSERT_TRUE(WaitFor([&] { return (worker = WorkerOfNode(first->id, 1)) > 0; },
                      10000));
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  // Lost with its part: the job goes back to the queue (attempt 2 next),
  // saying which worker it lost, and its first Slurm job ends.
  ASSERT_TRUE(WaitFor(
      [&] {
        nlohmann::json j = c_.ShowJson(id);
        return j.is_object() && j.value("attempt", 0) >= 2;
      },
      60000))
      << c_.ShowJson(id).dump(2) << Squeue();
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(
      diary, absl::StrCat("worker 'slurm-", first->id, "-1'")))
      << diary;
  EXPECT_TRUE(absl::StrContains(diary, "requeued")) << diary;
  EXPECT_TRUE(WaitFor(
      [&] {
        for (const SlurmRow& r : LiveSlurmJobs()) {
          if (r.id == first->id) return false;
        }
        return true;
      },
      60000))
      << Squeue();
  // Cancelled in its second attempt: nothing of it is left in Slurm.
  ASSERT_EQ(c_.Cli({"cancel", std::to_string(id)}).code, 0);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_CANCELLED", 60000))
      << c_.ShowJson(id).dump(2);
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
}

TEST_F(SlurmJobs, DrainedNodeShowsSlurmsReasonAndCancelOfPendingAndRunning) {
  ASSERT_EQ(Exec({"scontrol", "update", "nodename=n2", "state=drain",
                  "reason=maintenance"})
                .code,
            0);
  const int64_t pending =
      SubmitCommand("pending", "echo never", "pool: 4\nmax_nodes: 2\n");
  std::string reason;
  ASSERT_TRUE(WaitFor(
      [&] {
        reason = Field(pending, "wait_reason");
        return absl::StartsWith(reason, "waiting in Slurm: ");
      },
      30000))
      << reason;
  EXPECT_TRUE(absl::StrContains(reason, "(partition gpu)")) << reason;
  Result show = c_.Cli({"show", std::to_string(pending)});
  EXPECT_TRUE(absl::StrContains(show.out, "waiting in Slurm")) << show.out;
  // Held, it gives its Slurm job back; released, it is submitted again.
  const int64_t first_slurm = SlurmJobOf(pending)->id;
  ASSERT_EQ(c_.Cli({"hold", std::to_string(pending)}).code, 0);
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 20000))
      << Squeue();
  ASSERT_EQ(c_.Cli({"release", std::to_string(pending)}).code, 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        std::optional<SlurmRow> again = SlurmJobOf(pending);
        return again && again->id != first_slurm && again->state == "PENDING";
      },
      20000))
      << Squeue();

  const int64_t running = SubmitCommand("running", "echo started\nsleep 300");
  ASSERT_TRUE(c_.WaitState(running, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(running).dump(2);
  Result cancel =
      c_.Cli({"cancel", std::to_string(pending), std::to_string(running)});
  EXPECT_EQ(cancel.code, 0) << cancel.out << cancel.err;
  EXPECT_TRUE(c_.WaitState(pending, "JOB_STATE_CANCELLED", 10000));
  EXPECT_TRUE(c_.WaitState(running, "JOB_STATE_CANCELLED", 30000))
      << c_.ShowJson(running).dump(2);
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
  Exec({"scontrol", "update", "nodename=n2", "state=resume"});
}

TEST_F(SlurmJobs, TimeLimitStopsTheJobAndItsSlurmJob) {
  const int64_t id =
      SubmitCommand("limited", "echo started\nsleep 300", "time_limit: 3s\n");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FAILED", 60000))
      << c_.ShowJson(id).dump(2);
  EXPECT_TRUE(absl::StrContains(Field(id, "reason"), "time limit"))
      << Field(id, "reason");
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
}

TEST_F(SlurmJobs, SchedulerKilledMidJobAdoptsItAndCancelsAStranger) {
  const int64_t id = SubmitCommand(
      "adopted",
      "for i in 1 2 3 4 5 6 7 8; do echo \"tick $i\"; sleep 1; done\n"
      "echo done > \"$DLBATCH_OUTPUT_DIR/done.txt\"");
  ASSERT_TRUE(
      WaitFor([&] { return absl::StrContains(Diary(id), "tick 1"); }, 60000))
      << c_.ShowJson(id).dump(2);
  c_.KillScheduler(SIGKILL);
  // A Slurm job of this scheduler's name form that its store does not know.
  const std::string instance = InstanceOf(c_);
  ASSERT_EQ(instance.size(), 8u) << c_.Logs();
  Result stray = Exec({"sbatch", "--parsable",
                       absl::StrCat("--job-name=dlbatch-", instance, "-999999"),
                       "--output=/dev/null", "--wrap", "sleep 300"});
  ASSERT_EQ(stray.code, 0) << stray.err;
  c_.StartScheduler();
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 60000))
      << c_.ShowJson(id).dump(2);
  nlohmann::json job = c_.ShowJson(id);
  EXPECT_EQ(job["attempt"].get<int>(), 1) << job.dump(2);
  const std::string diary = Diary(id);
  for (int i = 1; i <= 8; ++i) {
    const std::string tick = absl::StrCat("tick ", i, "\n");
    const size_t first = diary.find(tick);
    EXPECT_NE(first, std::string::npos) << diary;
    EXPECT_EQ(diary.find(tick, first + 1), std::string::npos) << diary;
  }
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
}

// Two schedulers, each with its own state folder, on one Slurm: one killed
// (SIGKILL) and restarted adopts its own job and leaves the other's running
// (both are dlbatch job 1), and leaves alone a Slurm job named as before
// instance ids that its store does not know.
TEST_F(SlurmJobs, TwoSchedulersShareSlurmAndARestartLeavesTheOthersJobs) {
  Cluster other;
  const std::string other_nodes = other.dir() + "/nodes";
  fs::create_directories(other_nodes);
  const std::string other_config = other.dir() + "/scheduler.yaml";
  WriteAll(other_config,
           absl::StrCat("profiles:\n  hpc:\n    type: slurm\n"
                        "    partition: gpu\n    gpus_per_node: 2\n"
                        "    bin_dir: ",
                        BinDir(), "\n    node_dir: ", other_nodes, "\n"));
  other.StartScheduler({"--config", other_config, "--heartbeat-timeout", "5s"},
                       "127.0.0.1:0");
  const std::string mine = InstanceOf(c_);
  const std::string theirs = InstanceOf(other);
  ASSERT_EQ(mine.size(), 8u) << c_.Logs();
  ASSERT_EQ(theirs.size(), 8u) << other.Logs();
  ASSERT_NE(mine, theirs);
  const std::string ticks =
      "for i in $(seq 1 12); do echo \"tick $i\"; sleep 1; done\n"
      "echo done > \"$DLBATCH_OUTPUT_DIR/done.txt\"";
  const int64_t id = SubmitCommand("mine", ticks);
  UseScheduler(other);
  const int64_t their_id = SubmitCommand("theirs", ticks, "pool: 1\n", &other);
  auto diary_of = [](Cluster& c, int64_t job) {
    UseScheduler(c);
    return c.Cli({"diary", std::to_string(job)}).out;
  };
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(diary_of(c_, id), "tick 1") &&
               absl::StrContains(diary_of(other, their_id), "tick 1");
      },
      60000))
      << Squeue() << other.Logs();
  std::optional<SlurmRow> their_slurm = SlurmJobOf(their_id, &other);
  ASSERT_TRUE(their_slurm.has_value()) << Squeue();
  ASSERT_TRUE(SlurmJobOf(id).has_value()) << Squeue();

  c_.KillScheduler(SIGKILL);
  Result old_form = Exec({"sbatch", "--parsable", "--job-name=dlbatch-999998",
                          "--output=/dev/null", "--wrap", "sleep 300"});
  ASSERT_EQ(old_form.code, 0) << old_form.err;
  int64_t old_form_id = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(absl::StripAsciiWhitespace(old_form.out), &old_form_id));
  c_.StartScheduler();
  EXPECT_EQ(InstanceOf(c_), mine);  // the store's: a restart keeps it
  UseScheduler(c_);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 60000))
      << c_.ShowJson(id).dump(2) << Squeue();
  EXPECT_EQ(c_.ShowJson(id)["attempt"].get<int>(), 1);
  UseScheduler(other);
  ASSERT_TRUE(other.WaitState(their_id, "JOB_STATE_FINISHED", 60000))
      << other.ShowJson(their_id).dump(2) << Squeue() << other.Logs();
  nlohmann::json theirs_job = other.ShowJson(their_id);
  EXPECT_EQ(theirs_job["attempt"].get<int>(), 1) << theirs_job.dump(2);
  for (const auto& [c, job] :
       {std::pair<Cluster*, int64_t>{&c_, id}, {&other, their_id}}) {
    const std::string diary = diary_of(*c, job);
    for (int i = 1; i <= 12; ++i) {
      const std::string tick = absl::StrCat("tick ", i, "\n");
      const size_t first = diary.find(tick);
      EXPECT_NE(first, std::string::npos) << diary;
      EXPECT_EQ(diary.find(tick, first + 1), std::string::npos) << diary;
    }
  }
  // Their Slurm job ended by itself, never cancelled by the restart.
  ASSERT_TRUE(WaitFor(
      [&] {
        std::optional<SlurmRow> r = SlurmJobOf(their_id, &other);
        return r && r->state == "COMPLETED";
      },
      30000))
      << Squeue();
  // The old-named Slurm job is left alone, with a log line.
  bool old_form_alive = false;
  for (const SlurmRow& r : LiveSlurmJobs()) {
    old_form_alive = old_form_alive || r.id == old_form_id;
  }
  EXPECT_TRUE(old_form_alive) << Squeue();
  EXPECT_TRUE(absl::StrContains(c_.Logs(),
                                "named as before scheduler "
                                "instances"))
      << c_.Logs();
  Exec({"scancel", std::to_string(old_form_id)});
  UseScheduler(c_);
}

// A user's job on a root scheduler goes to Slurm as that user (sbatch
// --uid/--gid): its worker and its command run as them, and they fetch its
// outputs with their own token.
TEST_F(SlurmJobs, AnotherUsersJobRunsAsThatUserInSlurm) {
  // node_dir is the nodes' shared scratch, which every user may write (as
  // /tmp), under a folder they may pass through.
  ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
  ASSERT_EQ(chmod(node_dir_.c_str(), 01777), 0);
  Result added = c_.Cli({"admin", "user", "add", "nobody"});
  ASSERT_EQ(added.code, 0) << added.err;
  const std::map<std::string, std::string> as_nobody = {
      {"DLBATCH_TOKEN", std::string(absl::StripAsciiWhitespace(added.out))}};
  const std::string job =
      c_.JobFile("as-nobody.yaml",
                 "name: as-nobody\nprofile: hpc\npool: 1\n"
                 "command: [sh, -c, 'echo \"uid=$(id -u) gid=$(id -g)\"; "
                 "echo mine > \"$DLBATCH_OUTPUT_DIR/who.txt\"']\n");
  Result submit = c_.Cli({"submit", "-q", job}, as_nobody);
  ASSERT_EQ(submit.code, 0) << submit.err;
  int64_t id = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(submit.out), &id))
      << submit.out;
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 90000))
      << c_.ShowJson(id).dump(2) << Diary(id);
  EXPECT_EQ(Field(id, "user"), "nobody");
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "uid=65534 gid=65534")) << diary;
  // Slurm ran the batch job as nobody: its output file is theirs.
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  bool found = false;
  for (const auto& e : fs::directory_iterator(node_dir_)) {
    if (e.path().extension() != ".out" ||
        !absl::StrContains(e.path().filename().string(), slurm->name)) {
      continue;
    }
    struct stat st;
    ASSERT_EQ(stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u) << e.path();
    found = true;
  }
  EXPECT_TRUE(found) << "no Slurm output file named for " << slurm->name;
  const std::string out = c_.dir() + "/fetched-by-nobody";
  Result fetched =
      c_.Cli({"fetch-outputs", std::to_string(id), "-o", out}, as_nobody);
  ASSERT_EQ(fetched.code, 0) << fetched.out << fetched.err;
  EXPECT_EQ(ReadAll(out + "/who.txt"), "mine\n");
}

TEST_F(SlurmJobs, ScancelByHandIsReportedWithSlurmsReason) {
  // scancel's SIGTERM reaches the job's command as well as its worker, whose
  // report of the end ("exit code 143") may come before squeue says
  // CANCELLED: an end by a signal waits for Slurm's word, so the job fails
  // with Slurm's reason however the two race.
  const int64_t id = SubmitCommand("by-hand", "echo started\nsleep 300");
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(id).dump(2);
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  ASSERT_EQ(Exec({"scancel", std::to_string(slurm->id)}).code, 0);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FAILED", 30000))
      << c_.ShowJson(id).dump(2);
  EXPECT_TRUE(absl::StrContains(Field(id, "reason"), "cancelled in Slurm"))
      << Field(id, "reason");
}

// Slurm preempts the Slurm job of a job of `profile` for a job of the
// high partition: SIGTERM to the job's command and its worker (which stops
// the job as a preemption), then PREEMPTED. The job is queued again as
// preempted (not counted against its attempts), waits in Slurm while the
// high job holds the nodes, and its next attempt finishes.
void SlurmJobs::ExpectSlurmsPreemptionRequeues(const std::string& profile) {
  const std::string yaml = absl::StrCat(
      "name: preempted\nprofile: ", profile,
      "\npool: 2\ncommand:\n  - sh\n  - -c\n"
      "  - |\n"
      "    trap 'echo got TERM; exit 0' TERM\n"
      "    echo attempt $DLBATCH_ATTEMPT\n"
      "    if [ \"$DLBATCH_ATTEMPT\" = 1 ]; then sleep 300 & wait; fi\n"
      "    echo done\n");
  const int64_t id = c_.Submit(c_.JobFile("preempted.yaml", yaml));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(id).dump(2);
  ASSERT_TRUE(
      WaitFor([&] { return absl::StrContains(Diary(id), "attempt 1"); }, 30000))
      << Diary(id);
  std::optional<SlurmRow> first = SlurmJobOf(id);
  ASSERT_TRUE(first.has_value()) << Squeue();
  Result high = Exec({"sbatch", "--parsable", "--partition=high", "--nodes=2",
                      "--gres=gpu:2", "--job-name=high-preemptor",
                      absl::StrCat("--output=", node_dir_, "/high-%j.out"),
                      "--wrap", "sleep 8"});
  ASSERT_EQ(high.code, 0) << high.out << high.err;
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 180000);
  nlohmann::json show = c_.ShowJson(id);
  ASSERT_EQ(wait.code, 0) << wait.out << show.dump(2) << Diary(id) << Squeue();
  EXPECT_EQ(show.value("state", ""), "finished") << show.dump(2);
  EXPECT_EQ(show.value("attempt", 0), 2) << show.dump(2);
  ASSERT_TRUE(show.contains("preemptions") && show["preemptions"].is_array() &&
              show["preemptions"].size() == 1)
      << show.dump(2);
  const nlohmann::json& p = show["preemptions"][0];
  EXPECT_EQ(p.value("kind", ""), "slurm") << p.dump();
  EXPECT_EQ(p.value("by_job", -1), 0) << p.dump();
  EXPECT_EQ(p.value("attempt", 0), 1) << p.dump();
  EXPECT_TRUE(p.value("done", false)) << p.dump();
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "was preempted by Slurm")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "got TERM")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "does not count against")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "done")) << diary;
  // The first Slurm job ended PREEMPTED; nothing of dlbatch's is left.
  EXPECT_TRUE(absl::StrContains(ScontrolJob(first->id), "JobState=PREEMPTED"))
      << ScontrolJob(first->id);
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
}

TEST_F(SlurmJobs, SlurmsOwnPreemptionRequeuesTheJobAsPreemptedAndItResumes) {
  ExpectSlurmsPreemptionRequeues("low");  // PreemptMode=CANCEL
}

// Under PreemptMode=REQUEUE Slurm requeues only jobs that let it; dlbatch's
// are submitted with --no-requeue, so Slurm cancels them instead, and says
// PREEMPTED as under CANCEL: the job is requeued by dlbatch alike.
TEST_F(SlurmJobs, SlurmsPreemptModeRequeueCancelsTheJobAndItIsRequeued) {
  ExpectSlurmsPreemptionRequeues("requeue");
}

// dlbatch preempts a job of its own on a Slurm profile (`urgent`,
// preemption by priority): both nodes run a priority-0 job, a priority-10
// job waits in Slurm for resources, one of them is asked to stop through
// its worker in its Slurm job, its Slurm job ends with it (none of its is
// left in Slurm), the waiting job starts on the node it freed, and the
// victim is queued again as preempted and finishes on its next attempt.
TEST_F(SlurmJobs, PreemptedSlurmProfileJobLeavesNoSlurmJobAndResumes) {
  auto low_job = [&](const std::string& name) {
    return c_.Submit(c_.JobFile(
        name + ".yaml",
        absl::StrCat(
            "name: ", name,
            "\nprofile: urgent\npool: 2\ncommand:\n  - sh\n  - -c\n"
            "  - |\n"
            "    trap 'echo got TERM; exit 0' TERM\n"
            "    echo attempt $DLBATCH_ATTEMPT\n"
            "    if [ \"$DLBATCH_ATTEMPT\" = 1 ]; then sleep 300 & wait; fi\n"
            "    echo done\n")));
  };
  const int64_t a = low_job("low-a");
  const int64_t b = low_job("low-b");
  for (int64_t id : {a, b}) {
    ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_RUNNING", 60000))
        << c_.ShowJson(id).dump(2) << Squeue();
    ASSERT_TRUE(WaitFor(
        [&] { return absl::StrContains(Diary(id), "attempt 1"); }, 30000))
        << Diary(id);
  }
  std::map<int64_t, int64_t> first_slurm;
  for (int64_t id : {a, b}) {
    std::optional<SlurmRow> slurm = SlurmJobOf(id);
    ASSERT_TRUE(slurm.has_value()) << Squeue();
    first_slurm[id] = slurm->id;
  }
  const int64_t high = c_.Submit(
      c_.JobFile("high.yaml",
                 "name: high\nprofile: urgent\npool: 2\npriority: 10\n"
                 "command: [sh, -c, 'echo high runs; sleep 3']\n"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(Diary(high), "[dlbatch] preempting job ");
      },
      60000))
      << c_.ShowJson(high).dump(2) << Diary(high) << Squeue();
  Result wait = c_.Cli({"wait", std::to_string(high)}, {}, 120000);
  ASSERT_EQ(wait.code, 0) << wait.out << c_.ShowJson(high).dump(2)
                          << Diary(high) << Squeue();
  EXPECT_TRUE(absl::StrContains(Diary(high), "(checkpointing; at most 30s)"))
      << Diary(high);

  // Exactly one of the two was preempted, by the high job.
  int64_t victim = 0, spared = 0;
  for (int64_t id : {a, b}) {
    const nlohmann::json show = c_.ShowJson(id);
    if (show.contains("preemptions") && !show["preemptions"].empty()) {
      EXPECT_EQ(victim, 0) << "both were preempted";
      victim = id;
    } else {
      spared = id;
    }
  }
  ASSERT_NE(victim, 0) << c_.ShowJson(a).dump(2) << c_.ShowJson(b).dump(2);
  ASSERT_NE(spared, 0);
  // The victim's first Slurm job is over: nothing of its first attempt is
  // left in Slurm.
  EXPECT_TRUE(WaitFor(
      [&] {
        for (const SlurmRow& r : LiveSlurmJobs()) {
          if (r.id == first_slurm[victim]) return false;
        }
        return true;
      },
      30000))
      << Squeue();
  wait = c_.Cli({"wait", std::to_string(victim)}, {}, 120000);
  const nlohmann::json show = c_.ShowJson(victim);
  ASSERT_EQ(wait.code, 0) << wait.out << show.dump(2) << Diary(victim)
                          << Squeue();
  EXPECT_EQ(show.value("state", ""), "finished") << show.dump(2);
  EXPECT_EQ(show.value("attempt", 0), 2) << show.dump(2);
  ASSERT_EQ(show["preemptions"].size(), 1u) << show.dump(2);
  const nlohmann::json& p = show["preemptions"][0];
  EXPECT_EQ(p.value("kind", ""), "priority") << p.dump();
  EXPECT_EQ(p.value("by_job", 0), high) << p.dump();
  EXPECT_EQ(p.value("attempt", 0), 1) << p.dump();
  EXPECT_TRUE(p.value("done", false)) << p.dump();
  const std::string diary = Diary(victim);
  EXPECT_TRUE(absl::StrContains(diary, "got TERM")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "does not count against")) << diary;
  EXPECT_TRUE(absl::StrContains(diary, "done")) << diary;
  EXPECT_FALSE(absl::StrContains(diary, "was cancelled in Slurm")) << diary;
  // The other ran on undisturbed.
  EXPECT_EQ(c_.State(spared), "JOB_STATE_RUNNING");
  EXPECT_EQ(c_.ShowJson(spared).value("attempt", 0), 1);
  ASSERT_EQ(c_.Cli({"cancel", std::to_string(spared)}).code, 0);
  ASSERT_TRUE(c_.WaitState(spared, "JOB_STATE_CANCELLED", 60000));
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 30000))
      << Squeue();
}

// Train jobs need dlbatch-train beside the worker and Fashion-MNIST (read
// in place: the test's nodes share this machine's files).
class SlurmTrainJobs : public SlurmJobs {
 protected:
  void SetUp() override {
    if (!fs::exists(BinDir() + "/dlbatch-train")) {
      GTEST_SKIP() << BinDir()
                   << "/dlbatch-train is not built (cmake --build build "
                      "--target dlbatch-train)";
    }
    if (!fs::exists(FashionMnistDir() + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << FashionMnistDir();
    }
    SlurmJobs::SetUp();
  }
  std::vector<float> FetchWeights(int64_t id, const std::string& into) {
    return FetchTrainedWeights(c_, id, into);
  }
};

TEST_F(SlurmTrainJobs, RanksOverBothNodesReachTheOneNodeWeights) {
  const std::string options = R"(    mini_batch_size: 32
    max_iterations: 12
    verbose_frequency: 4
    execution_environment: cpu
)";
  // Both GPUs of one node first, then the same pool's ranks over both.
  const int64_t single = c_.Submit(c_.JobFile(
      "single.yaml", LenetJob(FashionMnistDir(), options,
                              "name: single\nprofile: hpc\npool: 2\n")));
  Result wait = c_.Cli({"wait", std::to_string(single)}, {}, 300000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(single);
  std::vector<float> one_node = FetchWeights(single, c_.dir() + "/single");

  const int64_t spread = c_.Submit(c_.JobFile(
      "spread.yaml",
      LenetJob(FashionMnistDir(), options,
               "name: spread\nprofile: hpc\npool: 4\nmax_nodes: 2\n")));
  ASSERT_TRUE(c_.WaitState(spread, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(spread).dump(2);
  std::optional<SlurmRow> slurm = SlurmJobOf(spread);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  EXPECT_EQ(slurm->nodes, "n[1-2]");
  wait = c_.Cli({"wait", std::to_string(spread)}, {}, 300000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(spread);
  EXPECT_EQ(c_.ShowJson(spread)["placement"].size(), 2u);
  std::vector<float> two_nodes = FetchWeights(spread, c_.dir() + "/spread");

  ASSERT_EQ(two_nodes.size(), one_node.size());
  ASSERT_FALSE(one_node.empty());
  EXPECT_LT(RelativeDifference(two_nodes, one_node), 1e-4);
}

// The embedded trainer on a CPU-only profile: pool 2 is two ranks on the
// two CPUs Slurm gave the node.
TEST_F(SlurmTrainJobs, CpuTrainJobOfPoolTwoTrainsWithTwoRanks) {
  const int64_t id = c_.Submit(c_.JobFile(
      "cpu-train.yaml", LenetJob(FashionMnistDir(), R"(    mini_batch_size: 32
    max_iterations: 8
    execution_environment: cpu
)",
                                 "name: cpu-train\nprofile: cpus\npool: 2\n")));
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 300000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(id) << Squeue();
  EXPECT_EQ(c_.State(id), "JOB_STATE_FINISHED");
  const std::string diary = Diary(id);
  // Two ranks, as threads of the node's one trainer process.
  EXPECT_TRUE(absl::StrContains(
      diary,
      ": 1 process, 2 threads, each mini-batch of 32 split over 2 "
      "replicas"))
      << diary;
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  EXPECT_TRUE(absl::StrContains(ScontrolJob(slurm->id), "CPUs/Task=2 "))
      << ScontrolJob(slurm->id);
}

// One scheduler, a worker of its own (profile local) and the Slurm
// profile: a sweep runs on Slurm while command jobs run on both, and the
// CLI's jobs, fetch-outputs and monitor treat them alike.
TEST_F(SlurmTrainJobs, LocalAndSlurmProfilesMixOnOneScheduler) {
  c_.StartWorker("here", 2);
  ASSERT_TRUE(c_.WaitWorkers(1));
  const std::string sweep_file = c_.JobFile(
      "sweep.yaml", LenetJob(FashionMnistDir(), R"(    mini_batch_size: 32
    max_iterations: 8
    execution_environment: cpu
)",
                             "name: mixed-sweep\nprofile: hpc\npool: 1\n") +
                        "sweep:\n  initial_learn_rate: [0.01, 0.05]\n");
  const std::string write_where =
      "command: [sh, -c, 'echo \"$DLBATCH_JOB_ID\" > "
      "\"$DLBATCH_OUTPUT_DIR/where.txt\"']\n";
  const int64_t here = c_.Submit(c_.JobFile(
      "here.yaml", "name: on-local\nprofile: local\n" + write_where));
  const int64_t there = c_.Submit(c_.JobFile(
      "there.yaml", "name: on-slurm\nprofile: hpc\npool: 1\n" + write_where));
  Result sweep = c_.Cli({"submit", "--follow", sweep_file}, {}, 600000);
  ASSERT_EQ(sweep.code, 0) << sweep.out << sweep.err;
  EXPECT_TRUE(absl::StrContains(sweep.out, "2 jobs, 2 finished")) << sweep.out;
  for (int64_t id : {here, there}) {
    ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 120000))
        << c_.ShowJson(id).dump(2) << Diary(id);
  }

  Result jobs = c_.Cli({"jobs", "--json"});
  ASSERT_EQ(jobs.code, 0) << jobs.err;
  std::map<std::string, std::string> profile_of;
  const nlohmann::json listed = nlohmann::json::parse(jobs.out)["jobs"];
  EXPECT_EQ(listed.size(), 4u) << jobs.out;  // and the sweep's two
  for (const auto& job : listed) {
    EXPECT_EQ(job["state"], "finished") << job.dump();
    profile_of[job["name"].get<std::string>()] =
        job["profile"].get<std::string>();
  }
  EXPECT_EQ(profile_of["on-local"], "local") << jobs.out;
  EXPECT_EQ(profile_of["on-slurm"], "hpc") << jobs.out;
  int on_hpc = 0;
  for (const auto& [name, profile] : profile_of) on_hpc += profile == "hpc";
  EXPECT_EQ(on_hpc, static_cast<int>(profile_of.size()) - 1) << jobs.out;
  // The local job never touched Slurm; the Slurm one had a Slurm job.
  EXPECT_FALSE(SlurmJobOf(here).has_value()) << Squeue();
  EXPECT_TRUE(SlurmJobOf(there).has_value()) << Squeue();

  for (int64_t id : {here, there}) {
    const std::string out = absl::StrCat(c_.dir(), "/fetched-", id);
    Result fetched = c_.Cli({"fetch-outputs", std::to_string(id), "-o", out});
    ASSERT_EQ(fetched.code, 0) << fetched.out << fetched.err;
    EXPECT_EQ(ReadAll(out + "/where.txt"), absl::StrCat(id, "\n"));
  }
  Result monitor = c_.Cli({"monitor", "--once"});
  ASSERT_EQ(monitor.code, 0) << monitor.err;
  for (const char* name : {"on-local", "on-slurm", "mixed-sweep"}) {
    EXPECT_TRUE(absl::StrContains(monitor.out, name)) << monitor.out;
  }
}

TEST_F(SlurmTrainJobs, ScancelByHandRequeuesFromTheCheckpointAndResumes) {
  const int64_t id = c_.Submit(c_.JobFile(
      "resume.yaml", LenetJob(FashionMnistDir(), R"(    mini_batch_size: 64
    max_iterations: 400
    verbose_frequency: 100
    checkpoint_frequency: 100
    checkpoint_frequency_unit: iteration
    execution_environment: cpu
)",
                              "name: resume\nprofile: hpc\npool: 1\n")));
  ASSERT_TRUE(WaitFor(
      [&] {
        nlohmann::json p = c_.ShowJson(id).value("progress", nlohmann::json());
        return JsonInt(p, "checkpoint_iteration") >= 100;
      },
      180000))
      << Diary(id);
  std::optional<SlurmRow> slurm = SlurmJobOf(id);
  ASSERT_TRUE(slurm.has_value()) << Squeue();
  ASSERT_EQ(Exec({"scancel", std::to_string(slurm->id)}).code, 0);
  Result wait = c_.Cli({"wait", std::to_string(id)}, {}, 300000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(id);
  nlohmann::json show = c_.ShowJson(id);
  EXPECT_EQ(show.value("attempt", 0), 2) << show.dump(2);
  const std::string diary = Diary(id);
  EXPECT_TRUE(absl::StrContains(diary, "was cancelled in Slurm")) << diary;
  EXPECT_TRUE(absl::StrContains(
      diary, "resumes from the checkpoint stored at iteration"))
      << diary;
  EXPECT_EQ(JsonInt(show["progress"], "iteration"), 400);
}

// dlbatch preempts a train job on a Slurm profile: its worker in its Slurm
// job asks the trainer to checkpoint and stop, the job is queued again,
// and its next attempt (a new Slurm job) resumes from the checkpoint
// written at the signal, with nothing lost, and trains to the end. The
// other node runs a job that is not preemptible.
TEST_F(SlurmTrainJobs, PreemptedTrainJobResumesFromTheCheckpointAtTheSignal) {
  const int64_t pinned = c_.Submit(
      c_.JobFile("pinned.yaml",
                 "name: pinned\nprofile: urgent\npool: 2\npreemptible: false\n"
                 "command: [sh, -c, 'sleep 300']\n"));
  ASSERT_TRUE(c_.WaitState(pinned, "JOB_STATE_RUNNING", 60000))
      << c_.ShowJson(pinned).dump(2) << Squeue();
  const int64_t train = c_.Submit(c_.JobFile(
      "train.yaml", LenetJob(FashionMnistDir(), R"(    mini_batch_size: 64
    max_iterations: 600
    verbose_frequency: 100
    checkpoint_frequency: 100
    checkpoint_frequency_unit: iteration
    execution_environment: cpu
)",
                             "name: train\nprofile: urgent\npool: 2\n")));
  ASSERT_TRUE(WaitFor(
      [&] {
        nlohmann::json p =
            c_.ShowJson(train).value("progress", nlohmann::json());
        return JsonInt(p, "checkpoint_iteration") >= 100;
      },
      240000))
      << Diary(train);
  std::optional<SlurmRow> first = SlurmJobOf(train);
  ASSERT_TRUE(first.has_value()) << Squeue();
  const int64_t high = c_.Submit(
      c_.JobFile("high.yaml",
                 "name: high\nprofile: urgent\npool: 2\npriority: 10\n"
                 "command: [sh, -c, 'echo high runs']\n"));
  Result wait = c_.Cli({"wait", std::to_string(high)}, {}, 180000);
  ASSERT_EQ(wait.code, 0) << wait.out << Diary(high) << Diary(train)
                          << Squeue();
  EXPECT_TRUE(absl::StrContains(
      Diary(high), absl::StrCat("[dlbatch] preempting job ", train, " ")))
      << Diary(high);
  wait = c_.Cli({"wait", std::to_string(train)}, {}, 300000);
  const nlohmann::json show = c_.ShowJson(train);
  ASSERT_EQ(wait.code, 0) << wait.out << show.dump(2) << Diary(train);
  EXPECT_EQ(show.value("attempt", 0), 2) << show.dump(2);
  EXPECT_EQ(JsonInt(show["progress"], "iteration"), 600) << show.dump(2);
  ASSERT_EQ(show["preemptions"].size(), 1u) << show.dump(2);
  const nlohmann::json& p = show["preemptions"][0];
  EXPECT_EQ(p.value("kind", ""), "priority") << p.dump();
  EXPECT_EQ(JsonInt(p, "by_job"), high) << p.dump();
  // A checkpoint after the signal: nothing lost, resumed past the last
  // periodic one it was taken at.
  EXPECT_EQ(p.value("lost_s", -1.0), 0.0) << p.dump();
  EXPECT_GE(JsonInt(p, "resume_iteration"), 100) << p.dump();
  EXPECT_TRUE(absl::StrContains(
      Diary(train),
      absl::StrCat("resumes from iteration ", JsonInt(p, "resume_iteration"))))
      << Diary(train);
  // The first attempt's Slurm job is over; only the pinned job's runs.
  for (const SlurmRow& r : LiveSlurmJobs()) {
    EXPECT_NE(r.id, first->id) << Squeue();
  }
  EXPECT_EQ(c_.State(pinned), "JOB_STATE_RUNNING");
  ASSERT_EQ(c_.Cli({"cancel", std::to_string(pinned)}).code, 0);
  EXPECT_TRUE(WaitFor([&] { return LiveSlurmJobs().empty(); }, 60000))
      << Squeue();
}

TEST_F(SlurmJobs, ProfilesShowsSlurmsView) {
  Result r = c_.Cli({"profiles"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "slurm")) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out,
      "hpc: Slurm partition gpu: 2 nodes (2 idle, 0 allocated, 0 "
      "unavailable), 4 GPUs (0 allocated)"))
      << r.out;
}

}  // namespace
}  // namespace dlbatch::testing
