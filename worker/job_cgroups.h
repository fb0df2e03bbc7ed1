// Where a worker keeps each job's processes so that none escapes it: a
// cgroup v2 folder per job (setsid and double forks do not leave a cgroup,
// and cgroup.kill kills everything in it at once, stopped processes
// included), and a mark in every job process's environment for machines
// where the worker cannot make cgroups.
#ifndef DLBATCH_WORKER_JOB_CGROUPS_H_
#define DLBATCH_WORKER_JOB_CGROUPS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlbatch::worker {

// The environment variable that marks a job's processes:
// DLBATCH_JOB_MARK=<worker mark>:<job key>.
inline constexpr char kJobMarkVar[] = "DLBATCH_JOB_MARK";

// Finds a folder under which this process may make cgroups: its own cgroup
// in the cgroup2 hierarchy (from /proc/self/cgroup and /proc/self/mountinfo;
// under systemd, a unit with Delegate=yes), where a test mkdir succeeds.
// Returns the folder to hold this worker's job cgroups, `leaf` inside it
// (made), or an error saying why none can be used.
absl::StatusOr<std::string> MakeCgroupRoot(const std::string& leaf);

// The pids in cgroup `dir` (cgroup.procs); empty if it is gone.
std::vector<pid_t> CgroupProcs(const std::string& dir);
// Kills every process of cgroup `dir`: cgroup.kill where the kernel has it
// (5.14+), else freeze, SIGKILL each, thaw. False if `dir` is unusable.
bool KillCgroup(const std::string& dir);
// Kills and removes every cgroup folder under `root`, however deep (jobs a
// previous run left behind). Returns how many processes were in them.
int KillCgroupsUnder(const std::string& root);

// Pids (other than this process) whose environment holds
// `kJobMarkVar`=`mark_prefix`... (read from /proc/<pid>/environ).
std::vector<pid_t> MarkedProcesses(const std::string& mark_prefix);

// "name (pid N)" for each pid, from /proc/<pid>/comm; at most `max` named,
// then ", and N more".
std::string DescribeProcesses(const std::vector<pid_t>& pids, size_t max = 8);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_CGROUPS_H_
