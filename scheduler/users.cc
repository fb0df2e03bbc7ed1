// Per-user limits and fair-share usage, and whose jobs each worker runs, as
// placement needs to know it.
//
// A worker not started as root runs only its own user's jobs, and says so
// when it registers. A worker started as root runs each job as its owner,
// so it runs any user its machine knows. Which users that is, the
// scheduler asks user by user (UserQuery, answered with UserAnswer by a
// getpwnam on the worker) rather than having the worker list them: a
// machine whose accounts come from a large LDAP directory cannot (or may
// not be allowed to) enumerate them, and would send a list as large as the
// directory at every connection, while only the users who submit jobs
// matter. A user is asked about when their job is submitted (the submit
// waits briefly for the answers, so that a user no worker knows is refused
// at once), when a worker joins with jobs of that user queued, and when a
// job of theirs is requeued. Answers hold for the worker's session (a
// worker that reconnects is asked again), and a "no" only for
// unknown_user_recheck_ms: a submit after it asks again.
#include "scheduler/users.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status.h"

namespace dlbatch::scheduler {
namespace {

// How long a submit waits for workers to say whether they know its user.
constexpr int64_t kUserAnswerWaitMs = 2000;
// Workers named in a wait reason; more are counted.
constexpr size_t kNamedWorkers = 3;

}  // namespace

void Users::RegisterWorkerUsers(SchedulerState& s, WorkerState& worker,
                                const v1::Register& reg, Outbox* out) {
  s.mu_.AssertHeld();
  worker.runs_as_any = reg.runs_as_any_user();
  worker.run_user = reg.user();
  worker.asked.clear();
  worker.unknown_since.clear();
  WorkerUsers users;
  if (!reg.user().empty()) {
    users.anyone = false;
    if (!reg.runs_as_any_user()) {
      users.closed = true;
      users.can.insert(reg.user());
    }
  }
  s.core_->SetWorkerUsers(worker.record.id, std::move(users));
  if (!worker.runs_as_any || worker.run_user.empty()) return;
  std::set<std::string> queued_users;
  for (const auto& [id, job] : s.jobs_) {
    if (job.record.state == v1::JOB_STATE_QUEUED &&
        job.record.spec.profile() == worker.record.profile) {
      queued_users.insert(job.record.user);
    }
  }
  for (const std::string& user : queued_users) {
    AskWorkers(s, worker.record.profile, user, out);
  }
}

void Users::AskWorkers(SchedulerState& s, const std::string& profile,
                       const std::string& user, Outbox* out) {
  s.mu_.AssertHeld();
  if (user.empty()) return;
  const int64_t now = s.clock_->MonotonicMs();
  for (auto& [id, w] : s.workers_) {
    if (!w.session || w.lost || w.record.profile != profile || !w.runs_as_any ||
        w.run_user.empty()) {
      continue;
    }
    if (!w.asked.insert(user).second) {
      auto no = w.unknown_since.find(user);
      if (no == w.unknown_since.end() ||
          now - no->second < s.options_.unknown_user_recheck_ms) {
        continue;
      }
      // An old "no": undecided until the worker answers again.
      w.unknown_since.erase(no);
      s.core_->ForgetWorkerUser(id, user);
    }
    v1::SchedulerMessage query;
    query.mutable_user_query()->set_user(user);
    out->emplace_back(w.session, std::move(query));
  }
}

bool Users::AllAnswered(const SchedulerState& s, const std::string& profile,
                        const std::string& user) {
  s.mu_.AssertHeld();
  for (const auto& [id, fit] : s.core_->UserFits(profile, user)) {
    if (fit != UserFit::kUndecided) continue;
    auto w = s.workers_.find(id);
    if (w != s.workers_.end() && w->second.session && !w->second.lost &&
        w->second.asked.count(user) != 0) {
      return false;
    }
  }
  return true;
}

void Users::AskBeforeSubmit(const std::set<std::string>& profiles,
                            const std::string& user) {
  Outbox out;
  {
    absl::MutexLock lock(&state_.mu_);
    for (const std::string& profile : profiles) {
      AskWorkers(state_, profile, user, &out);
    }
  }
  SchedulerState::Deliver(out);
  absl::MutexLock lock(&state_.mu_);
  auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
    for (const std::string& profile : profiles) {
      if (!AllAnswered(state_, profile, user)) return false;
    }
    return true;
  };
  state_.mu_.AwaitWithTimeout(absl::Condition(&answered),
                              absl::Milliseconds(kUserAnswerWaitMs));
}

std::string Users::UnableWhy(const WorkerState& worker, const std::string& user,
                             UserFit fit) {
  const std::string& name = worker.record.name;
  if (fit == UserFit::kUndecided) {
    return absl::StrCat("'", name, "' has not said yet whether it knows ",
                        user);
  }
  if (!worker.runs_as_any && !worker.run_user.empty()) {
    return absl::StrCat("'", name, "' runs as ", worker.run_user, ", so only ",
                        worker.run_user, "'s jobs");
  }
  return absl::StrCat("'", name, "' has no user ", user);
}

absl::Status Users::CheckUserRuns(const SchedulerState& s,
                                  const JobRecord& job) const {
  s.mu_.AssertHeld();
  const std::string& profile = job.spec.profile();
  std::vector<std::string> why;
  for (const auto& [id, fit] : s.core_->UserFits(profile, job.user)) {
    if (fit != UserFit::kNo) return absl::OkStatus();
    auto w = s.workers_.find(id);
    if (w != s.workers_.end())
      why.push_back(UnableWhy(w->second, job.user, fit));
  }
  if (why.empty()) return absl::OkStatus();  // no worker: others say so
  return absl::FailedPreconditionError(absl::StrCat(
      "no worker of profile '", profile, "' runs ", job.user,
      "'s jobs: ", absl::StrJoin(why, "; "), "; give ", job.user,
      " an account on a worker started as root, start a worker as ", job.user,
      ", or use another profile"));
}

std::string Users::UsersWaitReason(const SchedulerState& s,
                                   const ActiveJob& job,
                                   const WaitInfo& info) const {
  s.mu_.AssertHeld();
  if (info.unable_workers == 0) return "";
  const std::string& user = job.record.user;
  const std::string& profile = job.record.spec.profile();
  auto fits = s.core_->UserFits(profile, user);
  std::vector<std::string> why;
  int unnamed = 0;
  for (const auto& [id, fit] : fits) {
    auto w = s.workers_.find(id);
    if (fit == UserFit::kYes || w == s.workers_.end() || !w->second.session ||
        w->second.lost) {
      continue;
    }
    if (why.size() < kNamedWorkers) {
      why.push_back(UnableWhy(w->second, user, fit));
    } else {
      ++unnamed;
    }
  }
  if (unnamed > 0) {
    why.push_back(absl::StrCat(unnamed, " more"));
  }
  std::string reason;
  if (info.able_workers == 0) {
    reason = absl::StrFormat(
        "waiting for %d slot%s on '%s': no online worker runs %s's jobs",
        info.needed, info.needed == 1 ? "" : "s", profile, user);
  } else {
    reason = absl::StrFormat(
        "waiting for %d slot%s on '%s' on the %d worker%s that run%s %s's "
        "jobs: %d free",
        info.needed, info.needed == 1 ? "" : "s", profile, info.able_workers,
        info.able_workers == 1 ? "" : "s", info.able_workers == 1 ? "s" : "",
        user, info.able_free);
  }
  absl::StrAppend(&reason, " (", absl::StrJoin(why, "; "), ")");
  return reason;
}

absl::Status Users::SetUserLimit(const std::string& user,
                                 const std::string& profile,
                                 const UserLimit& limit) {
  if (user.empty()) {
    return absl::InvalidArgumentError("a limit needs a user name");
  }
  Outbox out;
  {
    absl::MutexLock lock(&state_.mu_);
    if (!state_.core_->HasProfile(profile)) {
      std::vector<std::string> names;
      for (const ProfileSummary& p : state_.core_->Profiles()) {
        names.push_back(p.name);
      }
      return absl::NotFoundError(
          absl::StrCat("unknown profile '", profile,
                       "'; known profiles: ", absl::StrJoin(names, ", ")));
    }
    RETURN_IF_ERROR(state_.CheckWritable());
    RETURN_IF_ERROR(
        state_.InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu_) {
          return state_.store_->PutUserLimit({user, profile, limit});
        }));
    if (limit == UserLimit{}) {
      state_.limits_.erase({user, profile});
    } else {
      state_.limits_[{user, profile}] = limit;
    }
    state_.core_->SetLimit(user, profile, limit);
    (void)state_.PlaceJobs(&out);  // a raised limit may let jobs start
  }
  SchedulerState::Deliver(out);
  return absl::OkStatus();
}

std::vector<LimitEntry> Users::UserLimits() {
  absl::MutexLock lock(&state_.mu_);
  return state_.core_->Limits();
}

std::vector<UserUsage> Users::Usage(int64_t* now) {
  absl::MutexLock lock(&state_.mu_);
  const int64_t t = state_.clock_->NowMs();
  if (now != nullptr) *now = t;
  return state_.core_->Usage(t);
}

}  // namespace dlbatch::scheduler
