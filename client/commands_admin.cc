#include "client/commands_admin.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands_credentials.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"

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
  return absl::InvalidArgumentError(absl::StrCat(
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
    return absl::InvalidArgumentError(
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
    std::cerr << "dlbatch: " << r.error() << "\n";
    ++failed;
  }
  std::cout << "purged " << reply.purged() << " job"
            << (reply.purged() == 1 ? "" : "s") << "; deleted "
            << reply.blobs_deleted() << " stored file"
            << (reply.blobs_deleted() == 1 ? "" : "s") << " ("
            << HumanBytes(reply.bytes_freed()) << ")\n";
  return failed > 0 ? 1 : 0;
}

void AddAdminCommands(CLI::App& app, const GlobalFlags* flags, int* rc) {
  auto* admin = app.add_subcommand(
      "admin",
      "Operate the scheduler: delete old jobs (purge), users' tokens (user), "
      "workers' credentials (worker-token)");
  admin->require_subcommand(1);
  AddCredentialCommands(admin, flags, rc);

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
    if (!result.ok()) {
      std::cerr << "dlbatch: " << result.status().message() << "\n";
      *rc = 1;
      return;
    }
    *rc = *result;
  });
}

}  // namespace dlbatch::client
