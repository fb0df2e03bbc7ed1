// Command jobs launched per slot and per node (`launch:`) through the real
// scheduler and two real workers: every process gets torchrun's variables
// (part 0's address and a port its worker found free, handed over through
// the scheduler's rendezvous), PyTorch DDP over gloo trains across the
// workers to the weights of one process on the global batch, every rank's
// output reaches the diary, and one rank's failure is the job's, by rank.
// The example job file itself (examples/pytorch/ddp-per-slot.yaml) reports
// its progress and checkpoints through the dlbatch module, and an attempt
// requeued mid-run resumes from its checkpoint to the same weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

bool HaveTorch() {
  return Exec({kPython, "-c", "import torch"}, {}, 120000).code == 0;
}

// `prefix` JSON... lines of the diary ("weights 1: [...]"), by what
// follows the prefix up to ':' (the rank, or "reference").
std::map<std::string, std::vector<double>> Weights(const std::string& text) {
  std::map<std::string, std::vector<double>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("weights ");
    const size_t colon = line.find(": [", at);
    if (at == std::string::npos || colon == std::string::npos) continue;
    out[line.substr(at + 8, colon - at - 8)] =
        nlohmann::json::parse(line.substr(colon + 2))
            .get<std::vector<double>>();
  }
  return out;
}

// The values after `key` ("master 127.0.0.1:") on each line that has it.
std::set<std::string> After(const std::string& text, const std::string& key) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    std::string rest = line.substr(at + key.size());
    out.insert(rest.substr(0, rest.find_first_of(" \t")));
  }
  return out;
}

class Launch : public ::testing::Test {
 protected:
  // Two workers of `slots` CPU slots each on this machine.
  void StartTwoWorkers(int slots) {
    c_.StartScheduler();
    c_.StartWorker("a", slots, "local", {"--host", "127.0.0.1"});
    c_.StartWorker("b", slots, "local", {"--host", "127.0.0.1"});
    ASSERT_TRUE(c_.WaitWorkers(2));
  }
  void CopyExample(const std::string& name) {
    std::filesystem::copy_file(
        std::string(DLBATCH_SOURCE_DIR) + "/examples/pytorch/" + name,
        c_.dir() + "/" + name,
        std::filesystem::copy_options::overwrite_existing);
  }
  std::string Diary(int64_t id) {
    return c_.Cli({"diary", std::to_string(id)}).out;
  }
  // The weights one process reaches on the whole batch in `steps` steps.
  std::vector<double> Reference(const std::string& steps = "30") {
    Result r = Exec(
        {kPython, c_.dir() + "/ddp_train.py", "--reference", "--steps", steps},
        {}, 300000);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return Weights(r.out)["reference"];
  }
  // Every rank 0..world-1 printed weights within float rounding of `want`.
  void ExpectRanksReach(const std::string& diary, int world,
                        const std::vector<double>& want) {
    std::map<std::string, std::vector<double>> got = Weights(diary);
    ASSERT_FALSE(want.empty());
    for (int r = 0; r < world; ++r) {
      const std::string rank = std::to_string(r);
      ASSERT_EQ(got[rank].size(), want.size()) << "rank " << r << "\n" << diary;
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::fabs(got[rank][i] - want[i]));
      EXPECT_LT(worst, 1e-5) << "rank " << r;
    }
    EXPECT_EQ(got.size(), static_cast<size_t>(world)) << diary;
  }

  Cluster c_;
};

// Test 1: DDP across two workers, one process per slot.
TEST_F(Launch, PerSlotDdpAcrossTwoWorkersTrainsAsOneProcessOnTheGlobalBatch) {
  if (!HaveTorch())
    GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  StartTwoWorkers(1);
  CopyExample("ddp_train.py");
  const int64_t id =
      c_.Submit(c_.JobFile("ddp.yaml", absl::StrCat(R"(name: ddp
pool: 2
max_nodes: 2
launch: per-slot
attach: [ddp_train.py]
command: [)",
                                                    kPython,
                                                    R"(, ddp_train.py]
)")));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 300000))
      << c_.State(id) << "\n"
      << Diary(id) << c_.Logs();
  const std::string diary = Diary(id);
  ExpectRanksReach(diary, 2, Reference());
  // Both ranks met at part 0's address on one port, found there (not a
  // fixed number), and each part's worker said what it launched.
  EXPECT_EQ(After(diary, "master ").size(), 1u) << diary;
  EXPECT_EQ(After(diary, "master ").count("127.0.0.1:29500"), 0u);
  EXPECT_NE(diary.find("launch: per-slot: part 0 of 2 runs rank 0 of 2"),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("launch: per-slot: part 1 of 2 runs rank 1 of 2"),
            std::string::npos)
      << diary;
  EXPECT_NE(diary.find("rank 0 of 2 (local rank 0)"), std::string::npos);
  EXPECT_NE(diary.find("rank 1 of 2 (local rank 0)"), std::string::npos);
  EXPECT_EQ(c_.ShowJson(id).value("spec", nlohmann::json()).value("launch", ""),
            "per-slot");
}

// Test 2: one process per worker, which starts that worker's two ranks
// from NNODES, NODE_RANK and NPROC_PER_NODE (Debian's torchrun cannot run
// on its Python: see per_node_launcher.py).
TEST_F(Launch, PerNodeLauncherStartsEachWorkersRanksAsTorchrunWould) {
  if (!HaveTorch())
    GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  StartTwoWorkers(2);
  CopyExample("ddp_train.py");
  CopyExample("per_node_launcher.py");
  const int64_t id = c_.Submit(c_.JobFile(
      "ddp.yaml", absl::StrCat(R"(name: ddp-nodes
pool: 4
max_nodes: 2
launch: per-node
attach: [ddp_train.py, per_node_launcher.py]
command: [)",
                               kPython, R"(, per_node_launcher.py, ddp_train.py]
)")));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 400000))
      << c_.State(id) << "\n"
      << Diary(id) << c_.Logs();
  const std::string diary = Diary(id);
  ExpectRanksReach(diary, 4, Reference());
  EXPECT_EQ(After(diary, "master ").size(), 1u) << diary;
  EXPECT_NE(diary.find("launch: per-node: part 1 of 2 runs rank 1 of 2"),
            std::string::npos)
      << diary;
  for (const char* who :
       {"rank 2 of 4 (local rank 0)", "rank 3 of 4 (local rank 1)"}) {
    EXPECT_NE(diary.find(who), std::string::npos) << who << "\n" << diary;
  }
}

// The example job files run `python3`: Debian's, which has torch, ahead of
// any other on PATH (the workers pass their PATH on to jobs).
void PreferDebiansPython() {
  const char* path = std::getenv("PATH");
  setenv("PATH", absl::StrCat("/usr/bin:", path ? path : "").c_str(), 1);
}

std::string ExampleJob(const std::string& name) {
  return std::string(DLBATCH_SOURCE_DIR) + "/examples/pytorch/" + name;
}

// Rows of `kind` ("train,") in a training_history.csv.
int HistoryRows(const std::string& csv, const std::string& kind) {
  int rows = 0;
  for (size_t at = 0; (at = csv.find('\n', at)) != std::string::npos; ++at) {
    if (csv.compare(at + 1, kind.size(), kind) == 0) ++rows;
  }
  return rows;
}

// The example job file as a user submits it: DDP over two workers that
// reports its progress and checkpoints through the dlbatch module.
TEST_F(Launch, TheExampleJobReportsProgressAndStoresItsCheckpoint) {
  if (!HaveTorch())
    GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  PreferDebiansPython();
  StartTwoWorkers(1);
  CopyExample("ddp_train.py");
  const int64_t id = c_.Submit(ExampleJob("ddp-per-slot.yaml"));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 300000))
      << c_.State(id) << "\n"
      << Diary(id) << c_.Logs();
  const std::string diary = Diary(id);
  const std::vector<double> reference = Reference("30");
  ExpectRanksReach(diary, 2, reference);

  const nlohmann::json show = c_.ShowJson(id);
  const nlohmann::json& p = show["progress"];
  EXPECT_EQ(p.value("iteration", 0), 30) << show.dump(2);
  EXPECT_EQ(p.value("iterations", 0), 30) << show.dump(2);
  ASSERT_TRUE(p["loss"].is_number()) << show.dump(2);
  EXPECT_GT(p["loss"].get<double>(), 0);
  ASSERT_TRUE(p["metrics"]["samples_per_s"].is_number()) << show.dump(2);
  EXPECT_GT(p["metrics"]["samples_per_s"].get<double>(), 0);
  // Checkpoints every 10 steps: the last one, of step 30, is stored.
  EXPECT_EQ(JsonInt(p, "checkpoint_iteration"), 30) << show.dump(2);

  const std::string out = c_.dir() + "/fetched";
  Result fetch = c_.Cli({"fetch-outputs", std::to_string(id), "-o", out});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  const std::string csv = ReadAll(out + "/training_history.csv");
  EXPECT_EQ(csv.rfind("kind,iteration,", 0), 0u) << csv;
  EXPECT_EQ(HistoryRows(csv, "train,"), 30) << csv;
  EXPECT_EQ(
      nlohmann::json::parse(ReadAll(out + "/weights.json"), nullptr, false)
          .size(),
      reference.size());
}

// `dlbatch requeue` of the running example: its ranks agree to stop at one
// step, rank 0 checkpoints, and attempt 2 loads that checkpoint on every
// rank (each worker lays it out again) and ends with the weights of a run
// never interrupted.
TEST_F(Launch, TheRequeuedExampleResumesFromItsCheckpointToTheSameWeights) {
  if (!HaveTorch())
    GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  PreferDebiansPython();
  StartTwoWorkers(1);
  CopyExample("ddp_train.py");
  const int64_t id =
      c_.Submit(ExampleJob("ddp-per-slot.yaml"),
                {"--", "python3", "ddp_train.py", "--steps", "80",
                 "--checkpoint-every", "10", "--step-delay", "0.1"});
  const std::string job = std::to_string(id);
  ASSERT_TRUE(WaitFor(
      [&] {
        return JsonInt(c_.ShowJson(id)["progress"], "checkpoint_iteration") >=
               20;
      },
      300000))
      << Diary(id) << c_.Logs();
  ASSERT_LT(c_.ShowJson(id)["progress"].value("iteration", 0), 70)
      << "the job was about to end before it was requeued";
  Result requeue = c_.Cli({"requeue", job});
  ASSERT_EQ(requeue.code, 0) << requeue.err;
  ASSERT_TRUE(WaitFor(
      [&] {
        const nlohmann::json j = c_.ShowJson(id);
        return j.value("attempt", 0) == 2 &&
               c_.State(id) == "JOB_STATE_FINISHED";
      },
      300000))
      << c_.State(id) << "\n"
      << Diary(id) << c_.Logs();
  const std::string diary = Diary(id);
  ExpectRanksReach(diary, 2, Reference("80"));
  // Attempt 1 stopped at one step on both ranks; attempt 2 resumed there.
  std::set<std::string> stopped = After(diary, "stopped at step ");
  ASSERT_EQ(stopped.size(), 1u) << diary;
  EXPECT_EQ(After(diary, "resumed at step "), stopped) << diary;
  for (const char* rank :
       {"rank 0 resumed at step ", "rank 1 resumed at step "})
    EXPECT_NE(diary.find(rank), std::string::npos) << rank << "\n" << diary;
  EXPECT_NE(diary.find(absl::StrCat("resuming from the stored checkpoint of "
                                    "step ",
                                    *stopped.begin())),
            std::string::npos)
      << diary;
}

// By hand, without dlbatch (no module on the path): two ranks with
// torchrun's variables train to the reference and both exit, run after
// run (a Python-made tensor left in a gloo thread once hung a rank at
// exit, about one run in eight).
TEST_F(Launch, TheExampleRunsByHandWithoutTheModuleAndAlwaysExits) {
  if (!HaveTorch())
    GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  CopyExample("ddp_train.py");
  const std::vector<double> reference = Reference("30");
  constexpr int kRuns = 20;
  for (int run = 0; run < kRuns; ++run) {
    const std::string port = std::to_string(FreePort());
    Result ranks[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        ranks[r] = Exec({kPython, c_.dir() + "/ddp_train.py", "--steps", "30"},
                        {{"PYTHONPATH", ""},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", port},
                         {"WORLD_SIZE", "2"},
                         {"RANK", std::to_string(r)},
                         {"LOCAL_RANK", "0"},
                         {"OMP_NUM_THREADS", "1"}},
                        60000);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ranks[r].code, 0) << "run " << run << " rank " << r << ": "
                                  << ranks[r].out << ranks[r].err;
    }
    ExpectRanksReach(ranks[0].out + ranks[1].out, 2, reference);
  }
}

// What each process is told, without torch: one worker of two slots, so
// its two processes talk over loopback.
TEST_F(Launch, EachProcessGetsTorchrunsVariables) {
  c_.StartScheduler();
  c_.StartWorker("a", 2);
  ASSERT_TRUE(c_.WaitWorkers(1));
  const int64_t id = c_.Submit(c_.JobFile("env.yaml", R"(name: env
pool: 2
launch: per-slot
command: [sh, -c, 'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE g=$GROUP_RANK n=$NODE_RANK m=$MASTER_ADDR:$MASTER_PORT h=$DLBATCH_HOSTS t=$OMP_NUM_THREADS"']
)"));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED", 60000)) << Diary(id);
  const std::string diary = Diary(id);
  for (int r : {0, 1}) {
    EXPECT_NE(diary.find(absl::StrCat("r=", r, " w=2 l=", r,
                                      " lw=2 g=0 n=0 m=127.0.0.1:")),
              std::string::npos)
        << diary;
  }
  EXPECT_NE(diary.find("h=127.0.0.1 t=1"), std::string::npos) << diary;
  std::set<std::string> ports = After(diary, "m=127.0.0.1:");
  ASSERT_EQ(ports.size(), 1u) << diary;
  EXPECT_NE(std::stoi(*ports.begin()), 0);
}

// One rank failing fails the job, saying which; the job's other processes
// (here on the other worker) are stopped, not waited for.
TEST_F(Launch, ARankThatFailsFailsTheJobByRank) {
  StartTwoWorkers(1);
  const int64_t id = c_.Submit(c_.JobFile("fail.yaml", R"(name: fail
pool: 2
max_nodes: 2
launch: per-slot
command: [sh, -c, 'if [ "$RANK" = 1 ]; then echo rank one fails; exit 3; fi; exec sleep 600']
)"));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FAILED", 60000)) << Diary(id);
  EXPECT_NE(c_.ShowJson(id).dump().find("rank 1: exit code 3"),
            std::string::npos)
      << c_.ShowJson(id).dump();
}

TEST_F(Launch, ABadLaunchOrAReservedVariableIsRefusedSayingWhatToChange) {
  c_.StartScheduler();
  Result bad = c_.Cli({"submit", c_.JobFile("bad.yaml", R"(name: bad
launch: everywhere
command: [true]
)")});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("bad.yaml:2:9: launch: 'everywhere' is not a launch "
                         "mode; use per-node"),
            std::string::npos)
      << bad.err;
  Result reserved = c_.Cli({"submit", c_.JobFile("reserved.yaml", R"(name: r
launch: per-slot
env: {MASTER_PORT: "29500"}
command: [true]
)")});
  EXPECT_NE(reserved.code, 0);
  EXPECT_NE(reserved.err.find("env.MASTER_PORT: launch: per-slot sets it"),
            std::string::npos)
      << reserved.err;
  Result flag = c_.Cli({"submit", "--launch", "per-rack", "--", "true"});
  EXPECT_NE(flag.code, 0);
  EXPECT_NE(flag.err.find("launch: 'per-rack' is not a launch mode"),
            std::string::npos)
      << flag.err;
}

}  // namespace
}  // namespace dlbatch::testing
