#include "client/commands_control.h"

#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/format.h"
#include "client/terminal_text.h"
#include "common/status.h"
#include "proto/job_state.h"

namespace dlbatch::client {
namespace {

absl::StatusOr<int> Control(Connection& conn, v1::JobControl action,
                            const std::vector<int64_t>& ids) {
  v1::ControlJobsRequest request;
  request.set_action(action);
  request.mutable_job_ids()->Add(ids.begin(), ids.end());
  v1::ControlJobsReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ControlJobs(ctx, request, &reply);
      })));
  const char* done = action == v1::JOB_CONTROL_HOLD      ? "held"
                     : action == v1::JOB_CONTROL_RELEASE ? "released"
                                                         : "requeued";
  int rc = 0;
  for (const auto& r : reply.results()) {
    if (!r.error().empty()) {
      std::cerr << "dlbatch: " << TerminalText(r.error()) << "\n";
      rc = 1;
      continue;
    }
    std::cout << "job " << r.job_id() << " " << done;
    if (action == v1::JOB_CONTROL_REQUEUE &&
        r.state() != v1::JOB_STATE_QUEUED) {
      std::cout << " (attempt stopping; queued again once it has stopped)";
    }
    std::cout << "\n";
  }
  return rc;
}

void PrintWorker(const v1::WorkerInfo& w) {
  std::cout << "worker '" << TerminalText(w.name()) << "' "
            << WorkerStateText(w);
  if (!w.drain_reason().empty())
    std::cout << ": " << TerminalText(w.drain_reason());
  if (w.draining() && !w.running_jobs().empty()) {
    std::cout << "; still running job"
              << (w.running_jobs_size() == 1 ? " " : "s ")
              << absl::StrJoin(w.running_jobs(), ", ");
  }
  std::cout << "\n";
}

}  // namespace

std::string JobStateText(const v1::Job& job) {
  if (job.held() && job.state() == v1::JOB_STATE_QUEUED) return "held";
  return JobStateName(job.state());
}

std::string WorkerStateText(const v1::WorkerInfo& worker) {
  if (worker.draining()) return worker.online() ? "draining" : "drained";
  return worker.online() ? "online" : "offline";
}

void AddControlCommands(CLI::App& app, const GlobalFlags* flags, int* rc) {
  struct Spec {
    const char* name;
    const char* help;
    v1::JobControl action;
  };
  for (const Spec& spec :
       {Spec{"hold",
             "Keep queued jobs from starting (they stay queued) until "
             "released",
             v1::JOB_CONTROL_HOLD},
        Spec{"release", "Let held jobs start again", v1::JOB_CONTROL_RELEASE},
        Spec{"requeue",
             "Stop running jobs and queue them again as a new attempt "
             "(train jobs resume from their last checkpoint); queue failed "
             "or cancelled jobs again",
             v1::JOB_CONTROL_REQUEUE}}) {
    auto ids = std::make_shared<std::vector<int64_t>>();
    auto array = std::make_shared<int64_t>(0);
    auto* command = app.add_subcommand(spec.name, spec.help);
    auto* ids_opt = command->add_option("ids", *ids, "Job ids");
    CLI::Option* array_opt = nullptr;
    const v1::JobControl action = spec.action;
    if (action != v1::JOB_CONTROL_REQUEUE) {
      array_opt = command
                      ->add_option("--array", *array,
                                   action == v1::JOB_CONTROL_HOLD
                                       ? "Instead: every queued job of this "
                                         "array that is not held"
                                       : "Instead: every held job of this "
                                         "array")
                      ->excludes(ids_opt);
    }
    const std::string name = spec.name;
    command->callback([flags, rc, ids, array, action, ids_opt, array_opt,
                       name] {
      const bool by_array = array_opt != nullptr && array_opt->count() > 0;
      if (!by_array && ids_opt->count() == 0) {
        *rc = Report(UsageError(
            absl::StrCat(name, ": give job ids",
                         array_opt != nullptr ? ", or --array ID" : "")));
        return;
      }
      *rc = WithConnection(*flags, [&](Connection& c) -> absl::StatusOr<int> {
        if (!by_array) return Control(c, action, *ids);
        const bool hold = action == v1::JOB_CONTROL_HOLD;
        ASSIGN_OR_RETURN(std::vector<int64_t> jobs,
                         ArrayJobIds(c, *array, {v1::JOB_STATE_QUEUED},
                                     [hold](const v1::Job& job) {
                                       return job.held() != hold;
                                     }));
        if (jobs.empty()) {
          std::cout << "array " << *array << ": no "
                    << (hold ? "queued job to hold" : "held job to release")
                    << "\n";
          return 0;
        }
        return Control(c, action, jobs);
      });
    });
  }
}

void AddWorkerAdminCommands(CLI::App* admin, const GlobalFlags* flags,
                            int* rc) {
  struct Args {
    std::string name;
    std::string reason;
  };
  auto args = std::make_shared<Args>();
  auto* drain = admin->add_subcommand(
      "drain",
      "Place no new jobs on a worker (its running jobs finish), e.g. for "
      "maintenance; kept across scheduler restarts until resumed");
  drain->add_option("worker", args->name, "The worker's name (or id)")
      ->required();
  drain->add_option("--reason", args->reason,
                    "Why, shown in `dlbatch workers` and the monitor");
  drain->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& c) -> absl::StatusOr<int> {
      v1::DrainWorkerRequest request;
      request.set_name(args->name);
      request.set_reason(args->reason);
      v1::WorkerInfo reply;
      RETURN_IF_ERROR(c.Error(
          c.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
            return stub->DrainWorker(ctx, request, &reply);
          })));
      PrintWorker(reply);
      return 0;
    });
  });
  auto* resume = admin->add_subcommand(
      "resume", "Let a drained worker take new jobs again");
  resume->add_option("worker", args->name, "The worker's name (or id)")
      ->required();
  resume->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& c) -> absl::StatusOr<int> {
      v1::ResumeWorkerRequest request;
      request.set_name(args->name);
      v1::WorkerInfo reply;
      RETURN_IF_ERROR(c.Error(
          c.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
            return stub->ResumeWorker(ctx, request, &reply);
          })));
      PrintWorker(reply);
      return 0;
    });
  });
  auto* remove = admin->add_subcommand(
      "remove",
      "Forget an offline worker (or a drained, idle one): its slots leave "
      "its profile, and queued jobs that can then never run fail");
  remove->add_option("worker", args->name, "The worker's name (or id)")
      ->required();
  remove->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& c) -> absl::StatusOr<int> {
      v1::RemoveWorkerRequest request;
      request.set_name(args->name);
      v1::RemoveWorkerReply reply;
      RETURN_IF_ERROR(c.Error(
          c.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
            return stub->RemoveWorker(ctx, request, &reply);
          })));
      std::cout << "removed worker '" << TerminalText(reply.worker().name())
                << "' (" << reply.worker().devices_size()
                << " slots of profile '"
                << TerminalText(reply.worker().profile()) << "')\n";
      if (!reply.failed_jobs().empty()) {
        std::cout << "failed " << reply.failed_jobs_size()
                  << " queued job(s) that can no longer run: "
                  << absl::StrJoin(reply.failed_jobs(), ", ") << "\n";
      }
      return 0;
    });
  });
}

}  // namespace dlbatch::client
