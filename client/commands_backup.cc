#include "client/commands_backup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "client/terminal_text.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace {

// "jobs: 3 queued, 1 running" with the states that hold any, in order.
std::string Counts(const google::protobuf::Map<std::string, int64_t>& counts,
                   std::initializer_list<const char*> order) {
  std::string out;
  int64_t total = 0;
  for (const char* state : order) {
    auto it = counts.find(state);
    if (it == counts.end() || it->second == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", it->second, " ", state);
    total += it->second;
  }
  return total == 0 ? "none" : absl::StrCat(total, " (", out, ")");
}

Json CountsJson(const google::protobuf::Map<std::string, int64_t>& counts,
                std::initializer_list<const char*> order) {
  Json out = Json::object();
  for (const char* state : order) {
    auto it = counts.find(state);
    out[state] = it == counts.end() ? 0 : it->second;
  }
  return out;
}

constexpr std::initializer_list<const char*> kJobStates = {
    "queued", "running", "cancelling", "finished", "failed", "cancelled"};
constexpr std::initializer_list<const char*> kWorkerStates = {
    "online", "draining", "offline"};

}  // namespace

absl::StatusOr<int> Backup(Connection& conn, const std::string& file,
                           bool force) {
  struct stat st;
  if (!force && ::lstat(file.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        file, " exists; name another file, or pass --force to replace it"));
  }
  const std::string part = file + ".part";
  ::unlink(part.c_str());  // a stale one (or a link planted there) goes
  UniqueFd fd(::open(part.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0600));
  if (!fd.valid()) return ErrnoStatus(errno, "create", part);
  auto ctx = conn.Context(/*deadline_ms=*/0);
  auto reader = conn.stub()->BackupStore(ctx.get(), v1::BackupStoreRequest());
  v1::BackupChunk chunk;
  int64_t expected = -1, written = 0, jobs = 0, blobs = 0;
  absl::Status status;
  ProgressBar bar("backup");
  while (reader->Read(&chunk)) {
    if (expected < 0) {
      expected = chunk.archive_bytes();
      jobs = chunk.jobs();
      blobs = chunk.blobs();
    }
    status = WriteFull(fd.get(), chunk.data(), part);
    if (!status.ok()) break;
    written += static_cast<int64_t>(chunk.data().size());
    bar.Update(written, expected);
  }
  if (!status.ok()) ctx->TryCancel();
  absl::Status rpc = conn.Error(reader->Finish());
  if (status.ok()) status = rpc;
  if (status.ok() && written != expected) {
    status = absl::DataLossError(
        absl::StrCat("the backup was cut short: ", written, " of ", expected,
                     " bytes came; run it again"));
  }
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = ErrnoStatus(errno, "fsync", part);
  }
  fd.Reset();
  if (status.ok() && ::rename(part.c_str(), file.c_str()) != 0) {
    status = ErrnoStatus(errno, "rename", part);
  }
  if (!status.ok()) {
    ::unlink(part.c_str());
    return status;
  }
  bar.Done();
  std::cout << "backed up " << jobs << " job" << (jobs == 1 ? "" : "s")
            << " and " << blobs << " stored file" << (blobs == 1 ? "" : "s")
            << " to " << file << " (" << HumanBytes(written) << ")\n"
            << "restore: stop the scheduler, extract it into an empty state "
               "folder (mkdir -m 700 DIR && tar -xf "
            << file << " -C DIR), start dlbatch-scheduler --state-dir DIR\n";
  return 0;
}

absl::StatusOr<int> ShowStatus(Connection& conn, bool json) {
  v1::SchedulerStatus status;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->GetStatus(ctx, v1::GetStatusRequest(), &status);
      })));
  const int64_t uptime_ms = status.now_ms() - status.start_ms();
  if (json) {
    PrintJson(Json{
        {"version", status.version()},
        {"start_time", JsonTime(status.start_ms())},
        {"uptime_ms", uptime_ms},
        {"state_dir", status.state_dir()},
        {"store_bytes", status.store_bytes()},
        {"blob_bytes", status.blob_bytes()},
        {"free_bytes", status.free_bytes()},
        {"store_full", status.store_full()},
        {"jobs", CountsJson(status.jobs_by_state(), kJobStates)},
        {"workers", CountsJson(status.workers_by_state(), kWorkerStates)}});
    return 0;
  }
  std::cout << "scheduler  " << TerminalText(conn.address()) << "\n"
            << "version    " << TerminalText(status.version()) << "\n"
            << "up         " << FormatDurationMs(uptime_ms) << " (since "
            << LocalTime(status.start_ms()) << ")\n"
            << "state      " << TerminalText(status.state_dir()) << "\n"
            << "store      " << HumanBytes(status.store_bytes())
            << " database, " << HumanBytes(status.blob_bytes())
            << " stored files, " << HumanBytes(status.free_bytes()) << " free"
            << (status.store_full()
                    ? "; FULL: new work is refused until space is freed"
                    : "")
            << "\n"
            << "jobs       " << Counts(status.jobs_by_state(), kJobStates)
            << "\n"
            << "workers    " << Counts(status.workers_by_state(), kWorkerStates)
            << "\n";
  return 0;
}

void AddBackupCommands(CLI::App* admin, const GlobalFlags* flags, int* rc) {
  struct Args {
    std::string file;
    bool force = false;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* backup = admin->add_subcommand(
      "backup",
      "Copy the scheduler's state while it runs into FILE: its store, the "
      "stored files its jobs hold and its keys, as a tar archive (restore: "
      "extract it into an empty state folder)");
  backup->add_option("file", args->file, "The archive to write")->required();
  backup->add_flag("--force", args->force, "Replace FILE if it exists");
  backup->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& c) {
      return Backup(c, args->file, args->force);
    });
  });
  auto* status = admin->add_subcommand(
      "status",
      "The scheduler at a glance: version, uptime, store size, jobs and "
      "workers by state");
  status->add_flag("--json", args->json, "Print JSON");
  status->callback([flags, rc, args] {
    *rc = WithConnection(
        *flags, [&](Connection& c) { return ShowStatus(c, args->json); });
  });
}

}  // namespace dlbatch::client
