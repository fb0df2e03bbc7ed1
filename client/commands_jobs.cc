// submit, jobs, show, diary, cancel, wait.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/attachments.h"
#include "client/commands.h"
#include "client/commands_control.h"
#include "client/commands_daily.h"
#include "client/diary_text.h"
#include "client/format.h"
#include "client/terminal_text.h"
#include "common/blob_transfer.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/array_spec.h"
#include "proto/data_paths.h"
#include "proto/job_state.h"
#include "proto/jobspec_yaml.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace fs = std::filesystem;
namespace {

std::string RandomRequestId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  return absl::StrFormat("%016x%016x", gen(), gen());
}

// A request id given with --request-id: what a script can keep and repeat.
absl::Status CheckRequestId(const std::string& id) {
  if (id.empty()) return absl::OkStatus();
  bool printable = std::all_of(id.begin(), id.end(),
                               [](char ch) { return ch > ' ' && ch < 127; });
  if (id.size() <= 128 && printable) return absl::OkStatus();
  return UsageError(absl::StrCat(
      "--request-id '", ShortenToWidth(id, 43),
      "': use 1 to 128 printable characters without spaces (a UUID, or your "
      "script's own name for this submit)"));
}

std::string CurrentUser() {
  if (const struct passwd* pw = ::getpwuid(::geteuid())) return pw->pw_name;
  return absl::StrCat("uid", ::geteuid());
}

// One line a person can read and paste into a shell: arguments quoted
// where needed, newlines shown as \n.
std::string CommandLine(
    const google::protobuf::RepeatedPtrField<std::string>& argv) {
  std::vector<std::string> parts;
  for (const std::string& arg : argv) {
    bool plain =
        !arg.empty() &&
        arg.find_first_of(" \t\n'\"$`\\;&|<>()*?!#~{}[]") == std::string::npos;
    std::string shown;
    for (char ch : arg) {
      if (ch == '\n') {
        shown += "\\n";
      } else if (ch == '\'') {
        shown += "'\\''";
      } else {
        shown += ch;
      }
    }
    parts.push_back(plain ? shown : "'" + shown + "'");
  }
  return absl::StrJoin(parts, " ");
}

// The flags of `submit` over the job file's fields (or an empty spec).
absl::Status ApplySubmitFlags(const SubmitOptions& options, v1::JobSpec* spec) {
  if (!options.command.empty()) {
    if (spec->has_train()) {
      return UsageError(absl::StrCat(
          options.job_file,
          " is a train: job; a command after -- makes a command job, so "
          "give one or the other"));
    }
    spec->mutable_command()->mutable_argv()->Assign(options.command.begin(),
                                                    options.command.end());
  }
  if (options.pool) spec->set_pool(*options.pool);
  if (options.profile) spec->set_profile(*options.profile);
  if (options.priority) spec->set_priority(*options.priority);
  if (options.name) spec->set_name(*options.name);
  if (options.max_nodes) {
    if (*options.max_nodes < 1) {
      return UsageError(absl::StrCat(
          "--max-nodes ", *options.max_nodes,
          ": give 1 for one worker, or more to let the pool span workers"));
    }
    spec->set_max_nodes(*options.max_nodes);
  }
  // Checked with the rest of the spec (ValidateJobSpec names the choices).
  if (options.launch) spec->set_launch(*options.launch);
  if (options.time_limit) {
    auto seconds = ParseDurationSeconds(*options.time_limit);
    if (!seconds.ok()) {
      // The parser's message gives the examples.
      return UsageError(absl::StrCat("--time-limit ", *options.time_limit, ": ",
                                     seconds.status().message()));
    }
    spec->set_time_limit_s(*seconds);
  }
  if (options.array) {
    absl::StatusOr<ArraySpec> array = ParseArraySpec(*options.array);
    if (!array.ok()) {  // "array: ..." -> "--array: ..."
      return UsageError(absl::StrCat("--", array.status().message()));
    }
    spec->set_array(*options.array);
  }
  for (const std::string& pair : options.env) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) {
      return UsageError(absl::StrCat(
          "--env ", pair, ": write NAME=VALUE (e.g. --env OMP_NUM_THREADS=4)"));
    }
    (*spec->mutable_env())[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  return absl::OkStatus();
}

// A train job's absolute data paths, looked for on this machine: a
// missing one fails the job where it starts, perhaps after hours in the
// queue. Only a path that is certainly not here is refused (one this user
// cannot stat may still be readable on the workers).
absl::Status CheckDataOnThisMachine(const v1::TrainSpec& train) {
  for (const DataPath& p : DataPaths(train)) {
    if (p.path.front() != '/') continue;
    struct stat st;
    if (::stat(p.path.c_str(), &st) != 0) {
      if (errno != ENOENT && errno != ENOTDIR) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          p.field, ": '", p.path,
          "' does not exist on this machine; correct the path, or, if it "
          "is on a filesystem only the workers mount, submit with "
          "--data-on-workers (the trainer then looks for it when the job "
          "starts)"));
    }
    if (p.folder && !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          p.field, ": '", p.path,
          "' is not a folder; a folders source names a folder with one "
          "subfolder of images per class"));
    }
    if (!p.folder && S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          p.field, ": '", p.path, "' is a folder; name the file in it"));
    }
  }
  return absl::OkStatus();
}

// A train job's data, checked before anything is uploaded: each relative
// path must be among the files the job attaches (its working folder holds
// only those), each absolute one on this machine unless --data-on-workers.
// Errors point at the path's line in the job file.
absl::Status CheckDataFiles(const ParsedJobFile& parsed,
                            const std::vector<LocalFile>& files,
                            const SubmitOptions& options) {
  if (!parsed.spec.has_train()) return absl::OkStatus();
  std::vector<std::string> attached;
  for (const LocalFile& f : files) attached.push_back(f.path);
  std::vector<std::string> written = parsed.attach;
  written.insert(written.end(), options.attach.begin(), options.attach.end());
  absl::Status s = CheckDataAttached(parsed.spec.train(), attached, written);
  if (s.ok() && !options.data_on_workers) {
    s = CheckDataOnThisMachine(parsed.spec.train());
  }
  return LocateInJobFile(parsed, s);
}

}  // namespace

int ExitCodeFor(v1::JobState state) {
  return state == v1::JOB_STATE_FINISHED ? 0 : 1;
}

absl::StatusOr<int> Submit(const GlobalFlags& flags,
                           const SubmitOptions& options) {
  // Everything that can be checked here is, before the scheduler is touched.
  RETURN_IF_ERROR(CheckRequestId(options.request_id));
  ParsedJobFile parsed;
  if (!options.job_file.empty()) {
    ASSIGN_OR_RETURN(parsed, ReadJobFile(options.job_file));
  }
  v1::JobSpec& spec = parsed.spec;
  RETURN_IF_ERROR(ApplySubmitFlags(options, &spec));
  if (spec.profile().empty()) spec.set_profile(flags.default_profile);
  if (spec.name().empty() && !options.job_file.empty())
    spec.set_name(fs::path(options.job_file).stem().string());
  if (spec.name().empty() && spec.command().argv_size() > 0)
    spec.set_name(fs::path(spec.command().argv(0)).filename().string());
  if (spec.pool() < 0 || (options.pool && *options.pool <= 0)) {
    return UsageError(
        absl::StrCat("pool ", spec.pool(),
                     " is not a number of slots; use --pool 1 or more"));
  }
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  // The file's attach: is relative to its folder; --attach to where submit
  // runs.
  const std::string here = "./submit";
  ASSIGN_OR_RETURN(
      auto files,
      ResolveAttachments(parsed.attach,
                         options.job_file.empty() ? here : options.job_file));
  ASSIGN_OR_RETURN(auto more, ResolveAttachments(options.attach, here));
  files.insert(files.end(), more.begin(), more.end());
  RETURN_IF_ERROR(CheckDataFiles(parsed, files, options));

  ASSIGN_OR_RETURN(auto conn, Connection::Open(flags));
  int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    total += static_cast<int64_t>(fs::file_size(f.source, ec));
  }
  {
    ProgressBar bar(absl::StrCat("uploading ", files.size(), " file(s)"));
    int64_t before = 0;
    for (const auto& f : files) {
      // Blobs are named by their content: a retried upload stores nothing
      // twice, so it retries while the scheduler is unreachable as the
      // submit itself does.
      absl::StatusOr<LocalBlob> blob;
      for (;;) {
        const int64_t started = Connection::MonotonicMs();
        blob = UploadFile(
            conn->stub(), conn->token(), f.source,
            [&](int64_t done, int64_t) { bar.Update(before + done, total); });
        if (blob.ok() ||
            !conn->RetryAfter(ToGrpcStatus(blob.status()), started))
          break;
      }
      if (!blob.ok()) {
        absl::Status s = blob.status();
        if (s.code() == absl::StatusCode::kUnavailable ||
            s.code() == absl::StatusCode::kUnauthenticated) {
          s = conn->Error(ToGrpcStatus(s));
        }
        return Annotate(s, absl::StrCat("attach: uploading ", f.source));
      }
      before += blob->size;
      auto* a = spec.add_attach();
      a->set_path(f.path);
      a->set_sha256(blob->sha256);
      a->set_size(blob->size);
      std::error_code ec;
      a->set_mode(
          static_cast<uint32_t>(fs::status(f.source, ec).permissions()) & 0777);
    }
  }
  v1::SubmitJobRequest request;
  const bool given_id = !options.request_id.empty();
  request.set_request_id(given_id ? options.request_id : RandomRequestId());
  *request.mutable_spec() = spec;
  request.set_user(CurrentUser());
  request.mutable_after()->Add(options.after.begin(), options.after.end());
  v1::SubmitJobReply reply;
  // The request id makes retrying safe: a scheduler that committed an
  // earlier try (and died before answering) answers with that try's job.
  RETURN_IF_ERROR(conn->Error(
      conn->UnaryCall("SubmitJob", request, &reply,
                      [&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
                        return stub->SubmitJob(ctx, request, &reply);
                      })));
  // With our own random id a duplicate is our own earlier try; with a given
  // one it may be an earlier submit, and the user asked to know.
  const bool duplicate = given_id && reply.duplicate();
  if (duplicate) {
    std::cerr << "dlbatch: request id '" << request.request_id()
              << "' was submitted before; no new job made\n";
  }
  if (reply.sweep_id() != 0 && !spec.array().empty()) {
    PrintSubmittedArray(reply, options.quiet);
    if (!options.follow) return 0;
    return FollowArray(*conn, reply);
  }
  if (reply.sweep_id() != 0) {
    PrintSubmittedSweep(reply, options.quiet);
    if (!options.follow) return 0;
    return FollowSweep(*conn, reply);
  }
  if (options.quiet) {
    std::cout << reply.job_id() << std::endl;
  } else if (duplicate) {
    std::cout << "Job " << reply.job_id() << " (already submitted)"
              << std::endl;
  } else {
    std::cout << "Submitted job " << reply.job_id() << std::endl;
  }
  if (!options.follow && options.output_dir.empty()) return 0;
  ASSIGN_OR_RETURN(int rc, Diary(*conn, reply.job_id(),
                                 {.follow = true, .quiet = !options.follow}));
  (void)rc;
  v1::GetJobRequest get;
  get.set_job_id(reply.job_id());
  v1::Job job;
  RETURN_IF_ERROR(conn->Error(
      conn->Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->GetJob(ctx, get, &job);
      })));
  std::cerr << "job " << job.id() << " " << JobStateName(job.state())
            << (job.reason().empty() ? "" : ": " + TerminalText(job.reason()))
            << "\n";
  if (!options.output_dir.empty()) {
    ASSIGN_OR_RETURN(int fetched,
                     FetchOutputs(*conn, job.id(), options.output_dir, false));
    if (fetched != 0 && job.state() == v1::JOB_STATE_FINISHED) return fetched;
  }
  return FollowExitCode(job);
}

absl::StatusOr<int> Jobs(Connection& conn, const JobsOptions& options) {
  v1::ListJobsRequest request;
  ASSIGN_OR_RETURN(JobStateFilter filter, ParseJobStateFilter(options.states));
  for (v1::JobState state : filter.states) request.add_states(state);
  std::vector<JobColumn> columns = DefaultJobColumns();
  if (!options.format.empty()) {
    ASSIGN_OR_RETURN(columns, ParseJobColumns(options.format));
  }
  if (options.limit < 0) {
    return UsageError(
        absl::StrCat("--limit ", options.limit,
                     ": give 1 or more (the newest "
                     "this many), or leave it out for every job"));
  }
  // Held jobs are told apart from the other queued ones here, after the
  // listing: the newest `limit` of them are cut from all the queued ones.
  request.set_limit(filter.queued_only_held ? 0 : options.limit);
  request.set_newest_first(options.limit > 0);
  request.set_sweep_id(options.sweep_id);
  if (options.array_id != 0) {
    if (options.sweep_id != 0) {
      return UsageError("jobs: give --array or --sweep, not both");
    }
    request.set_sweep_id(options.array_id);
  }
  request.set_user(options.user);
  request.set_mine(options.mine);
  request.set_name_glob(options.name_glob);
  v1::ListJobsReply reply;
  if (options.array_id != 0) {
    // The array's own checks and messages (a sweep's id, or none).
    ASSIGN_OR_RETURN(std::vector<v1::Job> jobs,
                     ListArrayJobs(conn, options.array_id, filter.states));
    for (v1::Job& job : jobs) *reply.add_jobs() = std::move(job);
    if (options.limit > 0) {  // the newest `limit`, newest first
      std::reverse(reply.mutable_jobs()->begin(), reply.mutable_jobs()->end());
      if (!filter.queued_only_held && reply.jobs_size() > options.limit) {
        reply.mutable_jobs()->DeleteSubrange(options.limit,
                                             reply.jobs_size() - options.limit);
      }
    }
  } else {
    RETURN_IF_ERROR(conn.Error(conn.UnaryCall(
        "ListJobs", request, &reply,
        [&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
          return stub->ListJobs(ctx, request, &reply);
        })));
  }
  if (filter.queued_only_held) {
    auto* jobs = reply.mutable_jobs();
    jobs->erase(
        std::remove_if(jobs->begin(), jobs->end(),
                       [&](const v1::Job& job) { return !filter.Keeps(job); }),
        jobs->end());
    if (options.limit > 0 && jobs->size() > options.limit) {
      jobs->DeleteSubrange(options.limit, jobs->size() - options.limit);
    }
  }
  if (options.json) {
    Json jobs = Json::array();
    for (const v1::Job& job : reply.jobs()) jobs.push_back(JobJson(job));
    PrintJson(Json{{"jobs", std::move(jobs)}});
    return 0;
  }
  std::cout << RenderJobsTable({reply.jobs().begin(), reply.jobs().end()},
                               columns, SystemClock::Get()->NowMs());
  return 0;
}

absl::StatusOr<int> Show(Connection& conn, int64_t job_id, bool json) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  RETURN_IF_ERROR(conn.Error(
      conn.UnaryCall("GetJob", request, &job,
                     [&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
                       return stub->GetJob(ctx, request, &job);
                     })));
  if (json) {
    PrintJson(JobJson(job));
    return 0;
  }
  const v1::JobSpec& spec = job.spec();
  std::string out;
  absl::StrAppend(&out, "Job ", job.id(), "  ", TerminalText(spec.name()),
                  "  (user ", TerminalText(job.user()), ")\n");
  absl::StrAppend(
      &out, "  State:      ", JobStateText(job),
      job.attempt() > 0 ? absl::StrCat(" (attempt ", job.attempt(), ")") : "",
      "\n");
  if (!job.wait_reason().empty())
    absl::StrAppend(&out, "  Waiting:    ", TerminalText(job.wait_reason()),
                    "\n");
  if (!job.reason().empty())
    absl::StrAppend(&out, "  Reason:     ", TerminalText(job.reason()), "\n");
  absl::StrAppend(
      &out, "  Profile:    ", TerminalText(spec.profile()),
      "    Pool: ", spec.pool(), "    Priority: ", spec.priority(),
      spec.time_limit_s() > 0
          ? absl::StrCat("    Time limit: ",
                         FormatDurationMs(spec.time_limit_s() * 1000))
          : "",
      "\n");
  if (job.array_id() != 0) {
    absl::StrAppend(
        &out, "  Array:      ", job.array_id(), " (index ", job.array_index(),
        job.array_limit() > 0
            ? absl::StrCat(", at most ", job.array_limit(), " at once")
            : "",
        "; dlbatch show --array ", job.array_id(), ")\n");
  } else if (job.sweep_id() != 0) {
    std::vector<std::string> point;
    for (const auto& [option, value] : spec.sweep_point()) {
      point.push_back(TerminalText(absl::StrCat(option, "=", value)));
    }
    std::sort(point.begin(), point.end());
    absl::StrAppend(&out, "  Sweep:      ", job.sweep_id(), " (",
                    absl::StrJoin(point, ", "), "; dlbatch show --sweep ",
                    job.sweep_id(), ")\n");
  }
  if (spec.has_command()) {
    absl::StrAppend(&out, "  Command:    ",
                    TerminalText(CommandLine(spec.command().argv())), "\n");
  } else if (spec.has_train()) {
    absl::StrAppend(&out,
                    "  Train:      ", spec.train().network().layers_size(),
                    " layers\n");
  }
  for (const auto& part : job.placement()) {
    absl::StrAppend(&out, "  Placement:  ",
                    part.worker_name().empty()
                        ? absl::StrCat("#", part.worker_id())
                        : TerminalText(part.worker_name()),
                    " devices [", absl::StrJoin(part.devices(), ","), "]\n");
  }
  absl::StrAppend(&out, "  Submitted:  ", LocalTime(job.submit_time_ms()),
                  "\n");
  if (job.start_time_ms() > 0) {
    absl::StrAppend(&out, "  Started:    ", LocalTime(job.start_time_ms()),
                    "\n");
  }
  if (job.end_time_ms() > 0) {
    absl::StrAppend(
        &out, "  Ended:      ", LocalTime(job.end_time_ms()), "  (ran ",
        FormatDurationMs(job.end_time_ms() - job.start_time_ms()), ")\n");
  }
  if (job.state() == v1::JOB_STATE_FINISHED ||
      job.state() == v1::JOB_STATE_FAILED) {
    absl::StrAppend(&out, "  Exit code:  ", job.exit_code(), "\n");
  }
  if (job.progress().iterations() > 0 || job.progress().time_ms() > 0)
    absl::StrAppend(&out, ProgressLines(job.progress()));
  if (job.checkpoint_size() > 0) {
    absl::StrAppend(&out, "  Checkpoint: iteration ",
                    job.progress().checkpoint_iteration(), " stored (",
                    job.checkpoint_size(), " files)\n");
  }
  for (const v1::Preemption& p : job.preemptions()) {
    absl::StrAppend(&out, "  Preempted:  ", PreemptionText(p, spec.has_train()),
                    "\n");
  }
  absl::StrAppend(&out, "  Diary:      ", job.diary_lines(),
                  " lines (dlbatch diary ", job.id(), ")\n");
  absl::StrAppend(&out, "  History:\n");
  for (const auto& h : job.history()) {
    absl::StrAppend(
        &out, "    ", LocalTime(h.time_ms()), "  ", JobStateName(h.state()),
        h.attempt() > 0 && h.state() == v1::JOB_STATE_RUNNING
            ? absl::StrCat(" (attempt ", h.attempt(), ")")
            : "",
        h.reason().empty() ? "" : absl::StrCat(": ", TerminalText(h.reason())),
        "\n");
  }
  std::cout << out;
  return 0;
}

namespace {

// Whether the job runs several processes as placed now (false where it
// cannot be read: its lines are then labelled once a rank above 0 shows).
bool AskRunsSeveralProcesses(Connection& conn, int64_t job_id) {
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::Job job;
  grpc::Status status =
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->GetJob(ctx, get, &job);
      });
  return status.ok() && RunsSeveralProcesses(job);
}

}  // namespace

absl::StatusOr<int> Diary(Connection& conn, int64_t job_id,
                          const DiaryOptions& options) {
  if (options.tail < 0) {
    return UsageError(absl::StrCat("--tail ", options.tail,
                                   ": give the number of last lines to show"));
  }
  RETURN_IF_ERROR(ParseDiaryRanks(options.ranks).status());
  // The text view labels each line with its rank once the job turns out to
  // run several processes (asked at its first line of one).
  DiaryLabels labels(
      [&conn, job_id] { return AskRunsSeveralProcesses(conn, job_id); });
  auto append = [&](const v1::DiaryLine& line, std::string* out) {
    const bool label = !options.json && !options.raw && labels.Label(line);
    AppendDiaryLine(options, line, out, label);
  };
  int64_t after = 0;
  if (options.tail > 0) {
    // The scheduler starts at the last lines (line numbers are the store's,
    // not the job's); the CLI still keeps only the last `tail` it gets, so
    // an older scheduler, which sends the whole diary, shows the same.
    std::deque<v1::DiaryLine> last;
    DiaryOptions read = options;
    read.follow = false;
    ASSIGN_OR_RETURN(
        int rc, ReadDiaryLines(
                    conn, job_id, read, &after, [&](const v1::DiaryLine& line) {
                      last.push_back(line);
                      if (last.size() > static_cast<size_t>(options.tail))
                        last.pop_front();
                    }));
    std::string out;
    for (const v1::DiaryLine& line : last) append(line, &out);
    std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
    std::cout.flush();
    if (!options.follow) return rc;
  }
  // Following goes on after the last line shown, whatever came since.
  DiaryOptions rest = options;
  rest.tail = 0;
  std::string out;
  return ReadDiaryLines(
      conn, job_id, rest, &after,
      [&](const v1::DiaryLine& line) { append(line, &out); }, &out);
}

absl::StatusOr<int> ReadDiaryLines(
    Connection& conn, int64_t job_id, const DiaryOptions& options,
    int64_t* after_n, const std::function<void(const v1::DiaryLine&)>& take,
    std::string* pending) {
  const bool follow = options.follow;
  ASSIGN_OR_RETURN(std::vector<int32_t> ranks, ParseDiaryRanks(options.ranks));
  v1::ReadDiaryRequest request;
  request.set_job_id(job_id);
  request.set_follow(follow);
  request.set_tail(options.tail);
  request.mutable_ranks()->Add(ranks.begin(), ranks.end());
  int64_t& after = *after_n;
  // A call that loses the scheduler (a restart) picks up where it was,
  // retrying while the scheduler is unreachable.
  for (;;) {
    const int64_t started = Connection::MonotonicMs();
    request.set_after(after);
    if (after > 0) request.set_tail(0);  // a retry goes on from `after`
    auto ctx = conn.Context(/*deadline_ms=*/0);
    auto reader = conn.stub()->ReadDiary(ctx.get(), request);
    v1::DiaryChunk chunk;
    bool ended = false;
    while (reader->Read(&chunk)) {
      conn.Reached();
      for (const auto& line : chunk.lines()) {
        after = line.n();
        // A scheduler that predates ranks sends every line.
        if (!ranks.empty() &&
            !(line.has_rank() &&
              std::binary_search(ranks.begin(), ranks.end(), line.rank()))) {
          continue;
        }
        take(line);
      }
      if (pending != nullptr && !options.quiet) {
        std::cout.write(pending->data(),
                        static_cast<std::streamsize>(pending->size()));
        std::cout.flush();
      }
      if (pending != nullptr) pending->clear();
      if (chunk.end()) ended = true;
    }
    grpc::Status status = reader->Finish();
    if (status.ok() && (ended || !follow)) return 0;
    // The server ended a follow early, or cancelled it (its token was
    // revoked: the next call says so): go on.
    if (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED) {
      usleep(200000);
      continue;
    }
    if (!conn.RetryAfter(status, started)) return conn.Error(status);
  }
}

void AppendDiaryLine(const DiaryOptions& options, const v1::DiaryLine& line,
                     std::string* out, bool label) {
  if (options.json) {
    absl::StrAppend(out, JsonText(DiaryLineJson(line), /*compact=*/true), "\n");
    return;
  }
  if (options.timestamps) absl::StrAppend(out, LocalTime(line.time_ms()), "  ");
  if (options.raw) {
    // The job's bytes as it wrote them: a last line without a newline
    // stays without one, and a long line's pieces join up again.
    absl::StrAppend(out, line.text(), DiaryLineEnding(line));
    return;
  }
  absl::StrAppend(out, label ? RankLabel(line) : "",
                  EscapeDiaryText(line.text()), "\n");
}

absl::StatusOr<int> Cancel(Connection& conn,
                           const std::vector<int64_t>& job_ids) {
  v1::CancelJobsRequest request;
  for (int64_t id : job_ids) request.add_job_ids(id);
  v1::CancelJobsReply reply;
  // Retried while the scheduler is unreachable. A try whose reply was lost
  // may have cancelled a queued job already: on a retry, a job found
  // cancelled is what was asked for, not an error.
  int tries = 0;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        ++tries;
        return stub->CancelJobs(ctx, request, &reply);
      })));
  int rc = 0;
  for (const auto& r : reply.results()) {
    if (!r.error().empty() &&
        !(tries > 1 && r.state() == v1::JOB_STATE_CANCELLED)) {
      std::cerr << "dlbatch: " << TerminalText(r.error()) << "\n";
      rc = 1;
    } else {
      std::cout << "job " << r.job_id() << " " << JobStateName(r.state())
                << "\n";
    }
  }
  return rc;
}

absl::StatusOr<int> Wait(Connection& conn, const std::vector<int64_t>& job_ids,
                         int64_t timeout_ms) {
  v1::WaitJobsRequest request;
  for (int64_t id : job_ids) request.add_job_ids(id);
  request.set_timeout_ms(timeout_ms);
  v1::WaitJobsReply reply;
  // A scheduler restart ends the call; the wait goes on against the same
  // overall timeout, retrying while the scheduler is unreachable.
  const int64_t deadline = Connection::MonotonicMs() + timeout_ms;
  for (;;) {
    const int64_t started = Connection::MonotonicMs();
    if (timeout_ms > 0) {
      request.set_timeout_ms(std::max<int64_t>(1, deadline - started));
    }
    auto ctx = conn.Context(/*deadline_ms=*/0);
    grpc::Status status = conn.stub()->WaitJobs(ctx.get(), request, &reply);
    if (status.ok()) break;
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      // Told apart from a job that failed: a script waiting on a job id
      // it got wrong (or one purged) learns that it waits on nothing.
      std::cerr << "dlbatch: " << conn.Error(status).message() << "\n";
      return kExitNoSuchJob;
    }
    if (!conn.RetryAfter(status, started)) return conn.Error(status);
  }
  int rc = 0;
  for (const v1::Job& job : reply.jobs()) {
    std::cout << "job " << job.id() << " " << JobStateName(job.state())
              << (job.reason().empty() ? "" : ": " + TerminalText(job.reason()))
              << "\n";
    if (ExitCodeFor(job.state()) != 0) rc = 1;
  }
  if (reply.timed_out()) {
    std::cerr << "dlbatch: timed out before every job ended\n";
    return 2;
  }
  return rc;
}

}  // namespace dlbatch::client
