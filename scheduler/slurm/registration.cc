#include "scheduler/slurm/registration.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dlbatch::scheduler {

std::string JobCredentialKey(int64_t job_id) {
  return absl::StrCat("job:", job_id);
}

int64_t JobOfCredentialKey(const std::string& key) {
  absl::string_view rest = key;
  int64_t id = 0;
  if (!absl::ConsumePrefix(&rest, "job:") || !absl::SimpleAtoi(rest, &id) ||
      id <= 0) {
    return 0;
  }
  return id;
}

absl::Status CheckSlurmRegistration(
    const std::string& owner, const v1::Register& reg,
    const std::optional<slurm::SlurmJobRecord>& record) {
  const int64_t owner_job = JobOfCredentialKey(owner);
  if (!reg.has_slurm()) {
    if (owner_job == 0) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "the credential of dlbatch job ", owner_job,
        " registers only that job's own workers (started by its Slurm batch "
        "script), never a worker that takes other jobs"));
  }
  const v1::SlurmJob& s = reg.slurm();
  if (owner_job != s.job_id()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this worker serves Slurm job ", s.slurm_job_id(), " for dlbatch job ",
        s.job_id(),
        ", which this scheduler did not submit under the credential it "
        "presents; a Slurm profile's workers are started by the scheduler's "
        "own sbatch, never by hand"));
  }
  if (!record) {
    return absl::PermissionDeniedError(absl::StrCat(
        "dlbatch job ", s.job_id(),
        " has no Slurm job any more (it ended or was cancelled); this worker "
        "has nothing to run"));
  }
  if (record->attempt != s.attempt()) {
    return absl::PermissionDeniedError(
        absl::StrCat("attempt ", s.attempt(), " of dlbatch job ", s.job_id(),
                     " is over (it is at attempt ", record->attempt,
                     "); this worker has nothing to run"));
  }
  // slurm_id 0: sbatch has answered but the id is not committed yet; the
  // credential, made for this launch alone, already says it is this job.
  if (record->slurm_id != 0 && record->slurm_id != s.slurm_job_id()) {
    return absl::PermissionDeniedError(
        absl::StrCat("dlbatch job ", s.job_id(), " runs as Slurm job ",
                     record->slurm_id, ", not ", s.slurm_job_id()));
  }
  if (s.nodes() < 1 || s.node_index() < 0 || s.node_index() >= s.nodes()) {
    return absl::PermissionDeniedError(
        absl::StrCat("node ", s.node_index(), " of ", s.nodes(),
                     " is not a node of a Slurm job"));
  }
  return absl::OkStatus();
}

}  // namespace dlbatch::scheduler
