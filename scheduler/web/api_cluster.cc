// /api/v1/ workers, profiles, the queue, sweeps and arrays, and a job's
// outputs (listed, and each file served from the blob store).
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "proto/sweep_rank.h"
#include "scheduler/rpc/access.h"
#include "scheduler/web/api.h"
#include "scheduler/web/api_params.h"

namespace dlbatch::scheduler::web {
namespace {

// A metric's name as jobs report them: [A-Za-z_][A-Za-z0-9_]*.
bool MetricName(const std::string& name) {
  if (name.empty() || name.size() > 64 || absl::ascii_isdigit(name[0]))
    return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

Json RestApi::Workers() {
  Json workers = Json::array();
  const v1::ListWorkersReply reply = scheduler_->ListWorkers();
  for (const v1::WorkerInfo& w : reply.workers())
    workers.push_back(WorkerJson(w));
  return Json{{"workers", std::move(workers)}};
}

Json RestApi::Profiles() {
  Json profiles = Json::array();
  const v1::ListProfilesReply reply = scheduler_->ListProfiles();
  for (const v1::ProfileInfo& p : reply.profiles())
    profiles.push_back(ProfileJson(p));
  return Json{{"profiles", std::move(profiles)}};
}

absl::StatusOr<Json> RestApi::Queue(const Caller& caller) {
  // The queued jobs as the store lists them, each with its place in the
  // order the scheduler tries its profile's queue in (Job.queue_position:
  // priority, fair share, submission) and why it waits, from memory.
  v1::ListJobsRequest list;
  list.add_states(v1::JOB_STATE_QUEUED);
  list.set_sort("priority");
  list.set_newest_first(true);
  list.set_limit(kMaxQueueJobs);
  ASSIGN_OR_RETURN(v1::ListJobsReply reply, scheduler_->ListJobs(list));
  std::vector<v1::Job> jobs(reply.jobs().begin(), reply.jobs().end());
  // By profile, then position; jobs outside the order (held, waiting for
  // `after`, parked by their array's %N, a Slurm profile's) after the
  // profile's ordered ones, by priority then id.
  auto key = [](const v1::Job& j) {
    const bool placed = j.queue_position() > 0;
    return std::make_tuple(j.spec().profile(), !placed,
                           placed ? j.queue_position() : 0,
                           -j.spec().priority(), j.id());
  };
  std::stable_sort(
      jobs.begin(), jobs.end(),
      [&](const v1::Job& a, const v1::Job& b) { return key(a) < key(b); });
  Json out = Json::array();
  for (v1::Job& job : jobs) {
    RedactJob(caller, &job);
    Json entry = JobJson(job);
    entry["position"] = entry["queue_position"];
    out.push_back(std::move(entry));
  }
  return Json{{"jobs", std::move(out)}};
}

absl::StatusOr<Json> RestApi::Sweep(const HttpRequest& request,
                                    const Caller& caller, int64_t id,
                                    bool array) {
  const std::string metric = request.Query("metric");
  if (request.HasQuery("metric") && !MetricName(metric)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric must be a name such as validation_accuracy or a job's own "
        "([A-Za-z_][A-Za-z0-9_]*, at most 64); got '",
        Shown(metric), "'"));
  }
  const std::string order = request.Query("order", "desc");
  if (order != "asc" && order != "desc") {
    return absl::InvalidArgumentError(absl::StrCat(
        "order must be desc (highest first) or asc (lowest first); got '",
        Shown(order), "'"));
  }
  v1::ListJobsRequest list;
  list.set_sweep_id(id);
  absl::StatusOr<v1::ListJobsReply> reply = scheduler_->ListJobs(list);
  if (array && absl::IsNotFound(reply.status())) {
    return absl::NotFoundError(absl::StrCat(
        "no array ", id,
        "; `dlbatch submit --array` prints an array's id, and `dlbatch show "
        "<job id>` names a job's array"));
  }
  RETURN_IF_ERROR(reply.status());
  std::vector<v1::Job> jobs(reply->jobs().begin(), reply->jobs().end());
  for (v1::Job& job : jobs) {
    if (array && job.array_id() != id) {
      return absl::InvalidArgumentError(absl::StrCat(
          id, " is a sweep, not an array; use /api/v1/sweeps/", id));
    }
    RedactJob(caller, &job);
  }
  // Ranked as `show --sweep` / `show --array` rank them, or by the metric.
  std::vector<v1::Job> ranked =
      !metric.empty() ? RankJobsByMetric(jobs, metric, order == "asc")
      : array         ? ArrayTableJobs(jobs)
                      : RankSweepJobs(jobs);
  Json listed = Json::array();
  for (const v1::Job& job : ranked) listed.push_back(JobJson(job));
  Json summary{{array ? "array_id" : "sweep_id", id},
               {"jobs", static_cast<int64_t>(jobs.size())},
               {"states", ArrayStatesJson(jobs)},
               {"metric", metric.empty() ? Json(nullptr) : Json(metric)}};
  if (array) summary["limit"] = ArrayLimit(jobs);
  return Json{{"jobs", std::move(listed)}, {"summary", std::move(summary)}};
}

absl::StatusOr<Json> RestApi::Outputs(const Caller& caller, int64_t id) {
  RETURN_IF_ERROR(MayAccess(caller, id, /*control=*/false));
  ASSIGN_OR_RETURN(v1::ListOutputsReply reply, scheduler_->ListOutputs(id));
  Json files = Json::array();
  for (const v1::OutputFile& f : reply.files())
    files.push_back(OutputFileJson(f));
  return Json{{"files", std::move(files)}};
}

absl::StatusOr<HttpResponse> RestApi::OutputFile(const Caller& caller,
                                                 int64_t id,
                                                 const std::string& path) {
  RETURN_IF_ERROR(MayAccess(caller, id, /*control=*/false));
  ASSIGN_OR_RETURN(v1::ListOutputsReply reply, scheduler_->ListOutputs(id));
  for (const v1::OutputFile& f : reply.files()) {
    if (f.path() != path) continue;
    if (!f.symlink().empty()) {
      return absl::NotFoundError(absl::StrCat(
          "output '", Shown(path), "' of job ", id, " is a symbolic link to '",
          Shown(f.symlink()), "'; download what it points to"));
    }
    HttpResponse response;
    response.content_type = "application/octet-stream";
    response.file_path = blobs_->PathFor(f.sha256());
    response.headers = {
        {"ETag", absl::StrCat("\"", f.sha256(), "\"")},
        {"X-Checksum-Sha256", f.sha256()},
        {"Content-Disposition", AttachmentDisposition(f.path())}};
    return response;
  }
  return absl::NotFoundError(absl::StrCat("job ", id, " has no output '",
                                          Shown(path), "'; GET /api/v1/jobs/",
                                          id, "/outputs lists them"));
}

}  // namespace dlbatch::scheduler::web
