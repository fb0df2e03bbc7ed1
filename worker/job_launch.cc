#include "worker/job_launch.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "worker/command_progress.h"
#include "worker/devices.h"
#include "worker/job_table.h"
#include "worker/launch_env.h"
#include "worker/launch_rendezvous.h"
#include "worker/train_job.h"

namespace dlbatch::worker {

namespace {

struct Account {
  SubprocessOptions::Identity id;
  std::string home;
};

// The job owner's account on this machine: uid, group, supplementary
// groups (as initgroups would set them) and home.
absl::StatusOr<Account> LookUpOwner(const std::string& user,
                                    const std::string& worker) {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (user.empty() ||
      ::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "user '", user, "' has no account on worker ", worker,
        "; jobs run as their owner, so the owner must exist on the workers "
        "of the profile"));
  }
  Account account;
  account.id.uid = pw.pw_uid;
  account.id.gid = pw.pw_gid;
  account.home = pw.pw_dir != nullptr ? pw.pw_dir : "/";
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (::getgrouplist(user.c_str(), pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n) + 16);
    n = static_cast<int>(groups.size());
  }
  groups.resize(static_cast<size_t>(n));
  account.id.groups = std::move(groups);
  return account;
}

// Gives `dir` and everything under it (not following links) to `id`.
absl::Status GiveTree(const std::string& dir,
                      const SubprocessOptions::Identity& id) {
  std::error_code ec;
  if (::lchown(dir.c_str(), id.uid, id.gid) != 0) {
    return ErrnoStatus(errno, "chown", dir);
  }
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string path = it->path().string();
    if (::lchown(path.c_str(), id.uid, id.gid) != 0) {
      return ErrnoStatus(errno, "chown", path);
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(dir, ": ", ec.message()));
  return absl::OkStatus();
}

// A command job's ways to talk back: $DLBATCH_PROGRESS (a FIFO in its
// folder, also its descriptor 3; worker/command_progress.h) and
// $DLBATCH_STOP_FILE (written when it is asked to stop), and the `dlbatch`
// Python module on its PYTHONPATH (a job's env: adds to it).
void AddCommandChannels(const v1::JobSpec& spec, const std::string& dir,
                        const LaunchContext& context, SubprocessOptions* sp) {
  sp->channel = true;
  sp->channel_fifo = absl::StrCat(dir, "/", kProgressFifo);
  sp->env.emplace_back(kProgressEnv, sp->channel_fifo);
  sp->env.emplace_back("DLBATCH_STOP_FILE",
                       absl::StrCat(dir, "/", JobTable::kStopFile));
  // The signal a preemption sends first (unset: SIGTERM), for
  // dlbatch.should_stop() to catch.
  if (std::optional<int> sig = StopSignalNumber(spec.preempt_signal()))
    sp->env.emplace_back("DLBATCH_PREEMPT_SIGNAL", StopSignalName(*sig));
  if (!context.python_dir.empty())
    sp->env.emplace_back("PYTHONPATH", context.python_dir);
}

// A job's parts must all have started preparing within this long: their
// workers meet before any process starts.
constexpr absl::Duration kLaunchMeetTimeout = absl::Minutes(10);

// The processes of a `launch:` job's part, each with torchrun's variables
// (launch_env.h). Parts of a job spread over workers meet at the
// scheduler's rendezvous first; a job on one worker talks over loopback.
absl::StatusOr<std::vector<SubprocessOptions::RankProcess>> LaunchProcesses(
    const v1::StartJob& start, const LaunchContext& context,
    std::vector<std::string>* notes) {
  LaunchLayout layout;
  layout.mode = start.spec().launch();
  layout.part = start.part();
  layout.parts = std::max(1, start.parts());
  layout.slots = std::max(1, start.devices_size());
  layout.first_rank = start.first_rank();
  layout.pool = std::max(start.pool(), layout.first_rank + layout.slots);
  layout.gpus = context.gpus;
  if (layout.parts == 1) {
    layout.hosts = {"127.0.0.1"};
    ASSIGN_OR_RETURN(layout.master_port, FreeTcpPort());
  } else {
    MeetingPlace place;
    place.address = context.rendezvous;
    place.ca_pem = context.rendezvous_ca;
    place.job_id = start.job_id();
    place.attempt = start.attempt();
    place.secret = start.rendezvous_secret();
    absl::StatusOr<PartsMet> met = MeetParts(place, layout.part, layout.parts,
                                             context.host, kLaunchMeetTimeout);
    if (!met.ok()) {
      return Annotate(
          met.status(),
          "meeting the job's other parts for launch: " + layout.mode);
    }
    layout.hosts = std::move(met->hosts);
    layout.master_port = met->master_port;
  }
  ASSIGN_OR_RETURN(std::vector<RankEnv> ranks, LaunchRanks(layout));
  std::vector<SubprocessOptions::RankProcess> out;
  for (RankEnv& r : ranks) {
    SubprocessOptions::RankProcess p;
    p.rank = r.rank;
    for (auto& [name, value] : r.env) {
      // The job's own env: may choose its threads, as under torchrun.
      if (name == "OMP_NUM_THREADS" && start.spec().env().count(name)) continue;
      p.env.emplace_back(std::move(name), std::move(value));
    }
    out.push_back(std::move(p));
  }
  notes->push_back(absl::StrCat(
      "launch: ", layout.mode, ": part ", layout.part, " of ", layout.parts,
      " runs rank", out.size() > 1 ? "s " : " ", out.front().rank,
      out.size() > 1 ? absl::StrCat("-", out.back().rank) : "", " of ",
      layout.mode == kLaunchPerNode ? layout.parts : layout.pool,
      "; MASTER_ADDR=", layout.hosts[0], " MASTER_PORT=", layout.master_port));
  return out;
}

}  // namespace

absl::StatusOr<SubprocessOptions> PrepareJob(const v1::StartJob& start,
                                             const std::string& dir,
                                             const LaunchContext& context,
                                             BlobTransfers* transfers,
                                             std::vector<std::string>* notes) {
  const v1::JobSpec& spec = start.spec();
  const std::string out_dir = dir + "/output";
  std::optional<Account> owner;
  // A job with no owner named (the scheduler always names one) runs as the
  // worker's user.
  if (context.as_owner && !start.user().empty()) {
    ASSIGN_OR_RETURN(owner, LookUpOwner(start.user(), context.worker_name));
  } else if (!start.user().empty() && start.user() != context.worker_user) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", context.worker_name, " runs as ", context.worker_user,
        " and so runs only ", context.worker_user, "'s jobs, not ",
        start.user(), "'s; start it as root to run every user's jobs"));
  }
  RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MakeDirs(out_dir, 0755));
  for (const auto& a : spec.attach()) {
    RETURN_IF_ERROR(Annotate(
        transfers->Fetch(a.sha256(), a.size(), dir + "/" + a.path(), a.mode()),
        absl::StrCat("fetching attachment '", a.path(), "'")));
  }
  SubprocessOptions sp;
  if (spec.has_train()) {
    // A requeued attempt continues from the checkpoint an earlier one stored.
    for (const auto& f : start.checkpoint()) {
      RETURN_IF_ERROR(Annotate(
          transfers->Fetch(f.sha256(), f.size(), out_dir + "/" + f.path(),
                           0644),
          absl::StrCat("fetching the stored checkpoint's '", f.path(), "'")));
    }
    TrainLaunch launch;
    launch.trainer = context.trainer;
    launch.job_dir = dir;
    launch.output_dir = out_dir;
    launch.rendezvous = context.rendezvous;
    launch.rendezvous_ca = context.rendezvous_ca;
    // Ranks of a one-worker job talk over loopback.
    launch.host = start.parts() > 1 ? context.host : "127.0.0.1";
    launch.resume = start.checkpoint_size() > 0;
    launch.gpus = context.gpus;
    launch.stop_on_term = context.trainer_stop_on_term;
    RETURN_IF_ERROR(PrepareTrainCommand(start, launch, &sp));
    if (launch.resume) {
      notes->push_back(
          absl::StrCat("resuming from the stored checkpoint at iteration ",
                       start.checkpoint_iteration()));
    }
  } else {
    sp.argv.assign(spec.command().argv().begin(), spec.command().argv().end());
    sp.cwd = dir;
    AddCommandChannels(spec, dir, context, &sp);
    // $DLBATCH_CHECKPOINT_DIR, with the stored checkpoint laid out again
    // for an attempt that resumes (requeued, preempted, a worker lost).
    const std::string ckpt = absl::StrCat(dir, "/", JobTable::kCheckpointDir);
    RETURN_IF_ERROR(MakeDirs(ckpt, 0755));
    // Files first, links last: no path written here goes through a link.
    for (const auto& f : start.checkpoint()) {
      if (!f.symlink().empty()) continue;
      const std::string to = absl::StrCat(ckpt, "/", f.path());
      RETURN_IF_ERROR(MakeDirs(to.substr(0, to.rfind('/')), 0755));
      RETURN_IF_ERROR(Annotate(
          transfers->Fetch(f.sha256(), f.size(), to, f.mode()),
          absl::StrCat("fetching the stored checkpoint's '", f.path(), "'")));
    }
    for (const auto& f : start.checkpoint()) {
      if (f.symlink().empty()) continue;
      const std::string to = absl::StrCat(ckpt, "/", f.path());
      RETURN_IF_ERROR(MakeDirs(to.substr(0, to.rfind('/')), 0755));
      if (::symlink(f.symlink().c_str(), to.c_str()) != 0)
        return ErrnoStatus(errno, "symlink", to);
    }
    sp.env.emplace_back("DLBATCH_CHECKPOINT_DIR", ckpt);
    if (start.checkpoint_size() > 0) {
      sp.env.emplace_back("DLBATCH_RESUMED_FROM",
                          absl::StrCat(start.checkpoint_iteration()));
      notes->push_back(absl::StrCat(
          "resuming from the stored checkpoint of step ",
          start.checkpoint_iteration(), " in $DLBATCH_CHECKPOINT_DIR"));
    }
    if (!spec.launch().empty()) {
      ASSIGN_OR_RETURN(sp.ranks, LaunchProcesses(start, context, notes));
    }
  }
  std::string visible;
  if (context.gpus) {
    absl::StatusOr<std::string> v =
        ChildVisibleDevices(start.devices(), context.visible_devices);
    if (!v.ok()) return v.status();
    visible = *std::move(v);
  }
  sp.env.insert(
      sp.env.begin(),
      {
          {"DLBATCH_JOB_ID", absl::StrCat(start.job_id())},
          {"DLBATCH_ATTEMPT", absl::StrCat(start.attempt())},
          {"DLBATCH_POOL", absl::StrCat(start.pool())},
          {"DLBATCH_PART", absl::StrCat(start.part())},
          {"DLBATCH_PARTS", absl::StrCat(std::max(1, start.parts()))},
          {"DLBATCH_DEVICES", absl::StrJoin(start.devices(), ",")},
          {"DLBATCH_OUTPUT_DIR", out_dir},
          // Exactly the job's GPUs (named as the worker's own
          // CUDA_VISIBLE_DEVICES names them); none on a worker of CPU slots.
          {"CUDA_VISIBLE_DEVICES", visible},
      });
  if (!context.gpus)
    sp.env.emplace_back("OMP_NUM_THREADS", absl::StrCat(start.devices_size()));
  if (owner) {
    sp.env.emplace_back("HOME", owner->home);
    sp.env.emplace_back("USER", start.user());
    sp.env.emplace_back("LOGNAME", start.user());
  }
  if (spec.has_array_task()) {  // a job of an array (submit --array)
    sp.env.emplace_back("DLBATCH_ARRAY_ID",
                        absl::StrCat(spec.array_task().id()));
    sp.env.emplace_back("DLBATCH_ARRAY_INDEX",
                        absl::StrCat(spec.array_task().index()));
  }
  const bool as_root = owner ? owner->id.uid == 0 : ::geteuid() == 0;
  for (const auto& [k, v] : spec.env()) {
    if (as_root &&
        (absl::StartsWith(k, "LD_") || k == "BASH_ENV" || k == "ENV")) {
      return absl::PermissionDeniedError(absl::StrCat(
          "env: may not set ", k,
          " for a job run as root: the loader or a shell would run code "
          "of the job's choosing with root's powers; remove it"));
    }
    // The module stays importable beside the job's own folders.
    if (k == "PYTHONPATH" && !spec.has_train() && !context.python_dir.empty()) {
      sp.env.emplace_back(k, absl::StrCat(v, ":", context.python_dir));
      continue;
    }
    sp.env.emplace_back(k, v);
  }
  sp.clean_env = true;
  sp.keep_env = context.keep_env;
  if (owner && owner->id.uid != 0) {
    // Its owner passes through the worker's folders (which list nothing to
    // it) to the job's folder, which is its owner's alone, everything in it
    // included.
    const std::string jobs = dir.substr(0, dir.rfind('/'));
    const std::string work = jobs.substr(0, jobs.rfind('/'));
    struct stat st;
    if (::stat(work.c_str(), &st) == 0 && (st.st_mode & 0011) != 0011) {
      ::chmod(work.c_str(), (st.st_mode & 07777) | 0011);
    }
    if (::chmod(jobs.c_str(), 0711) != 0) {
      return ErrnoStatus(errno, "chmod", jobs);
    }
    RETURN_IF_ERROR(GiveTree(dir, owner->id));
    if (::chmod(dir.c_str(), 0700) != 0)
      return ErrnoStatus(errno, "chmod", dir);
    sp.run_as = owner->id;
  }
  return sp;
}

}  // namespace dlbatch::worker
