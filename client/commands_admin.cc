#include "client/commands_admin.h"

#include <functional>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands_backup.h"
#include "client/commands_control.h"
#include "client/commands_credentials.h"
#include "client/format.h"
#include "client/terminal_text.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {

absl::StatusOr<absl::Time> ParsePurgeBefore(const std::string& text,
                                            absl::Time now) {
  if (auto seconds = ParseDurationSeconds(text); seconds.ok()) {
    return now - absl::Seconds(*seconds);
  }
  for (const char* format :
       {"%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%Ez", "%Y-%m-%dT%H:%M%Ez"}) {
    absl::Time t;
    std::string err;
    std::string input = text;
    // RFC 3339's Z for UTC.
    if (!input.empty() && (input.back() == 'Z' || input.back() == 'z')) {
      input.back() = '+';
      input += "00:00";
    }
    if (absl::ParseTime(format, input, absl::LocalTimeZone(), &t, &err)) {
      return t;
    }
  }
  return UsageError(absl::StrCat(
      "--before ", text,
      ": write a date (2026-01-31, 2026-01-31T12:00, local time unless a zone "
      "such as Z or +02:00 follows) or an age (30d, 12h)"));
}

absl::StatusOr<int> Purge(Connection& conn, const std::vector<int64_t>& ids,
                          const std::string& before) {
  v1::PurgeJobsRequest request;
  request.mutable_job_ids()->Add(ids.begin(), ids.end());
  if (!before.empty()) {
    ASSIGN_OR_RETURN(absl::Time t, ParsePurgeBefore(before, absl::Now()));
    request.set_before_ms(absl::ToUnixMillis(t));
  }
  if (ids.empty() && before.empty()) {
    return UsageError(
        "name the jobs to purge (dlbatch admin purge 12 13) or a date "
        "(--before 2026-01-31, or --before 30d)");
  }
  v1::PurgeJobsReply reply;
  auto ctx = conn.Context(/*deadline_ms=*/600000);
  RETURN_IF_ERROR(
      conn.Error(conn.stub()->PurgeJobs(ctx.get(), request, &reply)));
  int failed = 0;
  for (const auto& r : reply.results()) {
    if (r.error().empty()) continue;
    std::cerr << "dlbatch: " << TerminalText(r.error()) << "\n";
    ++failed;
  }
  std::cout << "purged " << reply.purged() << " job"
            << (reply.purged() == 1 ? "" : "s") << "; deleted "
            << reply.blobs_deleted() << " stored file"
            << (reply.blobs_deleted() == 1 ? "" : "s") << " ("
            << HumanBytes(reply.bytes_freed()) << ")\n";
  return failed > 0 ? 1 : 0;
}

namespace {

std::string LimitCell(int32_t n) { return n > 0 ? absl::StrCat(n) : "-"; }

void AddLimitCommands(CLI::App* admin, const GlobalFlags* flags, int* rc) {
  auto args = std::make_shared<LimitArgs>();
  auto* limit = admin->add_subcommand(
      "limit", "Per-user limits: running slots and queued jobs per profile");
  limit->require_subcommand(1);
  auto* set = limit->add_subcommand(
      "set",
      "Set USER's limits on a profile (the ones not given stay; 0 removes "
      "one)");
  set->add_option("user", args->user, "The user")->required();
  set->add_option("--profile", args->profile, "The profile")->required();
  set->add_option("--slots", args->slots,
                  "Most slots of running jobs at once (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  set->add_option("--queued", args->queued,
                  "Most queued jobs; a submit past it is refused (0: no "
                  "limit)")
      ->check(CLI::NonNegativeNumber);
  set->add_flag("--clear", args->clear, "Remove both limits");
  set->add_flag("--json", args->json, "Print the limit as JSON");
  set->callback([flags, rc, args] {
    *rc = WithConnection(*flags,
                         [&](Connection& c) { return SetLimit(c, *args); });
  });
  auto* list = limit->add_subcommand("list", "Every user's limits");
  list->add_flag("--json", args->json, "Print JSON");
  list->callback([flags, rc, args] {
    *rc = WithConnection(
        *flags, [&](Connection& c) { return ListLimits(c, args->json); });
  });
  auto* usage = admin->add_subcommand(
      "usage",
      "Each user's fair-share usage: slot-time decayed by the half-life, and "
      "share of all");
  usage->add_flag("--json", args->json, "Print JSON");
  usage->callback([flags, rc, args] {
    *rc = WithConnection(
        *flags, [&](Connection& c) { return ShowUsage(c, args->json); });
  });
}

}  // namespace

absl::StatusOr<int> SetLimit(Connection& conn, const LimitArgs& args) {
  if (!args.clear && args.slots < 0 && args.queued < 0) {
    return UsageError(
        "say which limit to set: --slots N, --queued M (0 removes one), or "
        "--clear");
  }
  v1::SetUserLimitRequest request;
  request.set_user(args.user);
  request.set_profile(args.profile);
  if (args.slots >= 0) request.set_max_slots(args.slots);
  if (args.queued >= 0) request.set_max_queued(args.queued);
  request.set_clear(args.clear);
  v1::UserLimitEntry reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->SetUserLimit(ctx, request, &reply);
      })));
  if (args.json) {
    PrintJson(UserLimitJson(reply));
    return 0;
  }
  if (reply.max_slots() == 0 && reply.max_queued() == 0) {
    std::cout << TerminalText(reply.user()) << " has no limits on '"
              << TerminalText(reply.profile()) << "'\n";
  } else {
    std::cout << TerminalText(reply.user()) << " on '"
              << TerminalText(reply.profile()) << "': slots "
              << LimitCell(reply.max_slots()) << ", queued "
              << LimitCell(reply.max_queued()) << "\n";
  }
  return 0;
}

absl::StatusOr<int> ListLimits(Connection& conn, bool json) {
  v1::ListUserLimitsReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListUserLimits(ctx, v1::ListUserLimitsRequest(), &reply);
      })));
  if (json) {
    Json limits = Json::array();
    for (const auto& l : reply.limits()) limits.push_back(UserLimitJson(l));
    PrintJson(Json{{"limits", std::move(limits)}});
    return 0;
  }
  Table table({"USER", "PROFILE", "SLOTS", "QUEUED"});
  for (const auto& l : reply.limits()) {
    table.Add({l.user(), l.profile(), LimitCell(l.max_slots()),
               LimitCell(l.max_queued())});
  }
  if (table.rows() == 0) {
    std::cout << "no limits are set\n";
    return 0;
  }
  std::cout << table.Render();
  return 0;
}

absl::StatusOr<int> ShowUsage(Connection& conn, bool json) {
  v1::GetUsageReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->GetUsage(ctx, v1::GetUsageRequest(), &reply);
      })));
  if (json) {
    PrintJson(UsageJson(reply));
    return 0;
  }
  Table table({"USER", "USAGE", "SHARE", "RUNNING"});
  for (const auto& u : reply.users()) {
    table.Add({u.user(),
               FormatDurationMs(static_cast<int64_t>(u.slot_seconds() * 1000)) +
                   " slot-time",
               absl::StrFormat("%.1f%%", u.share() * 100),
               absl::StrCat(u.running_slots())});
  }
  std::cout << "usage decays with a half-life of "
            << (reply.half_life_ms() > 0
                    ? FormatDurationMs(reply.half_life_ms())
                    : std::string("none (no decay)"))
            << "\n";
  if (table.rows() > 0) std::cout << table.Render();
  return 0;
}

void AddAdminCommands(CLI::App& app, const GlobalFlags* flags, int* rc) {
  auto* admin = app.add_subcommand(
      "admin",
      "Operate the scheduler: delete old jobs (purge), users' tokens (user), "
      "workers' credentials (worker-token), per-user limits (limit), "
      "fair-share usage (usage), workers (drain, resume, remove), a copy of "
      "the state (backup), the scheduler at a glance (status)");
  admin->require_subcommand(1);
  AddBackupCommands(admin, flags, rc);
  AddCredentialCommands(admin, flags, rc);
  AddLimitCommands(admin, flags, rc);
  AddWorkerAdminCommands(admin, flags, rc);  // drain, resume, remove

  struct PurgeArgs {
    std::vector<int64_t> ids;
    std::string before;
  };
  auto args = std::make_shared<PurgeArgs>();
  auto* purge = admin->add_subcommand(
      "purge",
      "Delete ended jobs now, with their diary, history and the outputs no "
      "other job holds (the scheduler's --keep-ended does it by age)");
  purge->add_option("job_ids", args->ids,
                    "Jobs to delete (each must have ended)");
  purge->add_option("--before", args->before,
                    "Every job ended before this date (2026-01-31, "
                    "2026-01-31T12:00, local time unless a zone such as Z "
                    "follows) or longer ago than this age (30d, 12h); with "
                    "job ids, only those of them");
  purge->callback([flags, rc, args] {
    auto conn = Connection::Open(*flags);
    absl::StatusOr<int> result = conn.ok()
                                     ? Purge(**conn, args->ids, args->before)
                                     : absl::StatusOr<int>(conn.status());
    *rc = Report(result);
  });
}

}  // namespace dlbatch::client
