// show --sweep, and what submit does for a sweep: print it and follow it.
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/format.h"
#include "client/sweep_table.h"
#include "common/clock.h"
#include "common/status.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {

absl::StatusOr<int> ShowSweep(Connection& conn, int64_t sweep_id, bool json) {
  if (sweep_id <= 0) {
    return UsageError(absl::StrCat("sweep id ", sweep_id,
                                   " is not one; sweep ids start at 1"));
  }
  v1::ListJobsRequest request;
  request.set_sweep_id(sweep_id);
  v1::ListJobsReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListJobs(ctx, request, &reply);
      })));
  std::vector<v1::Job> ranked =
      RankSweepJobs({reply.jobs().begin(), reply.jobs().end()});
  if (json) {
    Json jobs = Json::array();  // `jobs --json`'s shape, best first
    for (const v1::Job& job : ranked) jobs.push_back(JobJson(job));
    PrintJson(Json{{"jobs", std::move(jobs)}});
    return 0;
  }
  int finished = 0;
  for (const v1::Job& job : ranked)
    finished += job.state() == v1::JOB_STATE_FINISHED;
  std::cout << "Sweep " << sweep_id << ": " << ranked.size() << " jobs, "
            << finished << " finished; best first\n"
            << RenderSweepTable(ranked, SystemClock::Get()->NowMs());
  return 0;
}

void PrintSubmittedSweep(const v1::SubmitJobReply& reply, bool quiet) {
  if (quiet) {
    for (int64_t id : reply.job_ids()) std::cout << id << "\n";
    std::cout.flush();
    return;
  }
  std::cout << "Submitted sweep " << reply.sweep_id() << ": "
            << reply.job_ids_size() << " jobs (";
  for (int i = 0; i < reply.job_ids_size(); ++i) {
    std::cout << (i > 0 ? ", " : "") << reply.job_ids(i);
  }
  std::cout << ")\n  dlbatch jobs --sweep " << reply.sweep_id()
            << "   lists them\n  dlbatch show --sweep " << reply.sweep_id()
            << "   compares them, best first" << std::endl;
}

absl::StatusOr<int> FollowSweep(Connection& conn,
                                const v1::SubmitJobReply& reply) {
  std::cerr << "waiting for the " << reply.job_ids_size() << " jobs of sweep "
            << reply.sweep_id() << "\n";
  ASSIGN_OR_RETURN(int rc,
                   Wait(conn, {reply.job_ids().begin(), reply.job_ids().end()},
                        /*timeout_ms=*/0));
  std::cout << "\n";
  ASSIGN_OR_RETURN(int shown,
                   ShowSweep(conn, reply.sweep_id(), /*json=*/false));
  (void)shown;
  return rc;
}

}  // namespace dlbatch::client
