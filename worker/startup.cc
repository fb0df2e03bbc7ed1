#include "worker/startup.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"
#include "common/tls_client.h"
#include "common/version.h"
#include "spdlog/spdlog.h"
#include "worker/devices.h"
#include "worker/job_cgroups.h"
#include "worker/slurm_job.h"
#include "worker/subprocess.h"

namespace dlbatch::worker {
namespace {

// The cgroup of this run's jobs under the work folder's `base`. A previous
// run killed just now leaves a guard that removes the work folder's cgroup
// once empty: it may do so between MakeCgroupRoot and this mkdir, so a
// missing parent is made again.
absl::Status MakeRunCgroup(const std::string& root,
                           const std::string& folder_mark) {
  for (int tries = 0;; ++tries) {
    if (::mkdir(root.c_str(), 0755) == 0 || errno == EEXIST) {
      return absl::OkStatus();
    }
    const int err = errno;
    if (err == ENOENT && tries < 5 &&
        MakeCgroupRoot("dlbatch-" + folder_mark).ok()) {
      continue;
    }
    return absl::InternalError(
        absl::StrCat("cannot make cgroup ", root, ": ", std::strerror(err)));
  }
}

// The dlbatch-train beside this program, unless --trainer names one.
std::string TrainerPath(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (ec ? std::filesystem::path("dlbatch-train")
             : self.parent_path() / "dlbatch-train")
      .string();
}

// The `dlbatch` Python module shipped with this program: SHARE/python,
// SHARE being ../share/dlbatch from the program's folder (the build tree
// and an installed package alike); "" where it is not there.
std::string PythonModuleDir() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto dir =
      self.parent_path().parent_path() / "share" / "dlbatch" / "python";
  return std::filesystem::exists(dir / "dlbatch" / "__init__.py", ec)
             ? dir.lexically_normal().string()
             : "";
}

}  // namespace

absl::Status CheckSchedulerTls(const DaemonOptions& options) {
  if (options.slurm && !options.slurm->ca_pem.empty()) return absl::OkStatus();
  absl::Status s = ProbeTls(options.channel, 5000);
  return absl::IsFailedPrecondition(s) ? s : absl::OkStatus();
}

absl::StatusOr<HostSetup> PrepareHost(const DaemonOptions& options) {
  HostSetup host;
  RETURN_IF_ERROR(MakeDirs(options.work_dir + "/jobs", 0700));
  host.work_dir =
      std::filesystem::absolute(options.work_dir).lexically_normal().string();
  const std::string& work_dir = host.work_dir;
  // Never closed: the lock lasts as long as the process.
  int lock_fd = ::open((work_dir + "/worker.lock").c_str(),
                       O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another worker uses ", work_dir, "; give each its own --work-dir"));
  }
  // Every process of a job is found by a mark in its environment (this work
  // folder's, then this run's) and, where the worker can make cgroups, by
  // its job's cgroup.
  const std::string folder_mark = Sha256Hex(work_dir).substr(0, 12);
  host.guard.mark_prefix = absl::StrCat(folder_mark, "-", ::getpid(), ":");
  std::string cgroup_base;
  if (!options.flags.no_cgroups) {
    auto base = MakeCgroupRoot("dlbatch-" + folder_mark);
    if (base.ok()) {
      cgroup_base = *base;
    } else {
      spdlog::warn("{}; running jobs without cgroups",
                   std::string(base.status().message()));
    }
  }
  // Jobs a previous run of this worker left behind are stale now: their
  // attempts were requeued when it was lost. A Slurm job's worker folder
  // is its own (SlurmWorkDir): no earlier run had it, so the scans of
  // every process on the node are skipped.
  int stale = 0;
  if (!options.slurm) {
    stale += KillProcessesUnder(work_dir + "/jobs");
    if (!cgroup_base.empty()) stale += KillCgroupsUnder(cgroup_base);
    stale += KillWorkerJobs({"", folder_mark + "-"}, 2000);
  }
  if (stale > 0) {
    spdlog::warn("killed {} process(es) of jobs a previous worker left behind",
                 stale);
  }
  if (!cgroup_base.empty()) {
    host.guard.cgroup_root = absl::StrCat(cgroup_base, "/w", ::getpid());
    RETURN_IF_ERROR(MakeRunCgroup(host.guard.cgroup_root, folder_mark));
    spdlog::info("keeping each job in a cgroup under {}",
                 host.guard.cgroup_root);
  } else {
    spdlog::info(
        "running jobs without cgroups: a job's processes are found by their "
        "process group, descent and environment");
  }
  ASSIGN_OR_RETURN(host.job_guard, StartJobGuard(host.guard));
  (void)RemoveTree(work_dir + "/jobs");
  (void)MakeDirs(work_dir + "/jobs", 0700);
  return host;
}

WorkerOptions MakeWorkerOptions(const DaemonOptions& options,
                                const HostSetup& host) {
  const WorkerFlags& f = options.flags;
  WorkerOptions o;
  o.channel = options.channel;
  char host_name[256] = {0};
  ::gethostname(host_name, sizeof host_name - 1);
  o.host = f.host.empty() ? std::string(host_name) : f.host;
  o.trainer = TrainerPath(f.trainer);
  o.python_dir = PythonModuleDir();
  if (::access(o.trainer.c_str(), X_OK) != 0) {
    spdlog::warn(
        "{} is not an executable; train: jobs will fail until it is "
        "(--trainer)",
        o.trainer);
  }
  o.job_env = f.job_env;
  o.name = f.name.empty() ? absl::StrCat(host_name, "-",
                                         Sha256Hex(host.work_dir).substr(0, 8))
                          : f.name;
  o.profile = f.profile;
  o.work_dir = host.work_dir;
  o.keep_job_dirs = f.keep_job_dirs;
  o.version =
      f.report_version.empty() ? std::string(Version()) : f.report_version;
  const std::optional<SlurmJobContext>& slurm = options.slurm;
  std::string note;
  // Where Slurm names the GPUs it gave, they are offered as Slurm gave them
  // (ApplySlurmJob) without the CUDA runtime's probe, which initialises
  // the driver: a large part of an ephemeral worker's start on GPU nodes.
  const bool slurm_names_gpus = slurm && slurm->gpus > 0;
  if (!slurm_names_gpus) {
    if (!f.no_gpus && f.cpu_slots == 0) o.devices = DiscoverGpus(&note);
    if (o.devices.empty()) {
      int slots = f.cpu_slots > 0 ? f.cpu_slots : UsableCores();
      o.devices = CpuSlots(slots);
      spdlog::info("offering {} CPU slots{}", slots,
                   note.empty() ? "" : " (" + note + ")");
    } else {
      spdlog::info("offering {} GPUs{}", o.devices.size(),
                   note.empty() ? "" : " (" + note + ")");
    }
  }
  if (slurm) {
    // Without GPUs, the CPUs Slurm gave the node are its slots (unless
    // --cpu-slots says otherwise).
    ApplySlurmJob(
        *slurm, o.devices,
        f.cpu_slots > 0 ? f.cpu_slots : SlurmCpuSlots(*slurm, UsableCores()),
        &o);
    spdlog::info(
        "Slurm job {}, node {} of {}: serving dlbatch job {} attempt {} only "
        "as '{}' with {} slots",
        slurm->job.slurm_job_id(), slurm->job.node_index() + 1,
        slurm->job.nodes(), slurm->job.job_id(), slurm->job.attempt(), o.name,
        o.devices.size());
  }
  return o;
}

}  // namespace dlbatch::worker
