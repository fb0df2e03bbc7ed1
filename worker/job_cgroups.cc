#include "worker/job_cgroups.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace dlbatch::worker {
namespace {

// Reads the whole of a small file (a /proc or cgroup file), up to about
// `max` bytes, into `out`; false if it could not be opened or read.
bool ReadSmallFile(const std::string& path, std::string* out,
                   size_t max = 1 << 20) {
  out->clear();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8192];
  bool ok = true;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() >= max) break;
  }
  close(fd);
  return ok;
}

// The whole of a small file, or "" if unreadable.
std::string Slurp(const std::string& path, size_t max = 1 << 20) {
  std::string out;
  ReadSmallFile(path, &out, max);
  return out;
}

bool WriteString(const std::string& path, absl::string_view text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = write(fd, text.data(), text.size());
  close(fd);
  return n == static_cast<ssize_t>(text.size());
}

void SleepMs(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

// Whether /proc/PID/stat names a live process of user space: not a zombie,
// not a kernel thread (PF_KTHREAD), neither of which has an environment.
bool LiveUserProcess(pid_t pid) {
  const std::string stat = Slurp(absl::StrCat("/proc/", pid, "/stat"), 4096);
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags ..."; comm may
  // hold spaces and parentheses.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  char state = 0;
  unsigned flags = 0;
  if (sscanf(stat.c_str() + paren + 1, " %c %*d %*d %*d %*d %*d %u", &state,
             &flags) != 2) {
    return false;
  }
  constexpr unsigned kKernelThread = 0x00200000;  // PF_KTHREAD
  return state != 'Z' && state != 'X' && (flags & kKernelThread) == 0;
}

// The environment of `pid` as /proc shows it ("" if it cannot be read). A
// process in the middle of execve shows none until the new image's is set
// up (47 of 90,000 reads of a process exec'ing, measured here), which would
// let a job's process that is exec'ing at the moment of a scan escape it:
// an empty read of a live process of user space is read again, 1 ms apart,
// while `*retries` (the scan's budget, so that processes started with an
// empty environment cannot make a scan slow) lasts.
std::string ReadEnviron(pid_t pid, int* retries) {
  const std::string path = absl::StrCat("/proc/", pid, "/environ");
  std::string env;
  // A failed read is a process gone or not ours to read: not waited on.
  while (ReadSmallFile(path, &env) && env.empty() && *retries > 0 &&
         LiveUserProcess(pid)) {
    --*retries;
    SleepMs(1);
  }
  return env;
}

// Where the cgroup2 hierarchy is mounted, or "".
std::string Cgroup2Mount() {
  std::istringstream in(Slurp("/proc/self/mountinfo"));
  for (std::string line; std::getline(in, line);) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::vector<std::string> after = absl::StrSplit(line.substr(dash + 3), ' ');
    if (after.empty() || after[0] != "cgroup2") continue;
    std::vector<std::string> before = absl::StrSplit(line.substr(0, dash), ' ');
    if (before.size() >= 5) return before[4];
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> MakeCgroupRoot(const std::string& leaf) {
  const std::string mount = Cgroup2Mount();
  if (mount.empty()) {
    return absl::UnavailableError("no cgroup2 hierarchy is mounted");
  }
  std::string own;
  std::istringstream in(Slurp("/proc/self/cgroup"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("0::", 0) == 0) own = line.substr(3);
  }
  if (own.empty()) {
    return absl::UnavailableError(
        "/proc/self/cgroup names no cgroup2 cgroup of this process");
  }
  std::string base = mount + (own == "/" ? "" : own);
  std::string root = base + "/" + leaf;
  if (mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot make cgroup ", root,
                            " (run the worker as root, or under systemd with "
                            "Delegate=yes)"));
  }
  if (access((root + "/cgroup.procs").c_str(), W_OK) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot write ", root, "/cgroup.procs"));
  }
  return root;
}

std::vector<pid_t> CgroupProcs(const std::string& dir) {
  std::vector<pid_t> out;
  std::istringstream in(Slurp(dir + "/cgroup.procs"));
  for (long pid; in >> pid;) out.push_back(static_cast<pid_t>(pid));
  return out;
}

bool KillCgroup(const std::string& dir) {
  if (WriteString(dir + "/cgroup.kill", "1")) return true;
  if (access(dir.c_str(), F_OK) != 0) return false;
  // Kernels before 5.14: a frozen cgroup cannot fork while it is emptied.
  bool frozen = WriteString(dir + "/cgroup.freeze", "1");
  for (pid_t pid : CgroupProcs(dir)) kill(pid, SIGKILL);
  if (frozen) WriteString(dir + "/cgroup.freeze", "0");
  return true;
}

int KillCgroupsUnder(const std::string& root) {
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> dirs;
  while (const struct dirent* e = readdir(d)) {
    if (e->d_type == DT_DIR && e->d_name[0] != '.')
      dirs.push_back(root + "/" + e->d_name);
  }
  closedir(d);
  int killed = 0;
  for (const std::string& dir : dirs) {
    // cgroup.kill takes the whole subtree; the folders go deepest first.
    killed += static_cast<int>(CgroupProcs(dir).size());
    KillCgroup(dir);
    killed += KillCgroupsUnder(dir);
    for (int round = 0; round < 200 && rmdir(dir.c_str()) != 0; ++round) {
      if (errno != EBUSY) break;
      KillCgroup(dir);
      SleepMs(10);
    }
  }
  return killed;
}

std::vector<pid_t> MarkedProcesses(const std::string& mark_prefix) {
  std::vector<pid_t> out;
  const std::string needle = absl::StrCat(kJobMarkVar, "=", mark_prefix);
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  const pid_t self = getpid();
  int retries = 20;  // ms a scan may wait on processes in execve
  while (const struct dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 1 || pid == self) continue;
    std::string env = ReadEnviron(static_cast<pid_t>(pid), &retries);
    for (absl::string_view entry : absl::StrSplit(env, '\0')) {
      if (absl::StartsWith(entry, needle)) {
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return out;
}

std::string DescribeProcesses(const std::vector<pid_t>& pids, size_t max) {
  std::string out;
  for (size_t i = 0; i < pids.size() && i < max; ++i) {
    std::string comm = Slurp(absl::StrCat("/proc/", pids[i], "/comm"));
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    absl::StrAppend(&out, i == 0 ? "" : ", ", comm.empty() ? "?" : comm,
                    " (pid ", pids[i], ")");
  }
  if (pids.size() > max)
    absl::StrAppend(&out, ", and ", pids.size() - max, " more");
  return out;
}

}  // namespace dlbatch::worker
