#include "scheduler/slurm/commands.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace dlbatch::scheduler::slurm {
namespace {

constexpr absl::string_view kNamePrefix = "dlbatch-";

// 'text' for sh: single quotes, each ' as '\''.
std::string ShellQuote(absl::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

absl::StatusOr<int64_t> Number(absl::string_view text, absl::string_view what) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Slurm's ", what, " '", text, "' is not a number"));
  }
  return n;
}

// `s` without its parenthesized parts: "gpu:(null):1(IDX:0,2)" is
// "gpu::1".
std::string WithoutParens(absl::string_view s) {
  std::string out;
  int depth = 0;
  for (char c : s) {
    if (c == '(') {
      ++depth;
    } else if (c == ')') {
      depth = std::max(0, depth - 1);
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

// The count of GRES `name` in one sinfo GRES field (%G, Gres, GresUsed):
// "gpu:2", "gpu:a100:4(S:0-1)", "gpu:2,nic:1", "gpu:1(IDX:0)",
// "gpu:(null):1(IDX:0)", "(null)".
int GresCount(absl::string_view field, absl::string_view name) {
  int best = 0;
  const std::string plain = WithoutParens(field);
  for (absl::string_view item : absl::StrSplit(plain, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    if (parts.size() < 2 || parts[0] != name) continue;
    int n = 0;
    if (absl::SimpleAtoi(parts.back(), &n)) best = std::max(best, n);
  }
  return best;
}

enum class NodeUse { kIdle, kBusy, kUnavailable };

// sinfo's StateLong: "idle", "mixed", "drained*" (not responding), "idle~"
// (powered down), ...
NodeUse StateOfNode(absl::string_view state) {
  const bool flagged =
      !state.empty() &&
      !absl::ascii_isalpha(static_cast<unsigned char>(state.back()));
  while (!state.empty() &&
         !absl::ascii_isalpha(static_cast<unsigned char>(state.back()))) {
    state.remove_suffix(1);
  }
  if (flagged) return NodeUse::kUnavailable;
  if (state == "idle") return NodeUse::kIdle;
  if (state == "allocated" || state == "mixed" || state == "completing") {
    return NodeUse::kBusy;
  }
  return NodeUse::kUnavailable;
}

// sinfo -O's fields, each ended by '|' (so a last empty one follows),
// stripped of their padding; nullopt unless there are `count`.
std::optional<std::vector<absl::string_view>> PaddedFields(
    absl::string_view line, size_t count) {
  std::vector<absl::string_view> f = absl::StrSplit(line, '|');
  if (f.size() == count + 1 && absl::StripAsciiWhitespace(f.back()).empty()) {
    f.pop_back();
  }
  if (f.size() != count) return std::nullopt;
  for (absl::string_view& field : f) field = absl::StripAsciiWhitespace(field);
  return f;
}

// One bracketed range list of a host list, "1-3,5" with its zero padding
// kept: "01-02" -> "01", "02".
absl::StatusOr<std::vector<std::string>> ExpandRanges(absl::string_view ranges,
                                                      absl::string_view list) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("Slurm's host list '", list,
                                                   "' has a form dlbatch does "
                                                   "not know"));
  };
  // A host list names a few thousand nodes at most.
  constexpr int64_t kMaxNodes = 100000;
  std::vector<std::string> out;
  for (absl::string_view range : absl::StrSplit(ranges, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(range, '-');
    int64_t lo = 0, hi = 0;
    if (ends.empty() || ends.size() > 2 || ends[0].empty() ||
        !absl::SimpleAtoi(ends[0], &lo) || lo < 0) {
      return bad();
    }
    hi = lo;
    if (ends.size() == 2 &&
        (ends[1].empty() || !absl::SimpleAtoi(ends[1], &hi) || hi < lo)) {
      return bad();
    }
    if (hi - lo >= kMaxNodes) return bad();
    const size_t width = ends[0].size();
    for (int64_t n = lo; n <= hi; ++n) {
      std::string digits = absl::StrCat(n);
      if (digits.size() < width) {
        digits.insert(0, width - digits.size(), '0');
      }
      out.push_back(std::move(digits));
    }
  }
  return out;
}

// One host of a list (no top-level comma): its text with each bracket
// group expanded, in order ("r[1-2]n[1-2]": r1n1, r1n2, r2n1, r2n2).
absl::StatusOr<std::vector<std::string>> ExpandHost(absl::string_view host,
                                                    absl::string_view list) {
  const size_t open = host.find('[');
  if (open == absl::string_view::npos) {
    if (host.find(']') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Slurm's host list '", list, "' has a form dlbatch does not know"));
    }
    return std::vector<std::string>{std::string(host)};
  }
  const size_t close = host.find(']', open);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Slurm's host list '", list, "' has a form dlbatch does not know"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> numbers,
                   ExpandRanges(host.substr(open + 1, close - open - 1), list));
  ASSIGN_OR_RETURN(std::vector<std::string> rests,
                   ExpandHost(host.substr(close + 1), list));
  std::vector<std::string> out;
  for (const std::string& n : numbers) {
    for (const std::string& rest : rests) {
      out.push_back(absl::StrCat(host.substr(0, open), n, rest));
    }
  }
  return out;
}

}  // namespace

bool IsInstanceId(absl::string_view id) {
  return id.size() == kInstanceIdLength &&
         std::all_of(id.begin(), id.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

std::string SlurmJobName(absl::string_view instance, int64_t job_id) {
  return absl::StrCat(kNamePrefix, instance, "-", job_id);
}

std::optional<ParsedSlurmName> ParseSlurmJobName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kNamePrefix)) return std::nullopt;
  ParsedSlurmName parsed;
  if (const size_t dash = name.find('-'); dash != absl::string_view::npos) {
    parsed.instance = std::string(name.substr(0, dash));
    if (!IsInstanceId(parsed.instance)) return std::nullopt;
    name.remove_prefix(dash + 1);
  }
  int64_t id = 0;
  if (name.empty() || !absl::SimpleAtoi(name, &id) || id <= 0 ||
      absl::StrCat(id) != name) {
    return std::nullopt;
  }
  parsed.job_id = id;
  return parsed;
}

std::string SlurmTimeLimit(int64_t time_limit_s) {
  if (time_limit_s <= 0) return "";
  const int64_t minutes = (time_limit_s + kSlurmTimeMarginS + 59) / 60;
  return absl::StrCat(minutes);
}

std::vector<std::string> SbatchArgv(const SlurmProfile& profile,
                                    const BatchRequest& request) {
  std::vector<std::string> argv = {
      "sbatch",
      "--parsable",
      absl::StrCat("--job-name=",
                   SlurmJobName(request.instance, request.job_id)),
      absl::StrCat("--partition=", profile.partition),
      absl::StrCat("--nodes=", request.nodes),
      absl::StrCat("--ntasks=", request.nodes),
      "--ntasks-per-node=1",
      "--no-requeue",
      "--export=NONE",
      absl::StrCat("--output=", profile.node_dir, "/",
                   SlurmJobName(request.instance, request.job_id), "-%j.out"),
  };
  if (request.gpus_per_node > 0) {
    argv.push_back(
        absl::StrCat("--gres=", profile.gres_name, ":", request.gpus_per_node));
  }
  if (request.cpus_per_node > 0) {
    argv.push_back(absl::StrCat("--cpus-per-task=", request.cpus_per_node));
  }
  if (std::string t = SlurmTimeLimit(request.time_limit_s); !t.empty()) {
    argv.push_back(absl::StrCat("--time=", t));
  }
  if (!profile.account.empty()) {
    argv.push_back(absl::StrCat("--account=", profile.account));
  }
  if (!profile.qos.empty()) argv.push_back(absl::StrCat("--qos=", profile.qos));
  if (request.uid) argv.push_back(absl::StrCat("--uid=", *request.uid));
  if (request.gid) argv.push_back(absl::StrCat("--gid=", *request.gid));
  argv.insert(argv.end(), profile.sbatch_args.begin(),
              profile.sbatch_args.end());
  return argv;
}

std::string BatchScript(const SlurmProfile& profile,
                        const BatchRequest& request,
                        const WorkerLaunch& launch) {
  std::string s = absl::StrCat(
      "#!/bin/bash\n", "# dlbatch job ", request.job_id, ", attempt ",
      request.attempt, ": one dlbatch-worker per node\n",
      "# for this job only; each exits when the job ends.\n", "umask 077\n",
      "export PATH=\"${PATH:-/usr/local/bin:/usr/bin:/bin}\"\n",
      "export DLBATCH_SCHEDULER=", ShellQuote(launch.scheduler), "\n",
      "export DLBATCH_TOKEN=", ShellQuote(launch.token), "\n");
  if (!launch.ca_pem.empty()) {
    absl::StrAppend(&s, "export DLBATCH_CA_PEM=", ShellQuote(launch.ca_pem),
                    "\n");
  }
  if (request.nodes > 1) {
    // sbatch's --export=NONE reaches srun as SLURM_EXPORT_ENV: the script's
    // own variables go to the workers only with --export=ALL.
    // srun of Slurm 22.05 does not take --cpus-per-task from the batch
    // job (SLURM_CPUS_PER_TASK): the step asks for the job's CPUs itself.
    absl::StrAppend(&s, "exec srun --export=ALL --nodes=", request.nodes,
                    " --ntasks=", request.nodes, " --ntasks-per-node=1");
    if (request.cpus_per_node > 0) {
      absl::StrAppend(&s, " --cpus-per-task=", request.cpus_per_node);
    }
    absl::StrAppend(&s, " \\\n  ");
  } else {
    // One node: the batch step is its one task (SLURM_NODEID 0, the job's
    // GPUs in CUDA_VISIBLE_DEVICES), so no job step is made (srun costs a
    // tenth of a second before the worker starts).
    absl::StrAppend(&s, "exec ");
  }
  absl::StrAppend(
      &s, ShellQuote(absl::StrCat(profile.bin_dir, "/dlbatch-worker")),
      " --slurm-job ", request.job_id, " --attempt ", request.attempt,
      " \\\n  --profile ", ShellQuote(profile.name), " --work-dir ",
      ShellQuote(profile.node_dir), "\n");
  return s;
}

absl::StatusOr<int64_t> ParseSbatchParsable(absl::string_view out) {
  absl::string_view line = absl::StripAsciiWhitespace(out);
  line = line.substr(0, line.find(';'));
  int64_t id = 0;
  if (line.empty() || !absl::SimpleAtoi(line, &id) || id <= 0) {
    return absl::InternalError(absl::StrCat("sbatch --parsable printed '",
                                            absl::StripAsciiWhitespace(out),
                                            "', not a job id"));
  }
  return id;
}

std::vector<std::string> SqueueArgv(
    const std::vector<std::string>& partitions) {
  std::vector<std::string> argv = {"squeue", "-h", "--states=all", "-o",
                                   kSqueueFormat};
  if (!partitions.empty()) {
    argv.push_back(
        absl::StrCat("--partition=", absl::StrJoin(partitions, ",")));
  }
  return argv;
}

absl::StatusOr<std::vector<SqueueRow>> ParseSqueue(absl::string_view out) {
  std::vector<SqueueRow> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty()) continue;
    // The reason is last and may hold anything; the rest hold no '|'.
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::MaxSplits('|', 5));
    int64_t id = 0;
    if (f.size() != 6 || !absl::SimpleAtoi(f[0], &id) || id <= 0) {
      return absl::InternalError(absl::StrCat(
          "squeue printed a line dlbatch cannot read: '", line, "'"));
    }
    rows.push_back(SqueueRow{id, std::string(f[1]), std::string(f[2]),
                             std::string(f[3]), std::string(f[4]),
                             std::string(f[5])});
  }
  return rows;
}

SlurmVerdict MapSlurmState(const SqueueRow& row, absl::string_view partition) {
  absl::string_view state = row.state;
  auto pending = [&] {
    const std::string reason =
        row.reason.empty() || row.reason == "None" ? "Priority" : row.reason;
    return SlurmVerdict{SlurmPhase::kPending, false,
                        absl::StrCat("waiting in Slurm: ", reason,
                                     " (partition ", partition, ")")};
  };
  auto ended = [&](bool retryable, std::string why, bool by_slurm = true) {
    return SlurmVerdict{SlurmPhase::kEnded, retryable, std::move(why),
                        by_slurm};
  };
  const std::string id = absl::StrCat("Slurm job ", row.slurm_id);
  if (state == "PENDING" || state == "CONFIGURING" || state == "REQUEUED" ||
      state == "REQUEUE_HOLD" || state == "REQUEUE_FED" ||
      state == "RESV_DEL_HOLD") {
    return pending();
  }
  if (state == "RUNNING" || state == "COMPLETING" || state == "SUSPENDED" ||
      state == "STAGE_OUT" || state == "SIGNALING" || state == "RESIZING" ||
      state == "STOPPED") {
    return SlurmVerdict{SlurmPhase::kRunning, false, ""};
  }
  if (absl::StartsWith(state, "CANCELLED")) {
    // "CANCELLED by 1000": who, where Slurm says.
    absl::string_view by = state.substr(std::string_view("CANCELLED").size());
    by = absl::StripAsciiWhitespace(by);
    return ended(false,
                 absl::StrCat(id, " was cancelled in Slurm",
                              by.empty() ? "" : absl::StrCat(" (", by, ")")));
  }
  if (state == "COMPLETED") {
    return ended(false, absl::StrCat(id, " completed"), /*by_slurm=*/false);
  }
  if (state == "FAILED") {
    return ended(false, absl::StrCat(id, " failed (", row.reason, ")"),
                 /*by_slurm=*/false);
  }
  if (state == "TIMEOUT") {
    return ended(false, absl::StrCat(id, " reached its Slurm time limit"));
  }
  if (state == "DEADLINE") {
    return ended(false, absl::StrCat(id, " reached its Slurm deadline"));
  }
  if (state == "OUT_OF_MEMORY") {
    return ended(false, absl::StrCat(id, " ran out of memory"));
  }
  if (state == "NODE_FAIL") {
    return ended(
        true, absl::StrCat(id, " lost a node (NODE_FAIL on ", row.nodes, ")"));
  }
  if (state == "PREEMPTED") {
    SlurmVerdict v = ended(true, absl::StrCat(id, " was preempted by Slurm"));
    v.preempted = true;
    return v;
  }
  if (state == "BOOT_FAIL") {
    return ended(true, absl::StrCat(id, " could not boot its nodes"));
  }
  return SlurmVerdict{SlurmPhase::kUnknown, false,
                      absl::StrCat(id, " is in state ", state,
                                   ", which dlbatch does not know")};
}

std::vector<std::string> SinfoArgv(const std::string& partition) {
  return {"sinfo",   "-h",
          "--exact", absl::StrCat("--partition=", partition),
          "-o",      kSinfoFormat};
}

absl::StatusOr<PartitionLimits> ParseSinfo(absl::string_view out,
                                           const std::string& partition,
                                           const std::string& gres_name) {
  PartitionLimits limits;
  limits.partition = partition;
  bool any = false;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, '|');
    if (f.size() != 4) {
      return absl::InternalError(absl::StrCat(
          "sinfo printed a line dlbatch cannot read: '", line, "'"));
    }
    // "2", or "2+" where nodes of more CPUs share the line (without
    // --exact): the least of them.
    absl::StatusOr<int64_t> cpus =
        Number(absl::StripSuffix(f[3], "+"), "CPU count");
    if (!cpus.ok()) return cpus.status();
    absl::StatusOr<int64_t> nodes = Number(f[0], "node count");
    if (!nodes.ok()) return nodes.status();
    absl::StatusOr<int64_t> time = ParseSlurmTime(f[2]);
    if (!time.ok()) return time.status();
    limits.nodes += static_cast<int>(*nodes);
    limits.max_gpus_per_node =
        std::max(limits.max_gpus_per_node, GresCount(f[1], gres_name));
    limits.max_cpus_per_node =
        std::max(limits.max_cpus_per_node, static_cast<int>(*cpus));
    // Groups of nodes share the partition's MaxTime; the largest wins.
    if (*time == 0 || (any && limits.max_time_s == 0)) {
      limits.max_time_s = 0;
    } else {
      limits.max_time_s = std::max(limits.max_time_s, *time);
    }
    any = true;
  }
  if (!any) {
    return absl::NotFoundError(absl::StrCat(
        "Slurm has no partition '", partition,
        "' (sinfo lists no nodes in it): set the profile's partition to one "
        "that `sinfo` shows"));
  }
  return limits;
}

std::vector<std::string> SinfoNodesArgv(const std::string& partition) {
  return {"sinfo", "-h",
          "-N",    absl::StrCat("--partition=", partition),
          "-O",    kSinfoNodesFormat};
}

absl::StatusOr<PartitionView> ParseSinfoNodes(absl::string_view out,
                                              const std::string& partition,
                                              const std::string& gres_name) {
  PartitionView view;
  view.partition = partition;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::optional<std::vector<absl::string_view>> fields =
        PaddedFields(line, 4);
    if (!fields) {
      return absl::InternalError(absl::StrCat(
          "sinfo printed a line dlbatch cannot read: '", line, "'"));
    }
    const std::vector<absl::string_view>& f = *fields;
    ++view.nodes;
    switch (StateOfNode(f[1])) {
      case NodeUse::kIdle:
        ++view.idle;
        break;
      case NodeUse::kBusy:
        ++view.busy;
        break;
      case NodeUse::kUnavailable:
        ++view.unavailable;
        break;
    }
    view.gpus += GresCount(f[2], gres_name);
    view.gpus_used += GresCount(f[3], gres_name);
  }
  if (view.nodes == 0) {
    return absl::NotFoundError(absl::StrCat(
        "Slurm has no partition '", partition,
        "' (sinfo lists no nodes in it): set the profile's partition to one "
        "that `sinfo` shows"));
  }
  return view;
}

std::vector<std::string> SinfoNodeRowsArgv(const std::string& partition) {
  return {"sinfo", "-h",
          "-N",    absl::StrCat("--partition=", partition),
          "-O",    kSinfoNodeRowsFormat};
}

absl::StatusOr<std::vector<NodeRow>> ParseSinfoNodeRows(
    absl::string_view out, const std::string& gres_name) {
  std::vector<NodeRow> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::optional<std::vector<absl::string_view>> f = PaddedFields(line, 5);
    // CPUsState: allocated/idle/other/total.
    std::vector<absl::string_view> cpus;
    if (f) cpus = absl::StrSplit((*f)[4], '/');
    NodeRow row;
    if (!f || (*f)[0].empty() || cpus.size() != 4 ||
        !absl::SimpleAtoi(cpus[1], &row.cpus_idle) ||
        !absl::SimpleAtoi(cpus[3], &row.cpus)) {
      return absl::InternalError(absl::StrCat(
          "sinfo printed a line dlbatch cannot read: '", line, "'"));
    }
    row.name = std::string((*f)[0]);
    row.usable = StateOfNode((*f)[1]) != NodeUse::kUnavailable;
    row.gpus = GresCount((*f)[2], gres_name);
    row.gpus_used = GresCount((*f)[3], gres_name);
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::StatusOr<std::vector<std::string>> ExpandHostlist(
    absl::string_view list) {
  std::vector<std::string> out;
  // Top-level commas part hosts; those inside brackets part ranges.
  int depth = 0;
  size_t from = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0 || depth > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Slurm's host list '", list, "' has a form dlbatch does not know"));
    }
    if (i < list.size() && (list[i] != ',' || depth > 0)) continue;
    absl::string_view host = list.substr(from, i - from);
    from = i + 1;
    if (host.empty()) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> names, ExpandHost(host, list));
    for (std::string& n : names) out.push_back(std::move(n));
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Slurm's host list '", list, "' has a form dlbatch does not know"));
  }
  return out;
}

std::vector<std::string> ScancelSignalArgv(int64_t slurm_id,
                                           absl::string_view signal) {
  return {"scancel", "--batch", absl::StrCat("--signal=", signal),
          absl::StrCat(slurm_id)};
}

absl::Status CheckFits(const PartitionLimits& limits,
                       const BatchRequest& request) {
  const std::string where =
      absl::StrCat("Slurm partition '", limits.partition, "'");
  if (request.nodes > limits.nodes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job asks for ", request.nodes, " nodes but ", where,
                     " has ", limits.nodes, ": lower max_nodes or pool"));
  }
  if (request.gpus_per_node > limits.max_gpus_per_node) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for ", request.gpus_per_node,
        " GPUs on a node but the "
        "nodes of ",
        where, " have at most ", limits.max_gpus_per_node,
        ": raise max_nodes to spread the pool, or lower the pool"));
  }
  if (limits.max_cpus_per_node > 0 &&
      request.cpus_per_node > limits.max_cpus_per_node) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for ", request.cpus_per_node, " CPUs on a node (",
        request.gpus_per_node > 0 ? "one for each of its GPUs there"
                                  : "one for each of its CPU slots there",
        ") but the nodes of ", where, " have at most ",
        limits.max_cpus_per_node,
        ": raise max_nodes to spread the pool, or lower the pool"));
  }
  if (limits.max_time_s > 0 && request.time_limit_s > 0 &&
      request.time_limit_s + kSlurmTimeMarginS > limits.max_time_s) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job's time_limit of ", request.time_limit_s, " s (plus ",
        kSlurmTimeMarginS, " s to stop and upload) is more than ", where,
        "'s MaxTime of ", limits.max_time_s, " s: lower time_limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseSlurmTime(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "infinite" || lower == "unlimited") return 0;
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("Slurm's time '", text,
                     "' has a form dlbatch does not "
                     "know"));
  };
  int64_t days = 0;
  absl::string_view rest = text;
  const bool has_days = rest.find('-') != absl::string_view::npos;
  if (has_days) {
    size_t dash = rest.find('-');
    if (!absl::SimpleAtoi(rest.substr(0, dash), &days) || days < 0)
      return bad();
    rest = rest.substr(dash + 1);
  }
  std::vector<int64_t> parts;
  for (absl::string_view p : absl::StrSplit(rest, ':')) {
    int64_t n = 0;
    if (p.empty() || !absl::SimpleAtoi(p, &n) || n < 0) return bad();
    parts.push_back(n);
  }
  if (parts.empty() || parts.size() > 3) return bad();
  int64_t h = 0, m = 0, s = 0;
  if (has_days) {
    // D-HH, D-HH:MM, D-HH:MM:SS
    h = parts[0];
    if (parts.size() > 1) m = parts[1];
    if (parts.size() > 2) s = parts[2];
  } else if (parts.size() == 1) {
    m = parts[0];  // MM
  } else if (parts.size() == 2) {
    m = parts[0];  // MM:SS
    s = parts[1];
  } else {
    h = parts[0];  // HH:MM:SS
    m = parts[1];
    s = parts[2];
  }
  return ((days * 24 + h) * 60 + m) * 60 + s;
}

absl::Status ScancelOutcome(int exit_code, absl::string_view stderr_text) {
  if (exit_code == 0) return absl::OkStatus();
  const std::string lower = absl::AsciiStrToLower(stderr_text);
  if (absl::StrContains(lower, "already completing") ||
      absl::StrContains(lower, "invalid job id") ||
      absl::StrContains(lower, "job has already finished")) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("scancel failed (exit ", exit_code,
                   "): ", absl::StripAsciiWhitespace(stderr_text)));
}

}  // namespace dlbatch::scheduler::slurm
