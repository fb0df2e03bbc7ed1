// /api/v1/jobs: the listing (a page filtered and sorted by the store), a
// job, its progress history, and the actions on one or several jobs.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/rpc/access.h"
#include "scheduler/web/api.h"
#include "scheduler/web/api_params.h"

namespace dlbatch::scheduler::web {
namespace {

constexpr size_t kMaxNameQuery = 200;

// A progress value, or null where the report has none (NaN included).
Json Value(bool known, double value) {
  return known && std::isfinite(value) ? Json(value) : Json(nullptr);
}

Json PointJson(int64_t seq, const v1::TrainProgress& p) {
  const bool iterated = p.iteration() > 0;
  const bool validated = p.has_validation();
  Json metrics = Json::object();
  // Sorted by name (the map's order is not defined).
  std::map<std::string, double> sorted(p.metrics().begin(), p.metrics().end());
  for (const auto& [name, value] : sorted) metrics[name] = Value(true, value);
  return Json{
      {"seq", seq},
      {"time", JsonTime(p.time_ms())},
      {"iteration", p.iteration()},
      {"epoch", p.epoch()},
      {"loss", Value(iterated, p.loss())},
      {"accuracy", Value(iterated, p.accuracy())},
      {"validation_loss", Value(validated, p.validation_loss())},
      {"validation_accuracy", Value(validated, p.validation_accuracy())},
      {"learn_rate", Value(iterated, p.learn_rate())},
      {"images_per_s", Value(iterated, p.images_per_s())},
      {"metrics", std::move(metrics)}};
}

absl::StatusOr<bool> FlagParam(const HttpRequest& request,
                               const std::string& name) {
  const std::string v = request.Query(name, "0");
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false" || v.empty()) return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be 1 or 0; got '", Shown(v), "'"));
}

}  // namespace

absl::StatusOr<Json> RestApi::ListJobs(const HttpRequest& request,
                                       const Caller& caller) {
  v1::ListJobsRequest list;
  ASSIGN_OR_RETURN(std::vector<v1::JobState> states,
                   StatesParam(request.Query("state")));
  for (v1::JobState s : states) list.add_states(s);
  ASSIGN_OR_RETURN(int64_t limit,
                   IntParam(request, "limit", 1, kMaxJobPage, kDefaultJobPage));
  ASSIGN_OR_RETURN(int64_t offset,
                   IntParam(request, "offset", 0, INT32_MAX, 0));
  list.set_limit(static_cast<int32_t>(limit));
  list.set_offset(static_cast<int32_t>(offset));
  const std::string sort = request.Query("sort", "id");
  if (sort != "id" && sort != "submit_time" && sort != "name" &&
      sort != "user" && sort != "state" && sort != "priority") {
    return absl::InvalidArgumentError(absl::StrCat(
        "sort must be id, submit_time, name, user, state or priority; got '",
        Shown(sort), "'"));
  }
  list.set_sort(sort);
  const std::string order = request.Query("order", "desc");
  if (order != "asc" && order != "desc") {
    return absl::InvalidArgumentError(
        absl::StrCat("order must be asc or desc; got '", Shown(order), "'"));
  }
  list.set_newest_first(order == "desc");
  ASSIGN_OR_RETURN(bool mine, FlagParam(request, "mine"));
  // As ListJobs: mine is the caller as the scheduler knows it.
  list.set_user(mine ? caller.user : request.Query("user"));
  const std::string q = request.Query("q");
  if (q.size() > kMaxNameQuery) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q must be at most ", kMaxNameQuery, " bytes; got ", q.size()));
  }
  list.set_name_contains(q);
  list.set_count_total(true);
  ASSIGN_OR_RETURN(v1::ListJobsReply reply, scheduler_->ListJobs(list));
  Json jobs = Json::array();
  for (v1::Job& job : *reply.mutable_jobs()) {
    RedactJob(caller, &job);
    jobs.push_back(JobJson(job));
  }
  return Json{{"jobs", std::move(jobs)},
              {"total", reply.total()},
              {"offset", offset},
              {"limit", limit}};
}

absl::StatusOr<Json> RestApi::GetJob(const Caller& caller, int64_t id) {
  RETURN_IF_ERROR(MayAccess(caller, id, /*control=*/false));
  ASSIGN_OR_RETURN(v1::Job job, scheduler_->GetJob(id));
  RedactJob(caller, &job);
  return JobJson(job);
}

absl::StatusOr<Json> RestApi::Progress(const HttpRequest& request,
                                       const Caller& caller, int64_t id) {
  ASSIGN_OR_RETURN(int64_t after, IntParam(request, "after", 0, INT64_MAX, 0));
  RETURN_IF_ERROR(MayAccess(caller, id, /*control=*/false));
  RETURN_IF_ERROR(scheduler_->JobOwner(id).status());  // NotFound
  ASSIGN_OR_RETURN(std::vector<StoreReader::ProgressPoint> history,
                   reader_->ProgressHistory(id, after, kMaxProgressPoints));
  Json points = Json::array();
  int64_t next = after;
  for (const StoreReader::ProgressPoint& point : history) {
    points.push_back(PointJson(point.seq, point.progress));
    next = point.seq;
  }
  return Json{{"points", std::move(points)}, {"next", next}};
}

absl::StatusOr<Json> RestApi::Act(const std::string& action,
                                  const std::vector<int64_t>& ids,
                                  const Caller& caller) {
  auto may = [&](int64_t id) {
    return MayAccess(caller, id, /*control=*/true);
  };
  const char* done = action == "cancel"    ? "cancelled"
                     : action == "hold"    ? "held"
                     : action == "release" ? "released"
                                           : "requeued";
  Json results = Json::array();
  auto add = [&](const auto& reply) {
    for (const auto& r : reply.results()) {
      results.push_back(
          Json{{"job", r.job_id()},
               {"ok", r.error().empty()},
               {"state", r.state() == v1::JOB_STATE_UNSPECIFIED
                             ? Json(nullptr)
                             : JsonState(r.state())},
               {"message", r.error().empty()
                               ? absl::StrCat("job ", r.job_id(), " ", done)
                               : r.error()}});
    }
  };
  if (action == "cancel") {
    v1::CancelJobsRequest request;
    request.mutable_job_ids()->Add(ids.begin(), ids.end());
    v1::CancelJobsReply reply;
    RETURN_IF_ERROR(ForControllableJobs(
        request, &reply, may, [&](const v1::CancelJobsRequest& allowed) {
          return scheduler_->Cancel(allowed);
        }));
    add(reply);
  } else {
    v1::ControlJobsRequest request;
    request.set_action(action == "hold"      ? v1::JOB_CONTROL_HOLD
                       : action == "release" ? v1::JOB_CONTROL_RELEASE
                                             : v1::JOB_CONTROL_REQUEUE);
    request.mutable_job_ids()->Add(ids.begin(), ids.end());
    v1::ControlJobsReply reply;
    RETURN_IF_ERROR(ForControllableJobs(
        request, &reply, may, [&](const v1::ControlJobsRequest& allowed) {
          return scheduler_->control().ControlJobs(allowed);
        }));
    add(reply);
  }
  return Json{{"results", std::move(results)}};
}

}  // namespace dlbatch::scheduler::web
