// The scheduler's users: their credentials (tokens, kept in the store),
// their per-user limits and fair-share usage (placement.h), and which
// workers run whose jobs (users.cc says how that is learnt). Reached as
// Scheduler::users(); the Scheduler calls the hooks below as jobs are
// submitted, requeued and explained and as workers register.
//
// Lock story. Users owns no lock and no state of its own: what it keeps
// lives in the shared state under the scheduler's mu_
// (scheduler_state.h): the limits (limits_, which it alone changes after
// Load), each worker's users (WorkerState::runs_as_any, run_user, asked,
// unknown_since, and the placement core's view of them), the credentials'
// rows in the store. Its entry points take mu_ themselves; its hooks run
// under it and take the state as `s` (ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_)).
// AskBeforeSubmit is the one that waits: it sends its questions after
// releasing mu_, then waits on mu_ (absl's Await releases it meanwhile) for
// the answers, which the loop thread records under it.
#ifndef DLBATCH_SCHEDULER_USERS_H_
#define DLBATCH_SCHEDULER_USERS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/core/placement.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/scheduler_state.h"

namespace dlbatch::scheduler {

class Users {
 public:
  using ActiveJob = SchedulerState::ActiveJob;
  using WorkerState = SchedulerState::WorkerState;
  using Outbox = SchedulerState::Outbox;

  // `state` must outlive the Users.
  explicit Users(SchedulerState& state) : state_(state) {}
  Users(const Users&) = delete;
  Users& operator=(const Users&) = delete;

  // ---- tokens (credentials.h), kept in the store (users_credentials.cc) ----
  absl::StatusOr<std::vector<CredentialRecord>> Credentials()
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  absl::Status PutCredential(const CredentialRecord& record)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Whether a credential was deleted (false: none of that name and kind).
  absl::StatusOr<bool> DeleteCredential(const std::string& name, bool worker)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  // Whether blob `sha256` is an attachment or checkpoint file of a job now
  // running on a worker connected under `credential`: what a worker
  // credential may download.
  bool WorkerNeedsBlob(const std::string& credential, const std::string& sha256)
      ABSL_LOCKS_EXCLUDED(state_.mu_);

  // ---- per-user limits and fair-share usage (users.cc) ----
  // Kept in the store: limits as set, usage of ended jobs as each ends
  // (running jobs count again from their start after a restart).
  // SetUserLimit replaces the user's limits on the profile (unlimited in
  // both: removed); NotFound for an unknown profile.
  absl::Status SetUserLimit(const std::string& user, const std::string& profile,
                            const UserLimit& limit)
      ABSL_LOCKS_EXCLUDED(state_.mu_);
  std::vector<LimitEntry> UserLimits() ABSL_LOCKS_EXCLUDED(state_.mu_);
  // `now`, if given, receives the time the usage was decayed to.
  std::vector<UserUsage> Usage(int64_t* now = nullptr)
      ABSL_LOCKS_EXCLUDED(state_.mu_);

  // ---- whose jobs workers run (users.cc) ----
  // Before a submit: asks the profiles' workers about the user and waits
  // (at most kUserAnswerWaitMs) for their answers, so that a user no
  // worker knows is refused at once.
  void AskBeforeSubmit(const std::set<std::string>& profiles,
                       const std::string& user) ABSL_LOCKS_EXCLUDED(state_.mu_);
  // The placement core's view of a worker that just registered; asks it
  // about the users of its profile's queued jobs if it runs as any user.
  void RegisterWorkerUsers(SchedulerState& s, WorkerState& worker,
                           const v1::Register& reg, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Asks the online workers of `profile` that run as any user and were not
  // asked yet whether they know `user`.
  void AskWorkers(SchedulerState& s, const std::string& profile,
                  const std::string& user, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // FailedPrecondition if no registered worker of the job's profile runs
  // its user's jobs (each named with why); undecided ones count as able.
  absl::Status CheckUserRuns(const SchedulerState& s,
                             const JobRecord& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // The wait reason's part about workers that do not run the job's user
  // (empty if every online worker does).
  std::string UsersWaitReason(const SchedulerState& s, const ActiveJob& job,
                              const WaitInfo& info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);

 private:
  // Whether every online worker of the profile asked about `user` has
  // answered.
  static bool AllAnswered(const SchedulerState& s, const std::string& profile,
                          const std::string& user)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu_);
  // Why `worker` does not run `user`'s jobs: "'w2' runs only nobody's".
  static std::string UnableWhy(const WorkerState& worker,
                               const std::string& user, UserFit fit);

  SchedulerState& state_;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_USERS_H_
