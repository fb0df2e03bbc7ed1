// What dlbatch says to Slurm and how it reads Slurm's answers. The outputs
// are the forms Slurm 22.05 prints (taken from its sbatch, squeue and sinfo
// on the test cluster of tests/slurm/slurm-cluster.sh).
#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/commands.h"
#include "scheduler/slurm/tool.h"

namespace dlbatch::scheduler::slurm {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

SlurmProfile Gpu() {
  SlurmProfile p;
  p.name = "cluster";
  p.partition = "gpu";
  p.gpus_per_node = 2;
  p.bin_dir = "/opt/dlbatch/bin";
  p.node_dir = "/scratch/dlbatch";
  return p;
}

TEST(SlurmCommands, JobNamesCarryTheInstanceAndRoundTrip) {
  EXPECT_TRUE(IsInstanceId("0a1b2c3d"));
  for (const char* bad :
       {"", "0a1b2c3", "0a1b2c3d4", "0A1B2C3D", "0a1b2c3g", "0a1b-c3d"}) {
    EXPECT_FALSE(IsInstanceId(bad)) << bad;
  }
  EXPECT_EQ(SlurmJobName("0a1b2c3d", 42), "dlbatch-0a1b2c3d-42");
  EXPECT_EQ(ParseSlurmJobName("dlbatch-0a1b2c3d-42"),
            (ParsedSlurmName{"0a1b2c3d", 42}));
  // Digits only is an instance too: the old form has no second '-'.
  EXPECT_EQ(ParseSlurmJobName("dlbatch-12345678-9"),
            (ParsedSlurmName{"12345678", 9}));
  // The form of before instance ids: no instance.
  EXPECT_EQ(ParseSlurmJobName("dlbatch-42"), (ParsedSlurmName{"", 42}));
  for (const char* other :
       {"wrap", "dlbatch-", "dlbatch-x", "dlbatch-042", "dlbatch-4 2",
        "dlbatch--1", "xdlbatch-4", "dlbatch-0a1b2c3d-", "dlbatch-0a1b2c3d-x",
        "dlbatch-0a1b2c3d-042", "dlbatch-0a1b2c3-4", "dlbatch-0A1B2C3D-4",
        "dlbatch-0a1b2c3d-4-5", "dlbatch-0a1b2c3d--4"}) {
    EXPECT_EQ(ParseSlurmJobName(other), std::nullopt) << other;
  }
}

TEST(SlurmCommands, SbatchAsksFixedCountsNoRequeueAndNoEnvironment) {
  BatchRequest r;
  r.instance = "0a1b2c3d";
  r.job_id = 7;
  r.nodes = 2;
  r.gpus_per_node = 2;
  r.time_limit_s = 600;
  SlurmProfile p = Gpu();
  p.account = "ml";
  p.qos = "high";
  p.sbatch_args = {"--constraint=a100"};
  std::vector<std::string> argv = SbatchArgv(p, r);
  EXPECT_EQ(argv[0], "sbatch");
  for (const char* want :
       {"--parsable", "--job-name=dlbatch-0a1b2c3d-7", "--partition=gpu",
        "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--gres=gpu:2",
        "--no-requeue", "--export=NONE", "--time=11", "--account=ml",
        "--qos=high", "--constraint=a100",
        "--output=/scratch/dlbatch/dlbatch-0a1b2c3d-7-%j.out"}) {
    EXPECT_THAT(argv, Contains(want));
  }
  // Never a range such as --nodes=1-2.
  for (const std::string& a : argv) EXPECT_EQ(a.find("-2-"), std::string::npos);
  EXPECT_THAT(argv, Not(Contains(::testing::StartsWith("--uid"))));
  r.uid = 1000;
  r.gid = 100;
  r.gpus_per_node = 0;
  r.time_limit_s = 0;
  argv = SbatchArgv(Gpu(), r);
  EXPECT_THAT(argv, Contains("--uid=1000"));
  EXPECT_THAT(argv, Contains("--gid=100"));
  EXPECT_THAT(argv, Not(Contains(::testing::StartsWith("--gres"))));
  EXPECT_THAT(argv, Not(Contains(::testing::StartsWith("--time"))));
  EXPECT_THAT(argv, Not(Contains(::testing::StartsWith("--cpus"))));
}

// Each node's one task asks for a CPU for each of its ranks: CPU slots on
// CPU-only nodes, a core beside each GPU on GPU nodes.
TEST(SlurmCommands, SbatchAndSrunAskForTheCpusOfEachNodesRanks) {
  BatchRequest r;
  r.instance = "0a1b2c3d";
  r.job_id = 7;
  r.nodes = 2;
  r.cpus_per_node = 3;
  SlurmProfile cpu = Gpu();
  cpu.gpus_per_node = 0;
  std::vector<std::string> argv = SbatchArgv(cpu, r);
  EXPECT_THAT(argv, Contains("--cpus-per-task=3"));
  EXPECT_THAT(argv, Contains("--ntasks-per-node=1"));
  EXPECT_THAT(argv, Not(Contains(::testing::StartsWith("--gres"))));
  // srun of Slurm 22.05 takes no --cpus-per-task from the batch job.
  EXPECT_THAT(BatchScript(cpu, r, {"10.0.0.1:7070", "", "t"}),
              HasSubstr("exec srun --export=ALL --nodes=2 --ntasks=2 "
                        "--ntasks-per-node=1 --cpus-per-task=3 "));
  r.gpus_per_node = 2;
  r.cpus_per_node = 2;
  argv = SbatchArgv(Gpu(), r);
  EXPECT_THAT(argv, Contains("--gres=gpu:2"));
  EXPECT_THAT(argv, Contains("--cpus-per-task=2"));
}

TEST(SlurmCommands, SlurmsTimeIsTheLimitPlusTheMarginInWholeMinutes) {
  EXPECT_EQ(SlurmTimeLimit(0), "");
  EXPECT_EQ(SlurmTimeLimit(1), "2");      // 61 s -> 2 min
  EXPECT_EQ(SlurmTimeLimit(60), "2");     // 120 s
  EXPECT_EQ(SlurmTimeLimit(3600), "61");  // 3660 s
  EXPECT_EQ(SlurmTimeLimit(3601), "62");  // rounded up
}

TEST(SlurmCommands, TheScriptStartsOneWorkerPerNodeAndQuotesEverything) {
  BatchRequest r;
  r.job_id = 9;
  r.attempt = 3;
  r.nodes = 2;
  SlurmProfile p = Gpu();
  p.name = "it's";
  std::string s = BatchScript(
      p, r, {"10.0.0.1:7070", "-----BEGIN CERTIFICATE-----\nAA\n", "dlbw_x"});
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u);
  EXPECT_THAT(s, HasSubstr("export DLBATCH_SCHEDULER='10.0.0.1:7070'\n"));
  EXPECT_THAT(s, HasSubstr("export DLBATCH_TOKEN='dlbw_x'\n"));
  EXPECT_THAT(
      s,
      HasSubstr("export DLBATCH_CA_PEM='-----BEGIN CERTIFICATE-----\nAA\n'"));
  EXPECT_THAT(
      s,
      HasSubstr(
          "exec srun --export=ALL --nodes=2 --ntasks=2 --ntasks-per-node=1"));
  EXPECT_THAT(
      s,
      HasSubstr("'/opt/dlbatch/bin/dlbatch-worker' --slurm-job 9 --attempt 3"));
  EXPECT_THAT(s, HasSubstr("--profile 'it'\\''s'"));
  // The credential is never on a command line.
  EXPECT_THAT(s, Not(HasSubstr("--token")));
  EXPECT_THAT(BatchScript(Gpu(), r, {"unix:/run/d.sock", "", "t"}),
              Not(HasSubstr("DLBATCH_CA_PEM")));
  // One node: the batch step itself is the worker, without a job step.
  r.nodes = 1;
  s = BatchScript(Gpu(), r, {"10.0.0.1:7070", "", "t"});
  EXPECT_THAT(s, Not(HasSubstr("exec srun")));
  EXPECT_THAT(s, HasSubstr("exec '/opt/dlbatch/bin/dlbatch-worker' "
                           "--slurm-job 9 --attempt 3"));
}

TEST(SlurmCommands, SbatchParsableGivesTheIdWithOrWithoutTheCluster) {
  EXPECT_EQ(*ParseSbatchParsable("123\n"), 123);
  EXPECT_EQ(*ParseSbatchParsable("77;dlbt\n"), 77);
  for (const char* bad : {"", "\n", "sbatch: error: x", "0", "-3"}) {
    absl::StatusOr<int64_t> id = ParseSbatchParsable(bad);
    EXPECT_FALSE(id.ok()) << bad;
    if (!id.ok()) {
      EXPECT_THAT(id.status().message(), HasSubstr("sbatch"));
    }
  }
}

TEST(SlurmCommands, SqueueLinesParseAndABadLineIsAnError) {
  std::vector<std::string> argv = SqueueArgv({"gpu", "cpu"});
  EXPECT_THAT(argv, Contains("--states=all"));
  EXPECT_THAT(argv, Contains("--partition=gpu,cpu"));
  EXPECT_THAT(argv, Contains(kSqueueFormat));
  // squeue's --name takes exact names, never a pattern: every job of the
  // partitions is read, and the reconciler keeps its instance's.
  EXPECT_THAT(argv, ::testing::Not(Contains(::testing::StartsWith("--name"))));
  auto rows = ParseSqueue(
      "1|dlbatch-7|CANCELLED|root|n1|None\n"
      "3|dlbatch-9|RUNNING|alice|n[1-2]|None\n"
      "4|wrap|PENDING|root||PartitionNodeLimit\n"
      "5|dlbatch-10|PENDING|bob||Reason|with|bars\n");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 4u);
  EXPECT_EQ((*rows)[1].slurm_id, 3);
  EXPECT_EQ((*rows)[1].name, "dlbatch-9");
  EXPECT_EQ((*rows)[1].user, "alice");
  EXPECT_EQ((*rows)[1].nodes, "n[1-2]");
  EXPECT_EQ((*rows)[2].nodes, "");
  EXPECT_EQ((*rows)[3].reason, "Reason|with|bars");
  EXPECT_TRUE(ParseSqueue("")->empty());
  absl::StatusOr<std::vector<SqueueRow>> bad =
      ParseSqueue("1|dlbatch-7|RUNNING|root|n1|None\nslurm_load_jobs error\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("slurm_load_jobs error"));
}

SlurmVerdict Map(const std::string& state, const std::string& reason = "None") {
  return MapSlurmState(SqueueRow{12, "dlbatch-3", state, "root", "n2", reason},
                       "gpu");
}

TEST(SlurmCommands, EverySlurmStateMapsToADlbatchPhase) {
  EXPECT_EQ(Map("PENDING", "Resources").phase, SlurmPhase::kPending);
  EXPECT_EQ(Map("PENDING", "Resources").reason,
            "waiting in Slurm: Resources (partition gpu)");
  EXPECT_EQ(Map("CONFIGURING").phase, SlurmPhase::kPending);
  for (const char* s : {"RUNNING", "COMPLETING"}) {
    EXPECT_EQ(Map(s).phase, SlurmPhase::kRunning) << s;
  }
  for (const char* s : {"CANCELLED", "CANCELLED by 1000", "FAILED", "TIMEOUT",
                        "OUT_OF_MEMORY", "COMPLETED", "DEADLINE"}) {
    EXPECT_EQ(Map(s).phase, SlurmPhase::kEnded) << s;
    EXPECT_FALSE(Map(s).retryable) << s;
    EXPECT_THAT(Map(s).reason, HasSubstr("Slurm job 12")) << s;
  }
  for (const char* s : {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}) {
    EXPECT_EQ(Map(s).phase, SlurmPhase::kEnded) << s;
    EXPECT_TRUE(Map(s).retryable) << s;
  }
  // Whether Slurm ended the job itself, signalling its processes.
  for (const char* s :
       {"CANCELLED", "CANCELLED by 1000", "TIMEOUT", "OUT_OF_MEMORY",
        "DEADLINE", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}) {
    EXPECT_TRUE(Map(s).by_slurm) << s;
  }
  for (const char* s : {"COMPLETED", "FAILED", "RUNNING", "COMPLETING"}) {
    EXPECT_FALSE(Map(s).by_slurm) << s;
  }
  EXPECT_THAT(Map("CANCELLED by 1000").reason, HasSubstr("(by 1000)"));
  EXPECT_THAT(Map("TIMEOUT").reason, HasSubstr("time limit"));
  EXPECT_THAT(Map("FAILED", "NonZeroExitCode").reason,
              HasSubstr("NonZeroExitCode"));
  EXPECT_EQ(Map("SOMETHING_NEW").phase, SlurmPhase::kUnknown);
}

TEST(SlurmCommands,
     SinfoGivesNodesGpusAndTimeAndCheckFitsRefusesTheImpossible) {
  EXPECT_THAT(SinfoArgv("gpu"), Contains("--partition=gpu"));
  // Nodes of unlike CPU counts on lines of their own.
  EXPECT_THAT(SinfoArgv("gpu"), Contains("--exact"));
  auto limits =
      ParseSinfo("2|gpu:2|2:00:00|2\n1|gpu:a100:4(S:0-1),nic:1|1-00:00:00|64\n",
                 "gpu", "gpu");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->nodes, 3);
  EXPECT_EQ(limits->max_gpus_per_node, 4);
  EXPECT_EQ(limits->max_time_s, 86400);
  EXPECT_EQ(limits->max_cpus_per_node, 64);
  EXPECT_EQ(
      ParseSinfo("2|(null)|infinite|8\n", "cpu", "gpu")->max_gpus_per_node, 0);
  EXPECT_EQ(ParseSinfo("2|(null)|infinite|8\n", "cpu", "gpu")->max_time_s, 0);
  EXPECT_EQ(
      ParseSinfo("3|(null)|infinite|4+\n", "cpu", "gpu")->max_cpus_per_node, 4);
  EXPECT_THAT(
      ParseSinfo("2|(null)|infinite\n", "cpu", "gpu").status().message(),
      HasSubstr("sinfo printed a line dlbatch cannot read"));
  EXPECT_THAT(
      ParseSinfo("2|(null)|infinite|many\n", "cpu", "gpu").status().message(),
      HasSubstr("CPU count 'many'"));
  absl::StatusOr<PartitionLimits> none = ParseSinfo("", "gpux", "gpu");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("no partition 'gpux'"));

  PartitionLimits two{"gpu", 2, 2, 7200};
  BatchRequest r;
  r.nodes = 2;
  r.gpus_per_node = 2;
  r.time_limit_s = 3600;
  EXPECT_TRUE(CheckFits(two, r).ok());
  r.nodes = 3;
  EXPECT_THAT(CheckFits(two, r).message(),
              HasSubstr("asks for 3 nodes but Slurm partition 'gpu' has 2"));
  r.nodes = 1;
  r.gpus_per_node = 4;
  EXPECT_THAT(CheckFits(two, r).message(), HasSubstr("at most 2"));
  r.gpus_per_node = 1;
  r.time_limit_s = 7200;
  EXPECT_THAT(CheckFits(two, r).message(), HasSubstr("MaxTime of 7200 s"));
  // More CPUs on a node than its nodes have.
  PartitionLimits cpus{"gpu", 2, 0, 0, 2};
  BatchRequest c;
  c.cpus_per_node = 2;
  EXPECT_TRUE(CheckFits(cpus, c).ok());
  c.cpus_per_node = 3;
  EXPECT_THAT(CheckFits(cpus, c).message(),
              HasSubstr("asks for 3 CPUs on a node (one for each of its CPU "
                        "slots there) but the nodes of Slurm partition 'gpu' "
                        "have at most 2"));
  cpus.max_cpus_per_node = 0;  // not known: not checked
  EXPECT_TRUE(CheckFits(cpus, c).ok());
}

TEST(SlurmCommands, SlurmTimesInEveryForm) {
  struct Case {
    const char* text;
    int64_t seconds;
  } cases[] = {{"infinite", 0},  {"UNLIMITED", 0},    {"30", 1800},
               {"30:15", 1815},  {"2:00:00", 7200},   {"1-00:00:00", 86400},
               {"1-12", 129600}, {"1-12:30", 131400}, {"0-0:0:5", 5}};
  for (const Case& c : cases) {
    absl::StatusOr<int64_t> t = ParseSlurmTime(c.text);
    ASSERT_TRUE(t.ok()) << c.text << ": " << t.status();
    EXPECT_EQ(*t, c.seconds) << c.text;
  }
  for (const char* bad : {"", "x", "1:2:3:4", "-5", "1-", "1-x", ":"}) {
    EXPECT_FALSE(ParseSlurmTime(bad).ok()) << bad;
  }
}

TEST(SlurmCommands, ScancelOfAGoneOrEndingJobIsDone) {
  EXPECT_TRUE(ScancelOutcome(0, "").ok());
  EXPECT_TRUE(
      ScancelOutcome(1,
                     "scancel: error: Kill job error on job id 9: Invalid job "
                     "id specified\n")
          .ok());
  EXPECT_TRUE(ScancelOutcome(1,
                             "scancel: error: Kill job error on job id 9: "
                             "Job/step already completing or completed\n")
                  .ok());
  absl::Status down = ScancelOutcome(
      1,
      "scancel: error: Kill job error on job id 9: Unable to contact slurm "
      "controller (connect failure)\n");
  EXPECT_FALSE(down.ok());
  EXPECT_THAT(down.message(), HasSubstr("Unable to contact slurm controller"));
}

// The real tool runner, on ordinary programs.
TEST(SlurmCommands, SinfoNodesGiveTheViewOfProfiles) {
  EXPECT_THAT(SinfoNodesArgv("gpu"),
              ElementsAre("sinfo", "-h", "-N", "--partition=gpu", "-O",
                          kSinfoNodesFormat));
  // Slurm 22.05's own padded lines, and the GRES forms it prints.
  auto view = ParseSinfoNodes(
      "n1      |mixed     |gpu:2      |gpu:1      |\n"
      "n2      |idle      |gpu:2      |gpu:0      |\n"
      "n3      |allocated |gpu:a100:4(S:0-1)|gpu:(null):4(IDX:0-3)|\n"
      "n4      |drained   |gpu:2,nic:1|gpu:0      |\n"
      "n5      |idle*     |gpu:2      |gpu:0      |\n"
      "n6      |down~     |(null)     |(null)     |\n",
      "gpu", "gpu");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->partition, "gpu");
  EXPECT_EQ(view->nodes, 6);
  EXPECT_EQ(view->idle, 1);
  EXPECT_EQ(view->busy, 2);
  EXPECT_EQ(view->unavailable, 3);  // drained, not responding, down
  EXPECT_EQ(view->gpus, 12);
  EXPECT_EQ(view->gpus_used, 5);
  EXPECT_THAT(ParseSinfoNodes("", "gpu", "gpu").status().message(),
              HasSubstr("Slurm has no partition 'gpu'"));
  EXPECT_THAT(ParseSinfoNodes("n1|idle\n", "gpu", "gpu").status().message(),
              HasSubstr("sinfo printed a line dlbatch cannot read"));
}

// What preemption reads of each node: its GPUs and CPUs, and how many are
// free (the test Slurm's own lines among them).
TEST(SlurmCommands, SinfoNodeRowsGiveEachNodesFreeGpusAndCpus) {
  EXPECT_THAT(SinfoNodeRowsArgv("low"),
              ElementsAre("sinfo", "-h", "-N", "--partition=low", "-O",
                          kSinfoNodeRowsFormat));
  auto rows = ParseSinfoNodeRows(
      "n1      |idle      |gpu:2      |gpu:0      |0/2/0/2   |\n"
      "n2      |mixed     |gpu:2      |gpu:1(IDX:0)|1/1/0/2  |\n"
      "n3      |drained   |gpu:a100:4(S:0-1)|gpu:(null):0(IDX:N/A)|0/0/8/8|\n",
      "gpu");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  const NodeRow& n2 = (*rows)[1];
  EXPECT_EQ(n2.name, "n2");
  EXPECT_TRUE(n2.usable);
  EXPECT_EQ(n2.gpus, 2);
  EXPECT_EQ(n2.gpus_used, 1);
  EXPECT_EQ(n2.cpus, 2);
  EXPECT_EQ(n2.cpus_idle, 1);
  EXPECT_FALSE((*rows)[2].usable);
  EXPECT_EQ((*rows)[2].gpus, 4);
  EXPECT_THAT(
      ParseSinfoNodeRows("n1|idle|gpu:2|gpu:0|2|\n", "gpu").status().message(),
      HasSubstr("sinfo printed a line dlbatch cannot read"));
}

TEST(SlurmCommands, HostListsExpandInSlurmsOrder) {
  auto names = [](absl::string_view list) {
    absl::StatusOr<std::vector<std::string>> out = ExpandHostlist(list);
    return out.ok() ? *out : std::vector<std::string>{"error"};
  };
  EXPECT_THAT(names("n1"), ElementsAre("n1"));
  EXPECT_THAT(names("n[1-2]"), ElementsAre("n1", "n2"));
  EXPECT_THAT(names("n[1-3,5]"), ElementsAre("n1", "n2", "n3", "n5"));
  EXPECT_THAT(names("gpu[08-10],cpu7"),
              ElementsAre("gpu08", "gpu09", "gpu10", "cpu7"));
  EXPECT_THAT(names("r[1-2]n[1-2]"),
              ElementsAre("r1n1", "r1n2", "r2n1", "r2n2"));
  EXPECT_THAT(names(""), ElementsAre());
  for (const char* bad : {"n[2-1]", "n[1-", "n]1", "n[[1]]", "n[a-b]"}) {
    EXPECT_THAT(ExpandHostlist(bad).status().message(),
                HasSubstr("has a form dlbatch does not know"))
        << bad;
  }
}

TEST(SlurmCommands, ScancelSignalsTheBatchStepAlone) {
  EXPECT_THAT(ScancelSignalArgv(12, "TERM"),
              ElementsAre("scancel", "--batch", "--signal=TERM", "12"));
}

TEST(ProcessSlurmTool, PassesInputAndEnvironmentAndKeepsTheExitCode) {
  ProcessSlurmTool tool(
      std::map<std::string, std::string>{{"SLURM_CONF", "/etc/x.conf"}});
  auto cat = tool.Run({"sh", "-c", "cat; echo \"$SLURM_CONF\" >&2; exit 3"},
                      std::string(100000, 'a'));
  ASSERT_TRUE(cat.ok()) << cat.status();
  EXPECT_EQ(cat->out, std::string(100000, 'a'));
  EXPECT_EQ(cat->err, "/etc/x.conf\n");
  EXPECT_EQ(cat->exit_code, 3);
}

TEST(ProcessSlurmTool, AMissingProgramAndAHungOneAreErrorsThatSaySo) {
  ProcessSlurmTool tool({}, 300);
  auto missing = tool.Run({"dlbatch-no-such-sbatch"}, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot run dlbatch-no-such-sbatch"));
  auto hung = tool.Run({"sleep", "30"}, "");
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(hung.status().message(), HasSubstr("did not answer within"));
}

}  // namespace
}  // namespace dlbatch::scheduler::slurm
