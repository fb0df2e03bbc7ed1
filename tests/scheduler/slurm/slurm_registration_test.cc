// Unit tests of who may register as a Slurm batch job's worker
// (scheduler/slurm_registration.h): only under that job's own one-job
// credential, for its current attempt and Slurm job, as one of its nodes;
// and a one-job credential registers nothing else.
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/slurm/registration.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::HasSubstr;

v1::Register SlurmWorker(int64_t job_id, int attempt, int64_t slurm_id,
                         int node = 0, int nodes = 2) {
  v1::Register reg;
  reg.set_name("slurm-77-0");
  reg.set_profile("cluster");
  reg.mutable_slurm()->set_job_id(job_id);
  reg.mutable_slurm()->set_attempt(attempt);
  reg.mutable_slurm()->set_slurm_job_id(slurm_id);
  reg.mutable_slurm()->set_node_index(node);
  reg.mutable_slurm()->set_nodes(nodes);
  return reg;
}

slurm::SlurmJobRecord Record(int64_t job_id, int attempt, int64_t slurm_id) {
  slurm::SlurmJobRecord r;
  r.job_id = job_id;
  r.attempt = attempt;
  r.slurm_id = slurm_id;
  r.profile = "cluster";
  return r;
}

std::string Refusal(const std::string& owner, const v1::Register& reg,
                    const std::optional<slurm::SlurmJobRecord>& record) {
  absl::Status s = CheckSlurmRegistration(owner, reg, record);
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kPermissionDenied) << s;
  return std::string(s.message());
}

TEST(SlurmRegistrationTest, CredentialKeysNameTheirJob) {
  EXPECT_EQ(JobCredentialKey(12), "job:12");
  EXPECT_EQ(JobOfCredentialKey("job:12"), 12);
  EXPECT_EQ(JobOfCredentialKey("worker:job:12"), 0);
  EXPECT_EQ(JobOfCredentialKey("worker:nodes"), 0);
  EXPECT_EQ(JobOfCredentialKey("job:x"), 0);
  EXPECT_EQ(JobOfCredentialKey("job:0"), 0);
}

TEST(SlurmRegistrationTest, TheJobsOwnCredentialRegistersItsNodes) {
  EXPECT_TRUE(CheckSlurmRegistration("job:12", SlurmWorker(12, 1, 77, 0),
                                     Record(12, 1, 77))
                  .ok());
  EXPECT_TRUE(CheckSlurmRegistration("job:12", SlurmWorker(12, 1, 77, 1),
                                     Record(12, 1, 77))
                  .ok());
  // sbatch answered, the id is not committed yet: the credential says it.
  EXPECT_TRUE(
      CheckSlurmRegistration("job:12", SlurmWorker(12, 1, 77), Record(12, 1, 0))
          .ok());
  // Ordinary workers are no business of this check.
  v1::Register plain;
  plain.set_name("w1");
  EXPECT_TRUE(CheckSlurmRegistration("worker:nodes", plain, std::nullopt).ok());
  EXPECT_TRUE(CheckSlurmRegistration("unix:0", plain, std::nullopt).ok());
}

TEST(SlurmRegistrationTest, NoOtherCredentialClaimsASlurmJobsWorker) {
  for (const char* owner : {"worker:nodes", "user:alice", "unix:0", "job:13"}) {
    EXPECT_THAT(Refusal(owner, SlurmWorker(12, 1, 77), Record(12, 1, 77)),
                HasSubstr("serves Slurm job 77 for dlbatch job 12, which this "
                          "scheduler did not submit under the credential it "
                          "presents"))
        << owner;
  }
}

TEST(SlurmRegistrationTest, AOneJobCredentialRegistersNothingElse) {
  v1::Register plain;
  plain.set_name("w1");
  plain.set_profile("local");
  EXPECT_THAT(Refusal("job:12", plain, Record(12, 1, 77)),
              HasSubstr("the credential of dlbatch job 12 registers only that "
                        "job's own workers"));
}

TEST(SlurmRegistrationTest, OnlyTheCurrentAttemptSlurmJobAndNodes) {
  EXPECT_THAT(Refusal("job:12", SlurmWorker(12, 1, 77), std::nullopt),
              HasSubstr("dlbatch job 12 has no Slurm job any more"));
  EXPECT_THAT(Refusal("job:12", SlurmWorker(12, 1, 77), Record(12, 2, 78)),
              HasSubstr("attempt 1 of dlbatch job 12 is over (it is at "
                        "attempt 2)"));
  EXPECT_THAT(Refusal("job:12", SlurmWorker(12, 1, 76), Record(12, 1, 77)),
              HasSubstr("dlbatch job 12 runs as Slurm job 77, not 76"));
  EXPECT_THAT(
      Refusal("job:12", SlurmWorker(12, 1, 77, 2, 2), Record(12, 1, 77)),
      HasSubstr("node 2 of 2 is not a node of a Slurm job"));
}

}  // namespace
}  // namespace dlbatch::scheduler
