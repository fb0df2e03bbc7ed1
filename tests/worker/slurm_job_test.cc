// What a worker started by srun in a dlbatch batch job reads from the
// environment Slurm gives it, and the worker it becomes.
#include "worker/slurm_job.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  auto shared =
      std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

std::map<std::string, std::string> Srun() {
  return {{"SLURM_JOB_ID", "900"},
          {"SLURM_NODEID", "1"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURMD_NODENAME", "n2"},
          {"CUDA_VISIBLE_DEVICES", "0,1"},
          {"DLBATCH_CA_PEM", "-----BEGIN CERTIFICATE-----\n"}};
}

TEST(SlurmJob, ReadsTheJobTheNodeAndItsGpus) {
  auto c = ReadSlurmJob(5, 2, Env(Srun()));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->job.job_id(), 5);
  EXPECT_EQ(c->job.attempt(), 2);
  EXPECT_EQ(c->job.slurm_job_id(), 900);
  EXPECT_EQ(c->job.node_index(), 1);
  EXPECT_EQ(c->job.nodes(), 2);
  EXPECT_EQ(c->node, "n2");
  EXPECT_EQ(c->gpus, 2);
  EXPECT_EQ(c->ca_pem, "-----BEGIN CERTIFICATE-----\n");

  auto vars = Srun();
  vars.erase("CUDA_VISIBLE_DEVICES");
  vars["SLURM_JOB_GPUS"] = "3";
  EXPECT_EQ(ReadSlurmJob(5, 1, Env(vars))->gpus, 1);
  vars.erase("SLURM_JOB_GPUS");
  EXPECT_EQ(ReadSlurmJob(5, 1, Env(vars))->gpus, 0);
}

TEST(SlurmJob, OutsideSrunOrWithBadValuesItSaysWhat) {
  auto vars = Srun();
  vars.erase("SLURM_JOB_ID");
  auto c = ReadSlurmJob(5, 1, Env(vars));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("SLURM_JOB_ID is not set"));
  EXPECT_THAT(c.status().message(), HasSubstr("not for starting by hand"));

  vars = Srun();
  vars["SLURM_NODEID"] = "2";
  EXPECT_THAT(ReadSlurmJob(5, 1, Env(vars)).status().message(),
              HasSubstr("SLURM_NODEID=2 is not below SLURM_JOB_NUM_NODES=2"));
  vars = Srun();
  vars["SLURM_JOB_NUM_NODES"] = "two";
  EXPECT_THAT(ReadSlurmJob(5, 1, Env(vars)).status().message(),
              HasSubstr("SLURM_JOB_NUM_NODES='two' is not a number"));
  EXPECT_THAT(ReadSlurmJob(5, 0, Env(Srun())).status().message(),
              HasSubstr("--attempt"));
}

TEST(SlurmJob, TheWorkerServesTheJobWithTheGpusSlurmGave) {
  auto c = ReadSlurmJob(5, 1, Env(Srun()));
  ASSERT_TRUE(c.ok());
  WorkerOptions o;
  o.name = "machine-abc";
  o.host = "gpu17.cluster";
  ApplySlurmJob(*c, {}, 0, &o);
  EXPECT_EQ(o.name, "slurm-900-1");
  EXPECT_EQ(o.host, "gpu17.cluster");  // not Slurm's node name n2
  ASSERT_EQ(o.devices.size(), 2u);
  EXPECT_EQ(o.devices[1].kind(), "gpu");
  EXPECT_EQ(o.devices[1].index(), 1);
  ASSERT_TRUE(o.slurm_job.has_value());
  EXPECT_EQ(o.slurm_job->job_id(), 5);
  EXPECT_EQ(o.channel.ca_pem, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(SlurmWorkDir(*c, "/tmp"), "/tmp/dlbatch-5-900-1");

  // The machine's own discovery, where it found as many GPUs.
  v1::Device h100;
  h100.set_kind("gpu");
  h100.set_name("NVIDIA H100");
  ApplySlurmJob(*c, {h100, h100}, 0, &o);
  EXPECT_EQ(o.devices[0].name(), "NVIDIA H100");

  // No GPUs from Slurm: CPU slots.
  c->gpus = 0;
  ApplySlurmJob(*c, {}, 3, &o);
  ASSERT_EQ(o.devices.size(), 3u);
  EXPECT_EQ(o.devices[0].kind(), "cpu");
}

// On CPU-only nodes the worker offers the CPUs Slurm gave its node, no more
// than its affinity mask allows.
TEST(SlurmJob, TheCpusSlurmGaveTheNodeAreItsCpuSlots) {
  std::map<std::string, std::string> vars = Srun();
  vars.erase("CUDA_VISIBLE_DEVICES");
  vars["SLURM_CPUS_ON_NODE"] = "2";
  vars["SLURM_JOB_CPUS_PER_NODE"] = "8(x2)";
  auto c = ReadSlurmJob(5, 1, Env(vars));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpus, 0);
  EXPECT_EQ(c->cpus, 2);  // SLURM_CPUS_ON_NODE first
  EXPECT_EQ(SlurmCpuSlots(*c, 16), 2);
  EXPECT_EQ(SlurmCpuSlots(*c, 1), 1);  // a narrower affinity mask
  WorkerOptions o;
  ApplySlurmJob(*c, {}, SlurmCpuSlots(*c, 16), &o);
  ASSERT_EQ(o.devices.size(), 2u);
  EXPECT_EQ(o.devices[1].kind(), "cpu");

  // Else this node's entry of SLURM_JOB_CPUS_PER_NODE (node 1 here).
  vars.erase("SLURM_CPUS_ON_NODE");
  vars["SLURM_JOB_CPUS_PER_NODE"] = "4,3";
  EXPECT_EQ(ReadSlurmJob(5, 1, Env(vars))->cpus, 3);
  vars["SLURM_JOB_CPUS_PER_NODE"] = "6(x2),1";
  EXPECT_EQ(ReadSlurmJob(5, 1, Env(vars))->cpus, 6);
  vars["SLURM_NODEID"] = "2";
  vars["SLURM_JOB_NUM_NODES"] = "3";
  EXPECT_EQ(ReadSlurmJob(5, 1, Env(vars))->cpus, 1);
  for (const char* bad : {"x", "4(x", "4(xy)", "", "4"}) {
    vars["SLURM_JOB_CPUS_PER_NODE"] = bad;  // unreadable, or too short
    EXPECT_EQ(ReadSlurmJob(5, 1, Env(vars))->cpus, 0) << bad;
  }
  // Slurm says nothing: the processors the worker may run on.
  vars.erase("SLURM_JOB_CPUS_PER_NODE");
  c = ReadSlurmJob(5, 1, Env(vars));
  EXPECT_EQ(c->cpus, 0);
  EXPECT_EQ(SlurmCpuSlots(*c, 5), 5);
  EXPECT_EQ(SlurmCpuSlots(*c, 0), 1);
}

}  // namespace
}  // namespace dlbatch::worker
