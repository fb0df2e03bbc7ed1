// fetch-outputs, workers, profiles.
#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/format.h"
#include "common/blob_transfer.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/job_state.h"

namespace dlbatch::client {
namespace fs = std::filesystem;
namespace {

// Output paths come from the job; never let one escape the target folder.
bool SafeRelative(const std::string& path) {
  fs::path p(path);
  if (p.is_absolute() || path.empty()) return false;
  for (const auto& piece : p) {
    if (piece == "..") return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<int> FetchOutputs(Connection& conn, int64_t job_id,
                                 const std::string& dir, bool list_only) {
  v1::ListOutputsRequest request;
  request.set_job_id(job_id);
  v1::ListOutputsReply reply;
  auto ctx = conn.Context();
  RETURN_IF_ERROR(
      conn.Error(conn.stub()->ListOutputs(ctx.get(), request, &reply)));
  v1::JobState state = reply.state();
  if (state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_RUNNING ||
      state == v1::JOB_STATE_CANCELLING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobStateName(state),
        "; its outputs are stored when it ends (dlbatch wait ", job_id, ")"));
  }
  if (list_only) {
    Table table({"SIZE", "SHA256", "PATH"});
    for (const auto& f : reply.files()) {
      table.Add({HumanBytes(f.size()), f.sha256().substr(0, 12), f.path()});
    }
    std::cout << table.Render();
    return 0;
  }
  if (reply.files_size() == 0) {
    std::cout << "job " << job_id << " (" << JobStateName(state)
              << ") stored no outputs\n";
    return 0;
  }
  std::string target =
      dir.empty() ? absl::StrCat("dlbatch-", job_id, "-outputs") : dir;
  RETURN_IF_ERROR(MakeDirs(target, 0755));
  int64_t total = 0;
  for (const auto& f : reply.files()) total += f.size();
  int64_t before = 0;
  {
    ProgressBar bar(
        absl::StrCat("job ", job_id, ": ", reply.files_size(), " file(s)"));
    for (const auto& f : reply.files()) {
      if (!SafeRelative(f.path())) {
        return absl::DataLossError(absl::StrCat("job ", job_id,
                                                " lists an output outside its "
                                                "folder: '",
                                                f.path(), "'"));
      }
      fs::path dest = fs::path(target) / f.path();
      RETURN_IF_ERROR(MakeDirs(dest.parent_path().string(), 0755));
      absl::Status s = DownloadFile(
          conn.stub(), conn.token(), f.sha256(), f.size(), dest.string(),
          f.mode(),
          [&](int64_t done, int64_t) { bar.Update(before + done, total); });
      if (!s.ok()) {
        if (s.code() == absl::StatusCode::kUnavailable)
          s = conn.Error(ToGrpcStatus(s));
        return Annotate(s, absl::StrCat("fetching ", f.path()));
      }
      before += f.size();
    }
  }
  std::cout << "fetched " << reply.files_size() << " file(s), "
            << HumanBytes(total) << ", checksums verified, into " << target
            << "/\n";
  for (const auto& f : reply.files()) std::cout << "  " << f.path() << "\n";
  return 0;
}

absl::StatusOr<int> Workers(Connection& conn, bool json) {
  v1::ListWorkersReply reply;
  auto ctx = conn.Context();
  RETURN_IF_ERROR(conn.Error(
      conn.stub()->ListWorkers(ctx.get(), v1::ListWorkersRequest(), &reply)));
  if (json) {
    std::cout << ToJson(reply);
    return 0;
  }
  Table table({"ID", "NAME", "HOST", "PROFILE", "STATE", "SLOTS", "FREE",
               "DEVICES", "JOBS"});
  for (const auto& w : reply.workers()) {
    std::string devices;
    if (!w.devices().empty() && w.devices(0).kind() == "gpu") {
      std::vector<std::string> gpus;
      for (const auto& d : w.devices()) {
        gpus.push_back(absl::StrCat(d.index(), ": ", d.name(), " ",
                                    HumanBytes(d.memory_bytes()), " cc ",
                                    d.compute_capability()));
      }
      devices = absl::StrJoin(gpus, "; ");
    } else {
      devices = absl::StrCat(w.devices_size(), " CPU slots");
    }
    table.Add(
        {absl::StrCat(w.id()), w.name(), w.host(), w.profile(),
         w.online() ? "online" : "offline", absl::StrCat(w.devices_size()),
         absl::StrCat(w.free_slots()), devices,
         w.running_jobs().empty() ? "-"
                                  : absl::StrJoin(w.running_jobs(), ",")});
  }
  std::cout << table.Render();
  return 0;
}

absl::StatusOr<int> Profiles(Connection& conn, bool json) {
  v1::ListProfilesReply reply;
  auto ctx = conn.Context();
  RETURN_IF_ERROR(conn.Error(
      conn.stub()->ListProfiles(ctx.get(), v1::ListProfilesRequest(), &reply)));
  if (json) {
    std::cout << ToJson(reply);
    return 0;
  }
  Table table({"PROFILE", "WORKERS", "ONLINE", "KIND", "SLOTS", "FREE",
               "MAX POOL", "QUEUED", "RUNNING"});
  for (const auto& p : reply.profiles()) {
    table.Add({p.name(), absl::StrCat(p.workers()),
               absl::StrCat(p.workers_online()), p.slot_kind(),
               absl::StrCat(p.total_slots()), absl::StrCat(p.free_slots()),
               absl::StrCat(p.max_pool()), absl::StrCat(p.queued_jobs()),
               absl::StrCat(p.running_jobs())});
  }
  std::cout << table.Render();
  return 0;
}

}  // namespace dlbatch::client
