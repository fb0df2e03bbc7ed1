// The API's routing: which handler answers a path and method, 404 for an
// unknown path, 405 (with Allow) for a known path's wrong method, and a
// worker credential refused everything.
#include "scheduler/web/api.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "scheduler/rpc/access.h"
#include "scheduler/web/api_params.h"

namespace dlbatch::scheduler::web {
namespace {

constexpr absl::string_view kPrefix = "/api/v1/";

bool IsAction(const std::string& part) {
  return part == "cancel" || part == "hold" || part == "release" ||
         part == "requeue";
}

HttpResponse MethodNotAllowed(const std::string& allow,
                              const std::string& method) {
  HttpResponse response = ErrorResponse(absl::InvalidArgumentError(absl::StrCat(
      "method ", Shown(method), " is not allowed here; use ", allow)));
  response.status = 405;
  // The body's code stays what the status means.
  Json body = Json::parse(response.body, nullptr, false);
  if (body.is_object() && body.contains("error"))
    body["error"]["code"] = "METHOD_NOT_ALLOWED";
  response.body = JsonText(body, /*compact=*/true);
  response.headers.emplace_back("Allow", allow);
  return response;
}

template <typename T>
HttpResponse Answer(absl::StatusOr<T> result) {
  if (!result.ok()) return ErrorResponse(result.status());
  if constexpr (std::is_same_v<T, HttpResponse>) {
    return *std::move(result);
  } else {
    return JsonResponse(*result);
  }
}

}  // namespace

absl::Status RestApi::MayAccess(const Caller& caller, int64_t id,
                                bool control) {
  return MayAccessJob(
      caller, id, control, shared_visibility_,
      [this](int64_t job) { return scheduler_->JobOwner(job); });
}

HttpResponse RestApi::Handle(const HttpRequest& request, const Caller& caller) {
  if (!absl::StartsWith(request.path, kPrefix)) {
    return ErrorResponse(absl::NotFoundError(absl::StrCat(
        "no API at ", Shown(request.path), "; it is under /api/v1/")));
  }
  Parts parts = absl::StrSplit(request.path.substr(kPrefix.size()), '/');
  while (!parts.empty() && parts.back().empty()) parts.pop_back();
  // A worker's credential reads and changes nothing of a user's.
  if (absl::Status refused = RefuseWorker(caller); !refused.ok())
    return ErrorResponse(refused);
  return Route(request, caller, parts);
}

HttpResponse RestApi::Route(const HttpRequest& request, const Caller& caller,
                            const Parts& parts) {
  const std::string& method = request.method;
  const bool get = method == "GET";
  const bool post = method == "POST";
  auto not_found = [&] {
    return ErrorResponse(absl::NotFoundError(
        absl::StrCat("no API at ", Shown(request.path),
                     "; docs/web-api.md lists the endpoints under /api/v1/")));
  };
  if (parts.empty()) return not_found();
  const std::string& top = parts[0];
  if (parts.size() == 1) {
    if (top == "jobs") {
      if (!get) return MethodNotAllowed("GET", method);
      return Answer(ListJobs(request, caller));
    }
    if (top == "workers" || top == "profiles" || top == "queue" ||
        top == "events") {
      if (!get) return MethodNotAllowed("GET", method);
      if (top == "workers") return JsonResponse(Workers());
      if (top == "profiles") return JsonResponse(Profiles());
      if (top == "queue") return Answer(Queue(caller));
      return Answer(Events(request, caller));
    }
    return not_found();
  }
  if ((top == "sweeps" || top == "arrays") && parts.size() == 2) {
    if (!get) return MethodNotAllowed("GET", method);
    absl::StatusOr<int64_t> id =
        PathId(parts[1], top == "sweeps" ? "sweep" : "array");
    if (!id.ok()) return ErrorResponse(id.status());
    return Answer(Sweep(request, caller, *id, top == "arrays"));
  }
  if (top != "jobs") return not_found();
  // POST /jobs/ACTION: several jobs by the body's ids.
  if (parts.size() == 2 && IsAction(parts[1])) {
    if (!post) return MethodNotAllowed("POST", method);
    absl::StatusOr<Json> body = BodyObject(request);
    if (!body.ok()) return ErrorResponse(body.status());
    const Json& ids = (*body)["ids"];
    std::vector<int64_t> list;
    bool valid = ids.is_array() && !ids.empty() &&
                 ids.size() <= static_cast<size_t>(kMaxActionJobs);
    for (const Json& id : valid ? ids : Json::array()) {
      if (!id.is_number_integer() || id.get<int64_t>() <= 0) valid = false;
      if (valid) list.push_back(id.get<int64_t>());
    }
    if (!valid) {
      return ErrorResponse(absl::InvalidArgumentError(absl::StrCat(
          "the body's \"ids\" must be an array of 1..", kMaxActionJobs,
          " positive job ids, such as {\"ids\": [1, 2]}")));
    }
    return Answer(Act(parts[1], list, caller));
  }
  absl::StatusOr<int64_t> id = PathId(parts[1], "job");
  if (!id.ok()) return ErrorResponse(id.status());
  if (parts.size() == 2) {
    if (!get) return MethodNotAllowed("GET", method);
    return Answer(GetJob(caller, *id));
  }
  const std::string& what = parts[2];
  if (IsAction(what) && parts.size() == 3) {
    if (!post) return MethodNotAllowed("POST", method);
    absl::StatusOr<Json> body = BodyObject(request);
    if (!body.ok()) return ErrorResponse(body.status());
    // One job's action that the caller may not take is refused as a whole
    // (403, as the table of statuses says), not a 200 whose one result
    // says no; the bulk form answers each job in its results.
    if (absl::Status may = MayAccess(caller, *id, /*control=*/true);
        absl::IsPermissionDenied(may)) {
      return ErrorResponse(may);
    }
    return Answer(Act(what, {*id}, caller));
  }
  if (what == "outputs" && parts.size() > 3) {
    if (!get) return MethodNotAllowed("GET", method);
    // The rest of the path is the output's (it may have folders).
    const std::string prefix =
        absl::StrCat(kPrefix, "jobs/", parts[1], "/outputs/");
    return Answer(OutputFile(caller, *id, request.path.substr(prefix.size())));
  }
  const bool known =
      (parts.size() == 3 &&
       (what == "progress" || what == "diary" || what == "outputs")) ||
      (parts.size() == 4 && what == "diary" && parts[3] == "events");
  if (!known) return not_found();
  if (!get) return MethodNotAllowed("GET", method);
  if (what == "progress") return Answer(Progress(request, caller, *id));
  if (what == "outputs") return Answer(Outputs(caller, *id));
  if (parts.size() == 4) return Answer(DiaryEvents(request, caller, *id));
  return Answer(Diary(request, caller, *id));
}

}  // namespace dlbatch::scheduler::web
