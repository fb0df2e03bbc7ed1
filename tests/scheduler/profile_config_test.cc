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
