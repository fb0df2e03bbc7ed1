// Deleting ended jobs: `dlbatch admin purge` and the background retention
// of SchedulerOptions::keep_ended_ms.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/admin.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

// Jobs per transaction: the lock is held for one chunk, never a whole
// purge, so placement and worker reports run in between.
constexpr int kPurgeChunk = 100;

// Between chunks the purge steps aside for as long as its chunk held the
// lock (at least a millisecond): absl::Mutex lets a thread that releases and
// takes it again go first, so without the pause a purge of 100,000 jobs
// kept a job's end report waiting for all of it (1.4 s). At most half of the
// scheduler's time goes to a purge.
void StepAside(absl::Time chunk_start) {
  absl::SleepFor(std::max(absl::Milliseconds(1), absl::Now() - chunk_start));
}

}  // namespace

absl::Status Admin::PurgeChunk(const std::vector<int64_t>& ids,
                               v1::PurgeJobsReply* reply) {
  purge_mu_.AssertHeld();
  absl::MutexLock lock(&state_.mu_);
  if (!state_.broken_.ok()) return state_.CheckWritable();
  // Never a job the scheduler still runs (its row may not say so yet).
  std::vector<int64_t> ended;
  for (int64_t id : ids) {
    if (!state_.jobs_.contains(id)) ended.push_back(id);
  }
  // What the metrics count them as (ended jobs: their rows stay as read).
  std::vector<std::pair<std::string, v1::JobState>> leaving;
  if (state_.metrics_ != nullptr) {
    for (int64_t id : ended) {
      absl::StatusOr<std::optional<JobRecord>> rec = state_.reader_->GetJob(id);
      if (rec.ok() && *rec)
        leaving.emplace_back((*rec)->spec.profile(), (*rec)->state);
    }
  }
  PurgeCounts counts;
  {
    Transaction txn(state_.store_->db());
    RETURN_IF_ERROR(txn.status());
    ASSIGN_OR_RETURN(counts, state_.store_->PurgeJobs(ended));
    absl::Status s = state_.TimedCommit(txn);
    if (!s.ok()) {
      // Nothing in memory changed: the purge just did not happen.
      if (s.code() == absl::StatusCode::kResourceExhausted)
        state_.disk_->NoteFull(s);
      return s;
    }
  }
  for (const auto& [profile, state] : leaving) {
    state_.metrics_->JobMoved(profile, state, v1::JOB_STATE_UNSPECIFIED);
  }
  reply->set_purged(reply->purged() + counts.jobs);
  // Under the lock: a submit checks its attachments under it too, so none
  // can start to hold a blob deleted here.
  for (const std::string& sha : counts.unreferenced_blobs) {
    absl::StatusOr<int64_t> freed = state_.blobs_->Remove(sha);
    if (!freed.ok()) {
      spdlog::warn("purge: {}", freed.status().ToString());
      continue;
    }
    if (*freed > 0) {
      reply->set_blobs_deleted(reply->blobs_deleted() + 1);
      reply->set_bytes_freed(reply->bytes_freed() + *freed);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PurgeJobsReply> Admin::Purge(
    const v1::PurgeJobsRequest& request) {
  absl::MutexLock purging(&purge_mu_);
  v1::PurgeJobsReply reply;
  if (!request.job_ids().empty()) {
    std::vector<int64_t> ids;
    for (int64_t id : request.job_ids()) {
      auto* result = reply.add_results();
      result->set_job_id(id);
      ASSIGN_OR_RETURN(auto rec, state_.reader_->GetJob(id));
      bool active;
      {
        absl::MutexLock lock(&state_.mu_);
        active = state_.jobs_.contains(id);
      }
      if (!rec) {
        result->set_error(absl::StrCat("no job ", id));
      } else if (active || !IsTerminal(rec->state)) {
        result->set_error(absl::StrCat(
            "job ", id, " is ", JobStateName(rec->state),
            "; cancel it first (dlbatch cancel ", id, "), then purge it"));
      } else if (request.before_ms() > 0 &&
                 rec->end_ms >= request.before_ms()) {
        result->set_error(
            absl::StrCat("job ", id, " ended after the --before date"));
      } else {
        ids.push_back(id);
      }
    }
    for (size_t i = 0; i < ids.size(); i += kPurgeChunk) {
      std::vector<int64_t> chunk(
          ids.begin() + i, ids.begin() + std::min(ids.size(), i + kPurgeChunk));
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(PurgeChunk(chunk, &reply));
      StepAside(start);
    }
    return reply;
  }
  if (request.before_ms() <= 0) {
    return absl::InvalidArgumentError(
        "name the jobs to purge, or a date: every job ended before it is "
        "purged");
  }
  for (;;) {
    std::vector<int64_t> chunk;
    absl::Time start = absl::Now();
    {
      absl::MutexLock lock(&state_.mu_);
      ASSIGN_OR_RETURN(
          chunk, state_.store_->EndedBefore(request.before_ms(), kPurgeChunk));
    }
    if (chunk.empty()) break;
    StepAside(start);
    start = absl::Now();
    const int64_t before = reply.purged();
    RETURN_IF_ERROR(PurgeChunk(chunk, &reply));
    if (reply.purged() == before) break;  // nothing more can go
    StepAside(start);
  }
  return reply;
}

void Admin::StartRetention(SleepUnlessStopped sleep) {
  retention_ =
      std::thread([this, sleep = std::move(sleep)] { RetentionLoop(sleep); });
}

void Admin::JoinRetention() {
  if (retention_.joinable()) retention_.join();
}

void Admin::RetentionLoop(const SleepUnlessStopped& sleep) {
  const int64_t interval =
      std::max<int64_t>(50, state_.options_.retention_interval_ms);
  for (;;) {
    if (!sleep(absl::Milliseconds(interval))) return;
    v1::PurgeJobsRequest request;
    request.set_before_ms(state_.clock_->NowMs() -
                          state_.options_.keep_ended_ms);
    absl::StatusOr<v1::PurgeJobsReply> purged = Purge(request);
    if (!purged.ok()) {
      spdlog::warn("retention: {}", purged.status().ToString());
    } else if (purged->purged() > 0) {
      spdlog::info("retention: purged {} jobs ended over {} s ago, {} blobs",
                   purged->purged(), state_.options_.keep_ended_ms / 1000,
                   purged->blobs_deleted());
    }
  }
}

}  // namespace dlbatch::scheduler
