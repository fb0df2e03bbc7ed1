// What the benchmarks that start the real daemons share: a process started
// with its output in a log, a command run for its output, and a median.
#ifndef DLBATCH_BENCH_BENCH_PROC_H_
#define DLBATCH_BENCH_BENCH_PROC_H_

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace dlbatch::bench {

// In a forked child: runs argv, or exits 127.
[[noreturn]] inline void ExecOrExit(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

// Starts argv with stdout and stderr in `log` (truncated); its pid.
inline pid_t SpawnLogged(const std::vector<std::string>& argv,
                         const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    ExecOrExit(argv);
  }
  return pid;
}

// Runs argv to its end; its stdout (stderr to /dev/null) and exit status.
inline int Capture(const std::vector<std::string>& argv, std::string* out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    close(fds[0]);
    close(fds[1]);
    ExecOrExit(argv);
  }
  close(fds[1]);
  out->clear();
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out->append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2]
                      : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace dlbatch::bench

#endif  // DLBATCH_BENCH_BENCH_PROC_H_
