// Unit tests of the profiles a scheduler declares (scheduler/profile_config.h):
// scheduler.yaml's `profiles:` section, Slurm's options among them, and
// --profile.
#include "scheduler/profile_config.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::vector<ProfileDeclaration>> FromText(
    const std::string& text) {
  auto file = ParseConfigFile(text, "/etc/dlbatch/scheduler.yaml", {},
                              {ProfilesSection()});
  if (!file.ok()) return file.status();
  return ProfilesFromConfig(file->Section("profiles"), file->path);
}

std::string ErrorOf(const std::string& text) {
  auto profiles = FromText(text);
  return profiles.ok() ? "" : std::string(profiles.status().message());
}

TEST(ProfileConfigTest, ReadsASlurmProfileWithEveryOption) {
  auto profiles = FromText(
      "profiles:\n"
      "  cluster:\n"
      "    type: slurm\n"
      "    partition: gpu\n"
      "    account: ml\n"
      "    qos: normal\n"
      "    gpus_per_node: 4\n"
      "    gres: gpu\n"
      "    sbatch_args: [--constraint=a100, --exclusive]\n"
      "    bin_dir: /opt/dlbatch/bin/\n"
      "    node_dir: /scratch/dlbatch\n"
      "    scheduler_address: head:7070\n"
      "    max_pool: 8\n"
      "  gpu:\n"
      "    max_pool: 2\n"
      "  cpu:\n");
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  ASSERT_EQ(profiles->size(), 3u);
  const ProfileDeclaration& c = (*profiles)[0];
  EXPECT_EQ(c.name, "cluster");
  EXPECT_EQ(c.type, ProfileType::kSlurm);
  EXPECT_EQ(c.max_pool, 8);
  EXPECT_EQ(c.origin, "file /etc/dlbatch/scheduler.yaml:2");
  EXPECT_EQ(c.slurm.name, "cluster");
  EXPECT_EQ(c.slurm.partition, "gpu");
  EXPECT_EQ(c.slurm.account, "ml");
  EXPECT_EQ(c.slurm.qos, "normal");
  EXPECT_EQ(c.slurm.gpus_per_node, 4);
  EXPECT_EQ(c.slurm.gres_name, "gpu");
  EXPECT_THAT(c.slurm.sbatch_args,
              ElementsAre("--constraint=a100", "--exclusive"));
  EXPECT_EQ(c.slurm.bin_dir, "/opt/dlbatch/bin");
  EXPECT_EQ(c.slurm.node_dir, "/scratch/dlbatch");
  EXPECT_EQ(c.scheduler_address, "head:7070");
  EXPECT_EQ((*profiles)[1].type, ProfileType::kWorkers);
  EXPECT_EQ((*profiles)[1].max_pool, 2);
  EXPECT_EQ((*profiles)[2].name, "cpu");
  EXPECT_EQ(ProfileTypeName(c.type), "slurm");
  EXPECT_EQ(ProfileTypeName((*profiles)[2].type), "workers");
}

TEST(ProfileConfigTest, SlurmDefaultsAreSlurmCommandsDefaults) {
  auto profiles = FromText("profiles:\n  c: {type: slurm, partition: debug}\n");
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  const slurm::SlurmProfile& s = (*profiles)[0].slurm;
  EXPECT_EQ(s.gres_name, "gpu");
  EXPECT_EQ(s.gpus_per_node, 0);
  EXPECT_EQ(s.bin_dir, "/usr/bin");
  EXPECT_EQ(s.node_dir, "/tmp");
  EXPECT_TRUE(s.sbatch_args.empty());
}

TEST(ProfileConfigTest, ErrorsNameFileLineProfileKeyAndTheFix) {
  const std::string at = "/etc/dlbatch/scheduler.yaml:";
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slrum\n"),
              HasSubstr(at + "3: profile 'c': unknown type 'slrum' (did you "
                             "mean 'slurm'?); write type: workers"));
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slurm\n"),
              HasSubstr(at + "2: profile 'c': a profile of type slurm needs "
                             "the partition its jobs go to; add partition:"));
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    max_pool: 2\n    partition: x\n"),
              HasSubstr(at + "4: profile 'c': key 'partition' is for profiles "
                             "of Slurm; add type: slurm or remove it"));
  EXPECT_THAT(
      ErrorOf("profiles:\n  c:\n    type: slurm\n    partition: p\n"
              "    sbatch_args: [--exclusive, --time=10]\n"),
      HasSubstr(at + "5: profile 'c': key 'sbatch_args': dlbatch sets --time "
                     "itself from the job's time_limit; remove '--time=10'"));
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slurm\n    partition: p\n"
                      "    sbatch_args: [-N2]\n"),
              HasSubstr("dlbatch sets -N itself from the job's pool"));
  // The CPUs of each node's ranks are dlbatch's to ask for.
  for (const char* cpus : {"--cpus-per-task=4", "-c4", "--cpus-per-gpu=8"}) {
    EXPECT_THAT(ErrorOf(absl::StrCat("profiles:\n  c:\n    type: slurm\n    "
                                     "partition: p\n    sbatch_args: [",
                                     cpus, "]\n")),
                HasSubstr("a CPU for each rank on a node"))
        << cpus;
  }
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slurm\n    partition: p\n"
                      "    sbatch_args: [exclusive]\n"),
              HasSubstr("'exclusive' is not an option"));
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slurm\n    partition: p\n"
                      "    bin_dir: opt/bin\n"),
              HasSubstr(at + "5: profile 'c': key 'bin_dir': write an "
                             "absolute folder"));
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slurm\n    partition: p\n"
                      "    gpus_per_node: -1\n"),
              HasSubstr(at + "5: profile 'c': key 'gpus_per_node'"));
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    type: slurm\n    partition: p\n"
                      "    gres: gpu:4\n"),
              HasSubstr("key 'gres': write the GRES name alone"));
  EXPECT_THAT(ErrorOf("profiles:\n  local:\n    type: slurm\n"
                      "    partition: p\n"),
              HasSubstr(at + "3: profile 'local': 'local' is always this "
                             "machine's own workers"));
  // An unknown key is the file's error, with the section's keys.
  EXPECT_THAT(ErrorOf("profiles:\n  c:\n    partiton: p\n"),
              HasSubstr(at + "3: profile 'c': unknown key 'partiton' (did "
                             "you mean 'partition'?); known keys: type,"));
}

TEST(ProfileConfigTest, ReadsPreemptionInFlowAndBlockStyle) {
  auto profiles = FromText(
      "profiles:\n"
      "  gpu:\n"
      "    preemption: {mode: priority, grace: 30s, min_run: 1h}\n"
      "  share:\n"
      "    max_pool: 4\n"
      "    preemption:\n"
      "      mode: fair_share\n"
      "      min_run: 0\n"
      "      preemptible: false\n"
      "  plain:\n"
      "    max_pool: 2\n"
      "  off: {preemption: {mode: off, grace: 1m}}\n"
      "  cluster:\n"
      "    type: slurm\n"
      "    partition: gpu\n"
      "    preemption: {mode: priority}\n");
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  ASSERT_EQ(profiles->size(), 5u);
  const PreemptionPolicy& gpu = (*profiles)[0].preemption;
  EXPECT_EQ(gpu.mode, PreemptionMode::kPriority);
  EXPECT_EQ(gpu.grace_ms, 30 * 1000);
  EXPECT_EQ(gpu.min_run_ms, 3600 * 1000);
  const PreemptionPolicy& share = (*profiles)[1].preemption;
  EXPECT_EQ(share.mode, PreemptionMode::kFairShare);
  EXPECT_EQ(share.grace_ms, kDefaultPreemptGraceMs);
  EXPECT_EQ(share.min_run_ms, 0);
  EXPECT_FALSE(share.jobs_preemptible);
  EXPECT_TRUE(gpu.jobs_preemptible);
  EXPECT_EQ((*profiles)[1].max_pool, 4);
  // Without the key: PreemptionPolicy's defaults, mode off.
  const PreemptionPolicy& plain = (*profiles)[2].preemption;
  EXPECT_EQ(plain.mode, PreemptionMode::kOff);
  EXPECT_EQ(plain.grace_ms, kDefaultPreemptGraceMs);
  EXPECT_EQ(plain.min_run_ms, kDefaultPreemptMinRunMs);
  EXPECT_EQ((*profiles)[3].preemption.mode, PreemptionMode::kOff);
  EXPECT_EQ((*profiles)[3].preemption.grace_ms, 60 * 1000);
  // A Slurm profile takes the same policy.
  EXPECT_EQ((*profiles)[4].type, ProfileType::kSlurm);
  EXPECT_EQ((*profiles)[4].preemption.mode, PreemptionMode::kPriority);
  EXPECT_EQ((*profiles)[4].preemption.min_run_ms, kDefaultPreemptMinRunMs);
  // A flag's profile preempts nothing.
  auto flag = ProfileFromFlag("gpu=8");
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(flag->preemption.mode, PreemptionMode::kOff);
  EXPECT_EQ(flag->preemption.grace_ms, kDefaultPreemptGraceMs);
}

TEST(ProfileConfigTest, PreemptionErrorsSayWhatToWrite) {
  const std::string at = "/etc/dlbatch/scheduler.yaml:";
  EXPECT_THAT(
      ErrorOf("profiles:\n  c:\n    preemption:\n      mode: priorty\n"),
      HasSubstr(at + "4: profile 'c': key 'preemption': unknown mode "
                     "'priorty' (did you mean 'priority'?); write mode: off "
                     "(nothing is preempted, the default), priority or "
                     "fair_share"));
  EXPECT_THAT(ErrorOf("profiles:\n  c: {preemption: {mode: always}}\n"),
              HasSubstr(at + "2: profile 'c': key 'preemption': unknown mode "
                             "'always'; write mode: off"));
  EXPECT_THAT(
      ErrorOf("profiles:\n  c:\n    preemption:\n      grace: 2x\n"),
      HasSubstr(at + "4: profile 'c': key 'preemption': key 'grace': '2x' is "
                     "not a duration; write e.g. 90s, 30m, 1h30m or 2d"));
  EXPECT_THAT(ErrorOf("profiles:\n  c: {preemption: {grace: -1m}}\n"),
              HasSubstr(at + "2: profile 'c': key 'preemption': key 'grace': "
                             "'-1m' is negative; write how long a preempted "
                             "job has to checkpoint before it is killed, more "
                             "than 0 (e.g. 2m)"));
  for (const char* zero : {"0", "0s", "0m0s"}) {
    EXPECT_THAT(
        ErrorOf(absl::StrCat("profiles:\n  c: {preemption: {grace: ", zero,
                             "}}\n")),
        HasSubstr(absl::StrCat("key 'grace': '", zero,
                               "' is zero; write how long a preempted job")))
        << zero;
  }
  EXPECT_THAT(ErrorOf("profiles:\n  c: {preemption: {min_run: -10m}}\n"),
              HasSubstr("key 'preemption': key 'min_run': '-10m' is negative; "
                        "write how long a job runs before it may be "
                        "preempted, e.g. 10m (0: no minimum)"));
  EXPECT_THAT(ErrorOf("profiles:\n  c: {preemption: {preemptible: no}}\n"),
              HasSubstr(at + "2: profile 'c': key 'preemption': key "
                             "'preemptible': write true (the default"));
  EXPECT_THAT(ErrorOf("profiles:\n  c: {preemption: {min_run: soon}}\n"),
              HasSubstr("key 'min_run': 'soon' is not a duration"));
  // Unknown keys inside, and a value that is no mapping: the file's errors.
  EXPECT_THAT(
      ErrorOf("profiles:\n  c:\n    preemption:\n      grase: 2m\n"),
      HasSubstr(at + "4: profile 'c': key 'preemption': unknown key 'grase' "
                     "(did you mean 'grace'?); known keys: mode, grace, "
                     "min_run"));
  EXPECT_THAT(
      ErrorOf("profiles:\n  c:\n    preemption: priority\n"),
      HasSubstr(at +
                "3: profile 'c': key 'preemption': expected a "
                "mapping of its keys (mode, grace, min_run, preemptible), got "
                "'priority'"));
}

TEST(ProfileConfigTest, FlagsAndTheFileDeclareEachNameOnce) {
  auto flag = ProfileFromFlag("gpu=8");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->name, "gpu");
  EXPECT_EQ(flag->max_pool, 8);
  EXPECT_EQ(flag->type, ProfileType::kWorkers);
  EXPECT_THAT(ProfileFromFlag("gpu=many").status().message(),
              HasSubstr("--profile gpu=many: write NAME or NAME=MAX_POOL"));
  EXPECT_FALSE(ProfileFromFlag("=3").ok());

  auto file = FromText("profiles:\n  gpu: {type: slurm, partition: p}\n");
  ASSERT_TRUE(file.ok());
  std::vector<ProfileDeclaration> all = {*flag, (*file)[0]};
  EXPECT_THAT(CheckDeclarations(all).message(),
              HasSubstr("profile 'gpu' is declared twice (flag --profile and "
                        "file /etc/dlbatch/scheduler.yaml:2); declare it "
                        "once"));
  // The flags may repeat a name, as before profiles were in the file.
  all = {*flag, *ProfileFromFlag("gpu=4"), *ProfileFromFlag("cpu")};
  EXPECT_TRUE(CheckDeclarations(all).ok());
}

}  // namespace
}  // namespace dlbatch::scheduler
