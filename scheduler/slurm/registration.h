// Who may register as the worker of a Slurm batch job. Each batch job's
// script carries a one-job credential (credentials.h: a record with
// job_id set, Key "job:<id>"); a job is untrusted code and can read it, so
// the credential gives nothing but this: registering, as one node of that
// job's current attempt, a worker that serves that job alone. And no other
// credential may claim a Slurm job's worker, or it would be handed the job.
//
// Pure: the registration, the credential it came under and the job's Slurm
// record in, a verdict out.
#ifndef DLBATCH_SCHEDULER_SLURM_REGISTRATION_H_
#define DLBATCH_SCHEDULER_SLURM_REGISTRATION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/slurm/launcher.h"

namespace dlbatch::scheduler {

// The credential key of job `job_id`'s one-job credential: "job:<id>".
std::string JobCredentialKey(int64_t job_id);

// The job a credential key is good for, or 0 when it is no one-job
// credential's.
int64_t JobOfCredentialKey(const std::string& key);

// OK where a worker registering with `reg` under credential key `owner`
// may: a registration without Register.slurm under any credential but a
// one-job one, or one with it under that job's own credential, for the
// attempt and Slurm job the store holds (`record`: the job's Slurm job;
// nullopt when it has none), as one of its nodes. Otherwise
// PermissionDenied saying why, for the worker's refusal.
absl::Status CheckSlurmRegistration(
    const std::string& owner, const v1::Register& reg,
    const std::optional<slurm::SlurmJobRecord>& record);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_SLURM_REGISTRATION_H_
