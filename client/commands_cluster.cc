// fetch-outputs, workers, profiles.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/commands_control.h"
#include "client/diary_text.h"
#include "client/format.h"
#include "client/outputs_dir.h"
#include "client/terminal_text.h"
#include "common/blob_transfer.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace fs = std::filesystem;
absl::StatusOr<int> FetchOutputs(Connection& conn, int64_t job_id,
                                 const std::string& dir, bool list_only,
                                 bool json) {
  v1::ListOutputsRequest request;
  request.set_job_id(job_id);
  v1::ListOutputsReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListOutputs(ctx, request, &reply);
      })));
  v1::JobState state = reply.state();
  if (json) {
    Json files = Json::array();
    for (const auto& f : reply.files()) files.push_back(OutputFileJson(f));
    PrintJson(Json{{"job_id", job_id},
                   {"state", JsonState(state)},
                   {"files", std::move(files)}});
    return 0;
  }
  if (state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_RUNNING ||
      state == v1::JOB_STATE_CANCELLING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobStateName(state),
        "; its outputs are stored when it ends (dlbatch wait ", job_id, ")"));
  }
  if (list_only) {
    Table table({"SIZE", "SHA256", "PATH"});
    for (const auto& f : reply.files()) {
      table.Add({f.symlink().empty() ? HumanBytes(f.size()) : "link",
                 f.sha256().substr(0, 12),
                 f.symlink().empty()
                     ? f.path()
                     : absl::StrCat(f.path(), " -> ", f.symlink())});
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
  ASSIGN_OR_RETURN(OutputsDir out, OutputsDir::Open(target));
  // One bad entry is reported and skipped; the others are still fetched.
  std::vector<std::string> skipped;
  auto skip = [&](const std::string& path, const absl::Status& why) {
    skipped.push_back(absl::StrCat(path, ": ", why.message()));
  };
  std::vector<const v1::OutputFile*> files, links;
  for (const auto& f : reply.files()) {
    if (absl::Status s = CheckOutputPath(f.path()); !s.ok()) {
      skip(f.path(), s);
    } else if (!f.symlink().empty()) {
      links.push_back(&f);
    } else {
      files.push_back(&f);
    }
  }
  FetchTally tally;
  tally.files = static_cast<int>(files.size());
  std::vector<std::string> lines;  // one per output, after the summary
  bool failed = false;  // a download failed (an unsafe entry is no failure)
  // What is here already decides what comes: a complete file is kept, a
  // part left by an interrupted fetch is gone on from; the bar counts the
  // bytes that will come.
  struct Todo {
    const v1::OutputFile* file;
    FoundOutput found;
    FetchStep step;
  };
  std::vector<Todo> todo;
  int64_t to_receive = 0;
  for (const v1::OutputFile* f : files) {
    const std::string shown = TerminalText(f->path());
    auto parent = out.ParentOf(f->path());
    absl::StatusOr<FoundOutput> found =
        parent.ok() ? InspectOutput(parent->first.get(), parent->second,
                                    f->size(), f->sha256())
                    : parent.status();
    if (!found.ok()) {
      skip(f->path(), found.status());  // a path through a symlink: refused
      failed = failed || parent.ok();
      continue;
    }
    FetchStep step = PlanFetch(*found, f->size());
    if (step.action == FetchStep::Action::kSkip) {
      if (step.remove_part) {
        ::unlinkat(parent->first.get(), (parent->second + ".part").c_str(), 0);
      }
      ++tally.skipped;
      lines.push_back(
          absl::StrCat(shown, ": skipped, already here with the same sha256"));
      continue;
    }
    to_receive += f->size() - step.offset;
    todo.push_back({f, *std::move(found), step});
  }
  {
    ProgressBar bar(
        absl::StrCat("job ", job_id, ": ", todo.size(), " file(s)"));
    int64_t received = 0;  // by the files before this one
    for (Todo& t : todo) {
      const v1::OutputFile* f = t.file;
      const std::string shown = TerminalText(f->path());
      auto parent = out.ParentOf(f->path());
      absl::Status s = parent.status();
      to_receive -= f->size() - t.step.offset;  // now: after this file
      DownloadReport report;
      int64_t got = 0;        // bytes received by the attempts before
      int64_t kept = -1;      // bytes of a part from before this fetch kept
      int64_t discarded = 0;  // bytes of parts that failed the sha256
      FetchStep step = t.step;
      // A download that loses the scheduler (a restart) goes on from its
      // part, while the scheduler is unreachable for less than --retry-for.
      while (parent.ok()) {
        const int64_t started = Connection::MonotonicMs();
        s = ResumeDownloadAt(conn.stub(), conn.token(), f->sha256(), f->size(),
                             parent->first.get(), parent->second, f->mode(),
                             step.offset, f->path(), &report,
                             [&](int64_t done, int64_t expect) {
                               bar.Update(received + got + done,
                                          received + got + expect + to_receive);
                             });
        got += report.received;
        discarded += report.discarded;
        if (kept < 0) kept = report.kept;
        if (s.code() != absl::StatusCode::kUnavailable ||
            !conn.RetryAfter(ToGrpcStatus(s), started)) {
          break;
        }
        InspectPart(parent->first.get(), parent->second, &t.found);
        step = PlanFetch(t.found, f->size());
      }
      received += got;
      if (s.code() == absl::StatusCode::kUnavailable) {
        return Annotate(conn.Error(ToGrpcStatus(s)),
                        absl::StrCat("fetching ", f->path(),
                                     " (its .part is kept: fetching again "
                                     "goes on from it)"));
      }
      if (!s.ok()) {
        skip(f->path(), s);
        failed = true;
        continue;
      }
      if (kept > 0 && discarded == 0) {
        ++tally.resumed;
        tally.resumed_at += kept;
        tally.resumed_bytes += got;
        lines.push_back(absl::StrCat(shown, ": resumed at ", HumanBytes(kept),
                                     ", ", HumanBytes(got), " received"));
        continue;
      }
      ++tally.fetched;
      tally.fetched_bytes += got;
      std::string line = absl::StrCat(shown, ": fetched, ", HumanBytes(got));
      if (discarded > 0) {
        absl::StrAppend(&line, "; the ", HumanBytes(discarded),
                        " kept from an earlier fetch (", shown,
                        ".part) did not match the sha256, so all of it was "
                        "fetched again");
      } else if (t.step.replaces) {
        absl::StrAppend(&line, "; it replaces a copy here with other bytes");
      }
      lines.push_back(std::move(line));
    }
  }
  // Links last: a file is never written through one.
  for (const v1::OutputFile* f : links) {
    absl::Status s = CheckSymlinkTarget(f->path(), f->symlink());
    if (s.ok()) s = out.MakeSymlink(f->path(), f->symlink());
    if (!s.ok()) {
      skip(absl::StrCat(f->path(), " -> ", f->symlink()), s);
      continue;
    }
    ++tally.links;
    lines.push_back(absl::StrCat(TerminalText(f->path()), " -> ",
                                 TerminalText(f->symlink())));
  }
  tally.not_fetched = static_cast<int>(skipped.size());
  std::cout << FetchSummary(tally) << ", into " << TerminalText(target)
            << "/\n";
  for (const auto& line : lines) std::cout << "  " << line << "\n";
  for (const auto& line : skipped)
    std::cerr << "skipped " << TerminalText(line) << "\n";
  return failed ? 1 : 0;
}

absl::StatusOr<int> Workers(Connection& conn, bool json) {
  v1::ListWorkersReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListWorkers(ctx, v1::ListWorkersRequest(), &reply);
      })));
  if (json) {
    Json workers = Json::array();
    for (const auto& w : reply.workers()) workers.push_back(WorkerJson(w));
    PrintJson(Json{{"workers", std::move(workers)}});
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
         WorkerStateText(w) +
             (w.drain_reason().empty() ? "" : " (" + w.drain_reason() + ")"),
         absl::StrCat(w.devices_size()), absl::StrCat(w.free_slots()), devices,
         w.running_jobs().empty() ? "-"
                                  : absl::StrJoin(w.running_jobs(), ",")});
  }
  std::cout << table.Render();
  return 0;
}

absl::StatusOr<int> Profiles(Connection& conn, bool json) {
  v1::ListProfilesReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListProfiles(ctx, v1::ListProfilesRequest(), &reply);
      })));
  if (json) {
    Json profiles = Json::array();
    for (const auto& p : reply.profiles()) profiles.push_back(ProfileJson(p));
    PrintJson(Json{{"profiles", std::move(profiles)}});
    return 0;
  }
  Table table({"PROFILE", "TYPE", "WORKERS", "ONLINE", "KIND", "SLOTS", "FREE",
               "MAX POOL", "QUEUED", "RUNNING"});
  for (const auto& p : reply.profiles()) {
    table.Add({p.name(), p.type().empty() ? "workers" : p.type(),
               absl::StrCat(p.workers()), absl::StrCat(p.workers_online()),
               p.slot_kind(), absl::StrCat(p.total_slots()),
               absl::StrCat(p.free_slots()), absl::StrCat(p.max_pool()),
               absl::StrCat(p.queued_jobs()), absl::StrCat(p.running_jobs())});
  }
  std::cout << table.Render();
  // Slurm's own view of each Slurm profile's partition.
  for (const auto& p : reply.profiles()) {
    if (!p.has_slurm()) continue;
    const v1::SlurmPartition& s = p.slurm();
    if (!s.error().empty()) {
      std::cout << TerminalText(p.name()) << ": Slurm partition "
                << TerminalText(s.partition()) << ": cannot read it ("
                << TerminalText(s.error()) << ")\n";
      continue;
    }
    std::cout << TerminalText(p.name()) << ": Slurm partition "
              << TerminalText(s.partition()) << ": " << s.nodes() << " node"
              << (s.nodes() == 1 ? "" : "s") << " (" << s.idle() << " idle, "
              << s.busy() << " allocated, " << s.unavailable()
              << " unavailable), " << s.gpus() << " GPU"
              << (s.gpus() == 1 ? "" : "s") << " (" << s.gpus_used()
              << " allocated)\n";
  }
  return 0;
}

}  // namespace dlbatch::client
