// Job processes (ninja's Subprocess/SubprocessSet): each started in its own
// process group with stdin from /dev/null and every other descriptor closed,
// its stdout and stderr read line by line by one poll loop.
//
// A subprocess is *done* only when its leader has exited, every process of
// it has exited (its cgroup's, or its group's, its leader's descendants and
// those carrying its mark), and its pipes are drained, so the last lines of a
// job that prints and exits at once are never lost and a job's slots are never
// freed while one of its processes lives. The set makes the calling process
// a child subreaper so that orphaned grandchildren are reaped here too.
#ifndef DLBATCH_WORKER_SUBPROCESS_H_
#define DLBATCH_WORKER_SUBPROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace dlbatch::worker {

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH
  std::string cwd;                // must exist
  // Added to (or replacing in) the calling process's environment, or with
  // `clean_env` to only its variables named in `keep_env`.
  std::vector<std::pair<std::string, std::string>> env;
  bool clean_env = false;
  std::vector<std::string> keep_env;
  // Set: the child takes this user's identity (supplementary groups, group,
  // then user) after joining its cgroup and before anything of the job
  // runs. Needs the caller to be root.
  struct Identity {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
  };
  std::optional<Identity> run_as;
  // After the leader exits, how long remaining group members and pipe
  // writers may linger before the group is killed.
  int64_t linger_ms = 2000;
  // Longer lines are split into pieces of this size.
  size_t max_line_bytes = 64 * 1024;
  // The job's global rank this process's output is labelled with: every
  // line it delivers carries it (OutputLine::rank), so that a job's part
  // that starts several processes, each its own stdout and stderr, tells
  // their lines apart in the diary; its end (ExitInfo::rank) carries it
  // too. -1: none given, a part's one program (the job table labels its
  // lines with its part's rank, PartRank in job_table.h).
  int rank = -1;
  // The leader gets SIGKILL when the thread that started it ends (the
  // worker died): a job must not run on unsupervised.
  bool die_with_parent = true;
  // Opens a third pipe as the child's descriptor 3 (a structured channel,
  // e.g. the trainer's JSON-lines progress); its lines arrive as stream 3.
  bool channel = false;
  // With `channel`, non-empty: the channel is a FIFO made at this path
  // (anything there is replaced; owned by run_as's user, mode 0600), so
  // that the job's processes may also open it by name however they close
  // descriptors. The set holds it open for writing too, so it never ends
  // before the job does, and reads what is left once the job is gone.
  std::string channel_fifo;
  // Non-empty: a cgroup v2 folder (made by the caller, empty) that the
  // child joins before exec; the job's processes are then exactly the
  // cgroup's, however they fork or setsid, and it is removed once empty.
  std::string cgroup;
  // Where there is no cgroup: the value of kJobMarkVar in the job's
  // environment (the caller adds it), by which processes that left the
  // process group (setsid, double forks) are still found.
  std::string mark;
  // A part of several processes (launch: per-node or per-slot): one per
  // entry, each these options with its entry's `env` after `env` and its
  // `rank`, each a subprocess of its own (its own streams, its own group)
  // inside the job's one containment. Empty: the one process of `argv`.
  // ProcessRunner starts them; SubprocessSet runs one process and ignores
  // this.
  struct RankProcess {
    int rank = 0;
    std::vector<std::pair<std::string, std::string>> env;
  };
  std::vector<RankProcess> ranks;
};

struct OutputLine {
  int stream = 1;  // 1 stdout, 2 stderr, 3 the channel (descriptor 3)
  int rank = -1;   // its process's SubprocessOptions::rank
  int64_t time_ms = 0;
  std::string text;  // without its ending
  // What followed `text` in the output: "\n", "\r\n", or nothing (the
  // stream's last bytes, or a piece of a line longer than the cap, which
  // the next piece continues). The text and the endings of a stream's
  // lines, in order, are exactly its bytes.
  enum Ending { kNewline, kCrlf, kNone };
  Ending ending = kNewline;
};

struct ExitInfo {
  bool exited = false;  // normal exit (exit_code valid)
  int exit_code = -1;
  int term_signal = 0;              // signal that killed the leader, or 0
  bool killed_after_grace = false;  // SIGKILL was needed
  int leftover_killed = 0;          // processes killed after the leader exited
  // What those were, "name (pid N), ..." (may be cut short).
  std::string leftover_names;
  // The process whose end this is (SubprocessOptions::rank): of a part of
  // several, the first that failed, or -1.
  int rank = -1;
  // "exit code 3", "killed by signal 9 (Killed)"; with a rank, "rank 1:
  // exit code 3".
  std::string Describe() const;
};

// Owns the running subprocesses. All methods are called from one thread
// (the worker's job loop) except Wake(), which any thread may call.
class SubprocessSet {
 public:
  using Key = int64_t;
  using LineSink = std::function<void(Key, const OutputLine&)>;
  using ExitSink = std::function<void(Key, const ExitInfo&)>;

  // `clock` must outlive the set.
  SubprocessSet(const Clock* clock, LineSink on_line, ExitSink on_exit);
  ~SubprocessSet();  // kills and reaps whatever still runs
  SubprocessSet(const SubprocessSet&) = delete;
  SubprocessSet& operator=(const SubprocessSet&) = delete;

  // Starts argv; `key` names it in the callbacks and must be unused. A
  // program that cannot be executed (not found, not executable) is an error
  // here, not a child that exits 127.
  absl::StatusOr<pid_t> Start(Key key, const SubprocessOptions& options);

  // `signal` (SIGTERM, or a preempted job's stop signal), then SIGCONT so
  // that stopped ones see it, to every process of the job now (its group,
  // its cgroup's or its marked processes, setsid'd ones included); SIGKILL
  // to every one after grace_ms if any is still alive. A second call sends
  // its signal too and keeps the earlier kill time. Unknown keys are
  // ignored.
  void Terminate(Key key, int signal, int64_t grace_ms);

  // Waits up to timeout_ms for output, exits or timers, delivering lines and
  // exits through the sinks (on this thread). Returns early on Wake().
  void Poll(int64_t timeout_ms);
  // Makes a Poll in progress return. Thread-safe.
  void Wake();

  // SIGKILLs every process of every subprocess now (reaped by Poll or the
  // destructor).
  void KillAll();

  size_t running() const;
  bool IsRunning(Key key) const;

 private:
  struct Proc;
  void ReapChildren();
  void ReadPipe(Proc* proc, int stream_index);
  void FlushPartial(Proc* proc, int stream_index);
  void Advance(Proc* proc);
  // The job's live (not zombie) processes.
  std::vector<pid_t> Members(const Proc& proc) const;
  void SignalMembers(const Proc& proc, int sig);
  void KillMembers(const Proc& proc);
  void NoteLeftovers(Proc* proc, const std::vector<pid_t>& live);

  const Clock* clock_;
  LineSink on_line_;
  ExitSink on_exit_;
  int wake_fds_[2] = {-1, -1};
  std::map<Key, std::unique_ptr<Proc>> procs_;
};

// True if any process of group `pgid` exists (zombies included).
bool ProcessGroupAlive(pid_t pgid);

// SIGKILLs every process whose working folder lies under `dir` (processes of
// jobs a previous worker left behind). Returns how many it signalled.
int KillProcessesUnder(const std::string& dir);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_SUBPROCESS_H_
