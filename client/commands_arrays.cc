// Job arrays in the CLI: what submit prints for one, jobs/show --array,
// and the jobs of an array that cancel/hold/release --array act on. An
// array is listed as the sweep of its id is (ListJobs.sweep_id).
#include <algorithm>
#include <functional>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/sweep_table.h"
#include "common/clock.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace {

// "10-14, 20": ascending ids with their runs joined.
std::string IdRuns(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ", ", ids[i]);
    if (j > i) absl::StrAppend(&out, "-", ids[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<v1::Job>> ListArrayJobs(
    Connection& conn, int64_t array_id,
    const std::vector<v1::JobState>& states) {
  if (array_id <= 0) {
    return UsageError(absl::StrCat("array id ", array_id,
                                   " is not one; array ids start at 1"));
  }
  v1::ListJobsRequest request;
  request.set_sweep_id(array_id);
  for (v1::JobState state : states) request.add_states(state);
  v1::ListJobsReply reply;
  absl::Status s = conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListJobs(ctx, request, &reply);
      }));
  if (s.code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(
        "no array ", array_id,
        "; `dlbatch submit --array` prints an array's id, and `dlbatch show "
        "<job id>` names a job's array"));
  }
  RETURN_IF_ERROR(s);
  std::vector<v1::Job> jobs(reply.jobs().begin(), reply.jobs().end());
  for (const v1::Job& job : jobs) {
    if (job.array_id() != array_id) {
      // The same numbering: a sweep's id names no array.
      return absl::InvalidArgumentError(absl::StrCat(
          array_id, " is a sweep, not an array; use --sweep ", array_id));
    }
  }
  return jobs;
}

absl::StatusOr<std::vector<int64_t>> ArrayJobIds(
    Connection& conn, int64_t array_id, const std::vector<v1::JobState>& states,
    const std::function<bool(const v1::Job&)>& keep) {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs,
                   ListArrayJobs(conn, array_id, states));
  std::vector<int64_t> ids;
  for (const v1::Job& job : jobs) {
    if (!keep || keep(job)) ids.push_back(job.id());
  }
  return ids;
}

absl::StatusOr<int> ShowArray(Connection& conn, int64_t array_id, bool json) {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs,
                   ListArrayJobs(conn, array_id, {}));
  std::vector<v1::Job> table = ArrayTableJobs(jobs);
  if (json) {
    Json listed = Json::array();  // `jobs --json`'s shape, in table order
    for (const v1::Job& job : table) listed.push_back(JobJson(job));
    PrintJson(Json{{"array_id", array_id},
                   {"limit", ArrayLimit(jobs)},
                   {"states", ArrayStatesJson(jobs)},
                   {"jobs", std::move(listed)}});
    return 0;
  }
  std::cout << "Array " << array_id << ": " << ArraySummary(jobs)
            << (table.empty() || MetricsOf(table.front()).source ==
                                     SweepMetrics::Source::kNone
                    ? ""
                    : "; best first")
            << "\n"
            << RenderSweepTable(table, SystemClock::Get()->NowMs());
  return 0;
}

void PrintSubmittedArray(const v1::SubmitJobReply& reply, bool quiet) {
  if (quiet) {
    for (int64_t id : reply.job_ids()) std::cout << id << "\n";
    std::cout.flush();
    return;
  }
  std::cout << "Submitted array " << reply.sweep_id() << ": "
            << reply.job_ids_size()
            << (reply.job_ids_size() == 1 ? " job (" : " jobs (")
            << IdRuns({reply.job_ids().begin(), reply.job_ids().end()})
            << ")\n  dlbatch jobs --array " << reply.sweep_id()
            << "   lists them\n  dlbatch show --array " << reply.sweep_id()
            << "   sums them up\n  dlbatch cancel --array " << reply.sweep_id()
            << " cancels them" << std::endl;
}

absl::StatusOr<int> FollowArray(Connection& conn,
                                const v1::SubmitJobReply& reply) {
  std::cerr << "waiting for the " << reply.job_ids_size() << " jobs of array "
            << reply.sweep_id() << "\n";
  ASSIGN_OR_RETURN(int rc,
                   Wait(conn, {reply.job_ids().begin(), reply.job_ids().end()},
                        /*timeout_ms=*/0));
  std::cout << "\n";
  ASSIGN_OR_RETURN(int shown,
                   ShowArray(conn, reply.sweep_id(), /*json=*/false));
  (void)shown;
  return rc;
}

}  // namespace dlbatch::client
