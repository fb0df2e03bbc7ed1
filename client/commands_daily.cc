#include "client/commands_daily.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/commands.h"
#include "client/commands_control.h"
#include "client/format.h"
#include "client/local_cluster.h"
#include "client/terminal_text.h"
#include "common/duration.h"
#include "common/edit_distance.h"
#include "common/status.h"
#include "common/usage_exit.h"
#include "proto/job_state.h"

namespace dlbatch::client {
namespace {

// Everything after the first "--" that follows a "submit" word: the job's
// command. Cut from argv so that CLI11 never reads it as its options.
std::vector<std::string> CutSubmitCommand(int* argc, char** argv) {
  int submit = -1;
  for (int i = 1; i < *argc; ++i) {
    if (submit < 0 && std::strcmp(argv[i], "submit") == 0) submit = i;
    if (submit >= 0 && std::strcmp(argv[i], "--") == 0) {
      std::vector<std::string> command(argv + i + 1, argv + *argc);
      *argc = i;
      return command;
    }
  }
  return {};
}

struct ColumnInfo {
  JobColumn column;
  const char* name;  // as --format takes it; the header is its upper case
};
constexpr ColumnInfo kColumns[] = {
    {JobColumn::kId, "id"},
    {JobColumn::kName, "name"},
    {JobColumn::kUser, "user"},
    {JobColumn::kState, "state"},
    {JobColumn::kPool, "pool"},
    {JobColumn::kProfile, "profile"},
    {JobColumn::kPriority, "priority"},
    {JobColumn::kSubmitted, "submitted"},
    {JobColumn::kStarted, "started"},
    {JobColumn::kEnded, "ended"},
    {JobColumn::kElapsed, "elapsed"},
    {JobColumn::kProgress, "progress"},
    {JobColumn::kExitCode, "exit_code"},
    {JobColumn::kAttempt, "attempt"},
    {JobColumn::kSweep, "sweep"},
    {JobColumn::kNote, "note"},
};

std::string ColumnName(JobColumn column) {
  for (const ColumnInfo& info : kColumns) {
    if (info.column == column) return info.name;
  }
  return "";
}

std::string Cell(const v1::Job& job, JobColumn column, int64_t now_ms) {
  const bool ended = IsTerminal(job.state());
  switch (column) {
    case JobColumn::kId:
      return absl::StrCat(job.id());
    case JobColumn::kName:
      return job.spec().name();
    case JobColumn::kUser:
      return job.user();
    case JobColumn::kState:
      return JobStateText(job);  // "held" for a held queued job
    case JobColumn::kPool:
      return absl::StrCat(job.spec().pool());
    case JobColumn::kProfile:
      return job.spec().profile();
    case JobColumn::kPriority:
      return absl::StrCat(job.spec().priority());
    case JobColumn::kSubmitted:
      return LocalTime(job.submit_time_ms());
    case JobColumn::kStarted:
      return LocalTime(job.start_time_ms());
    case JobColumn::kEnded:
      return LocalTime(job.end_time_ms());
    case JobColumn::kElapsed: {
      if (job.start_time_ms() <= 0) return "-";
      const int64_t end = job.end_time_ms() > 0 ? job.end_time_ms() : now_ms;
      return FormatDurationMs(end - job.start_time_ms());
    }
    case JobColumn::kProgress:
      return ProgressCell(job);
    case JobColumn::kExitCode:
      return ended ? absl::StrCat(job.exit_code()) : "-";
    case JobColumn::kAttempt:
      return absl::StrCat(job.attempt());
    case JobColumn::kSweep:
      return job.sweep_id() != 0 ? absl::StrCat(job.sweep_id()) : "-";
    case JobColumn::kNote:
      return JobNote(job);
  }
  return "";
}

absl::Status CheckSubmitFlags(const SubmitOptions& o) {
  if (o.job_file.empty() && o.command.empty()) {
    return UsageError(
        "submit: give a job file (dlbatch submit job.yaml) or a command "
        "after -- (dlbatch submit --pool 1 -- python3 train.py)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> StopLocal(bool force) {
  ASSIGN_OR_RETURN(LocalCluster local, LocalCluster::Resolve());
  if (!force && local.SchedulerAnswers()) {
    GlobalFlags flags;
    flags.scheduler = local.address();
    flags.retry_for_ms = 0;
    ASSIGN_OR_RETURN(auto conn, Connection::Open(flags));
    v1::ListJobsRequest request;
    request.add_states(v1::JOB_STATE_RUNNING);
    request.add_states(v1::JOB_STATE_CANCELLING);
    v1::ListJobsReply reply;
    RETURN_IF_ERROR(conn->Error(
        conn->Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
          return stub->ListJobs(ctx, request, &reply);
        })));
    if (reply.jobs_size() > 0) {
      std::vector<int64_t> ids;
      for (const v1::Job& job : reply.jobs()) ids.push_back(job.id());
      return absl::FailedPreconditionError(absl::StrCat(
          reply.jobs_size(), reply.jobs_size() == 1 ? " job runs" : " jobs run",
          " on the local cluster (", absl::StrJoin(ids, ", "),
          "); stopping would end them. Wait for them (dlbatch wait ",
          absl::StrJoin(ids, " "),
          "), cancel them, or stop anyway with "
          "`dlbatch local stop --force`"));
    }
  }
  RETURN_IF_ERROR(local.Stop());
  return 0;
}

absl::StatusOr<int> LocalStatus() {
  ASSIGN_OR_RETURN(LocalCluster local, LocalCluster::Resolve());
  const std::string status = local.Status();
  std::cout << status;
  return status.find("not running") == std::string::npos ? 0 : 3;
}

int FollowExitCode(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_FINISHED:
      return 0;
    case v1::JOB_STATE_CANCELLED:
      return kExitJobCancelled;
    default:
      return job.exit_code() >= 1 && job.exit_code() <= 255 ? job.exit_code()
                                                            : kExitJobFailed;
  }
}

std::string NearestCommand(std::string_view typed,
                           const std::vector<std::string>& known) {
  static const std::map<std::string_view, std::string_view> kSynonyms = {
      {"logs", "diary"},
      {"log", "diary"},
      {"output", "diary"},
      {"tail", "diary"},
      {"ls", "jobs"},
      {"ps", "jobs"},
      {"queue", "jobs"},
      {"list", "jobs"},
      {"squeue", "jobs"},
      {"status", "show"},
      {"info", "show"},
      {"describe", "show"},
      {"kill", "cancel"},
      {"stop", "cancel"},
      {"scancel", "cancel"},
      {"rm", "cancel"},
      {"run", "submit"},
      {"sbatch", "submit"},
      {"nodes", "workers"},
      {"top", "monitor"},
      {"watch", "monitor"},
      {"download", "fetch-outputs"},
      {"outputs", "fetch-outputs"},
  };
  auto is_known = [&](std::string_view name) {
    return std::find(known.begin(), known.end(), name) != known.end();
  };
  if (auto it = kSynonyms.find(typed); it != kSynonyms.end()) {
    if (is_known(it->second)) return std::string(it->second);
  }
  std::string best;
  size_t best_distance = 0;
  for (const std::string& name : known) {
    const size_t d = EditDistance(typed, name, /*swap_is_one_edit=*/true);
    if (best.empty() || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  // Close enough to be a slip of the fingers: at most a third of the word.
  const size_t allowed = std::max<size_t>(1, typed.size() / 3);
  if (best.empty() || best_distance > allowed) return "";
  return best;
}

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    // The deepest command given, and the first word left over under it.
    CLI::App* at = &app;
    while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
    std::vector<std::string> known;
    for (const CLI::App* sub : at->get_subcommands({})) {
      known.push_back(sub->get_name());
    }
    std::string typed;
    for (const std::string& word : app.remaining(/*recurse=*/true)) {
      if (!word.empty() && word[0] != '-') {
        typed = word;
        break;
      }
    }
    if (!known.empty() && typed.empty() && e.get_name() == "RequiredError" &&
        at->get_require_subcommand_min() > 0) {
      // No command at all (`dlbatch`, `dlbatch local`): the list of them,
      // as --help prints it, is the answer, not "A subcommand is required".
      std::cerr << app.help();
      return kExitUsage;
    }
    if (known.empty() || typed.empty() || e.get_exit_code() == 0) {
      return ExitForParseError(app, e);
    }
    std::string where = at == &app ? "dlbatch" : "dlbatch " + at->get_name();
    std::cerr << "dlbatch: unknown command '" << TerminalText(typed) << "'";
    const std::string nearest = NearestCommand(typed, known);
    if (!nearest.empty()) {
      std::cerr << "; did you mean `" << where << " " << nearest << "`?";
    }
    std::cerr << "\n(the commands: " << absl::StrJoin(known, ", ") << "; `"
              << where << " --help` says what each does)\n";
    return kExitUsage;
  }
}

bool JobStateFilter::Keeps(const v1::Job& job) const {
  if (!states.empty() &&
      std::find(states.begin(), states.end(), job.state()) == states.end()) {
    return false;
  }
  return !queued_only_held || job.state() != v1::JOB_STATE_QUEUED || job.held();
}

absl::StatusOr<JobStateFilter> ParseJobStateFilter(
    const std::vector<std::string>& names) {
  JobStateFilter filter;
  bool held = false, queued = false;
  for (const std::string& name : names) {
    v1::JobState state;
    if (name == "held") {
      held = true;
      state = v1::JOB_STATE_QUEUED;
    } else if (!ParseJobState(name, &state)) {
      return UsageError(
          absl::StrCat("unknown state '", name, "'; use ", kJobStateNames));
    } else if (state == v1::JOB_STATE_QUEUED) {
      queued = true;
    }
    if (std::find(filter.states.begin(), filter.states.end(), state) ==
        filter.states.end()) {
      filter.states.push_back(state);
    }
  }
  filter.queued_only_held = held && !queued;
  return filter;
}

absl::StatusOr<std::vector<JobColumn>> ParseJobColumns(std::string_view text) {
  std::vector<JobColumn> columns;
  for (absl::string_view word :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    word = absl::StripAsciiWhitespace(word);
    if (word.empty()) continue;
    std::string lower(word);
    for (char& ch : lower) ch = static_cast<char>(tolower(ch));
    if (lower == "exit") lower = "exit_code";
    const ColumnInfo* found = nullptr;
    for (const ColumnInfo& info : kColumns) {
      if (lower == info.name) found = &info;
    }
    if (found == nullptr) {
      std::vector<std::string> names;
      for (const ColumnInfo& info : kColumns) names.push_back(info.name);
      return UsageError(absl::StrCat(
          "--format: no column '", word, "'; the columns are ",
          absl::StrJoin(names, ","), " (e.g. --format id,name,state,user)"));
    }
    columns.push_back(found->column);
  }
  if (columns.empty()) {
    return UsageError(
        "--format: name at least one column, e.g. --format id,name,state");
  }
  return columns;
}

std::vector<JobColumn> DefaultJobColumns() {
  return {JobColumn::kId,        JobColumn::kName,    JobColumn::kUser,
          JobColumn::kState,     JobColumn::kPool,    JobColumn::kProfile,
          JobColumn::kSubmitted, JobColumn::kElapsed, JobColumn::kProgress,
          JobColumn::kNote};
}

std::string RenderJobsTable(const std::vector<v1::Job>& jobs,
                            const std::vector<JobColumn>& columns,
                            int64_t now_ms) {
  std::vector<std::string> header;
  for (JobColumn c : columns) {
    std::string name = ColumnName(c);
    for (char& ch : name) ch = static_cast<char>(toupper(ch));
    header.push_back(name);
  }
  Table table(std::move(header));
  for (const v1::Job& job : jobs) {
    std::vector<std::string> row;
    for (JobColumn c : columns) row.push_back(Cell(job, c, now_ms));
    table.Add(std::move(row));
  }
  return table.Render();
}

void AddDailyCommands(CLI::App& app, const GlobalFlags* flags, int* rc,
                      int* argc, char** argv) {
  auto submit = std::make_shared<SubmitOptions>();
  submit->command = CutSubmitCommand(argc, argv);
  auto* c_submit = app.add_subcommand(
      "submit",
      "Queue a job: one described by a job.yaml, or a command given after "
      "--\n(dlbatch submit --pool 2 -- python3 train.py --epochs 3). With "
      "both, the command\nand the flags replace the file's own.");
  c_submit->add_option("job_file", submit->job_file,
                       "The job file (optional with -- PROGRAM ARGS...)");
  c_submit->add_option("--pool", submit->pool,
                       "GPUs (or CPU slots) the job needs at once");
  c_submit->add_option("--profile", submit->profile,
                       "Cluster profile to queue on");
  c_submit->add_option("--priority", submit->priority, "Higher starts first");
  c_submit->add_option("--name", submit->name,
                       "Job name (default: the job file's or program's name)");
  c_submit
      ->add_option("--time-limit", submit->time_limit,
                   "Stop the job after this long (90s, 30m, 2h)")
      ->type_name("DURATION");
  c_submit
      ->add_option("--env", submit->env,
                   "Set a variable for the job (repeatable; over the job "
                   "file's env:)")
      ->type_name("NAME=VALUE")
      ->allow_extra_args(false);  // one value each: never the job file
  c_submit
      ->add_option("--attach", submit->attach,
                   "Upload this file or folder into the job's working folder "
                   "(repeatable; relative to here)")
      ->type_name("PATH")
      ->allow_extra_args(false);
  c_submit->add_option("--max-nodes", submit->max_nodes,
                       "Workers the pool may span (1: one worker)");
  c_submit
      ->add_option("--launch", submit->launch,
                   "Command jobs: start one process per worker (per-node) or "
                   "per GPU or CPU slot (per-slot), with torchrun's variables")
      ->type_name("MODE");
  c_submit
      ->add_option("--output-dir", submit->output_dir,
                   "When the job ends, fetch its outputs into this folder "
                   "(waits for it, as --follow)")
      ->type_name("DIR");
  c_submit->add_flag(
      "-f,--follow", submit->follow,
      "Follow the diary until the job ends; exit 0 if it finished, its own "
      "exit code if it failed (128+N if killed by signal N, as a shell "
      "says), 130 if cancelled, 125 if its program never ran (a sweep: wait "
      "for all its jobs, then compare them)");
  c_submit->add_flag(
      "-q,--quiet", submit->quiet,
      "Print only the job id (a sweep: its job ids, one a line)");
  c_submit->add_option(
      "--request-id", submit->request_id,
      "Makes a resubmit safe across processes: the same job submitted again "
      "with an id you used makes no job and prints the first one's id; a "
      "different job with it is refused (default: a random id, kept across "
      "this submit's own retries)");
  c_submit
      ->add_option("--after", submit->after,
                   "Start only after these jobs finished well (ID,ID); "
                   "fail if one does not")
      ->delimiter(',')
      ->allow_extra_args(false);  // one value each: never the job file
  c_submit->add_flag(
      "--data-on-workers", submit->data_on_workers,
      "A train job's absolute data paths are on a filesystem the workers "
      "mount and this machine does not: do not look for them here");
  c_submit->callback([flags, rc, submit] {
    absl::Status ok = CheckSubmitFlags(*submit);
    *rc = Report(ok.ok() ? Submit(*flags, *submit) : absl::StatusOr<int>(ok));
  });

  auto jobs = std::make_shared<JobsOptions>();
  auto* c_jobs = app.add_subcommand("jobs", "List jobs");
  c_jobs
      ->add_option("--state", jobs->states,
                   absl::StrCat("Only jobs in these states (comma-separated): ",
                                kJobStateNames,
                                " (held: queued and held; queued takes the "
                                "held ones too)"))
      ->delimiter(',');
  c_jobs->add_option("--user", jobs->user, "Only this user's jobs");
  c_jobs->add_flag("--mine", jobs->mine, "Only your own jobs");
  c_jobs
      ->add_option("--name", jobs->name_glob,
                   "Only jobs whose name matches this pattern (* ? [...], "
                   "quoted for the shell: --name 'resnet-*')")
      ->type_name("GLOB");
  c_jobs->add_option("--limit", jobs->limit,
                     "Only the newest this many, newest first");
  c_jobs->add_option("--sweep", jobs->sweep_id, "Only the jobs of this sweep");
  std::vector<std::string> names;
  for (const ColumnInfo& info : kColumns) names.push_back(info.name);
  auto* json = c_jobs->add_flag(
      "--json", jobs->json, "JSON instead of a table (README: JSON output)");
  c_jobs
      ->add_option("--format", jobs->format,
                   absl::StrCat("The table's columns, comma-separated, of: ",
                                absl::StrJoin(names, ","),
                                " (default: id,name,user,state,pool,profile,"
                                "submitted,elapsed,progress,note)"))
      ->type_name("COLUMNS")
      ->excludes(json);
  c_jobs->callback([flags, rc, jobs] {
    auto conn = Connection::Open(*flags);
    *rc = Report(conn.ok() ? Jobs(**conn, *jobs)
                           : absl::StatusOr<int>(conn.status()));
  });
}

}  // namespace dlbatch::client
