// Starting and stopping a job's processes, behind an interface so the
// worker's core is tested with a fake (ninja's CommandRunner).
#ifndef DLBATCH_WORKER_PROCESS_RUNNER_H_
#define DLBATCH_WORKER_PROCESS_RUNNER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "worker/subprocess.h"

namespace dlbatch::worker {

// What a runner reports, each for a key it was given in Start(). Called on
// the runner's own thread, one call at a time; for one key in the order
// Started, Line..., Exited (Exited only after Started with OK).
class ProcessEvents {
 public:
  virtual ~ProcessEvents() = default;
  virtual void ProcessStarted(int64_t key, absl::Status status) = 0;
  virtual void ProcessLine(int64_t key, const OutputLine& line) = 0;
  // Every process of the job is gone (the slots may be freed).
  virtual void ProcessExited(int64_t key, const ExitInfo& info) = 0;
};

class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  // REQUIRES: called once, before Start(). `events` outlives the runner's
  // use of it (until Shutdown()).
  virtual void Attach(ProcessEvents* events) = 0;
  // Starts a job's processes under `key` (unused): options' argv, or one
  // process per entry of options.ranks, all within the job's containment;
  // Terminate reaches every one, lines carry each one's rank, and the job
  // has Exited once all have. The first of several to fail is the job's
  // end (its rank in the ExitInfo) and the others are stopped then (a
  // collective would wait on the lost rank forever). Thread-safe; the
  // result arrives as ProcessStarted.
  virtual void Start(int64_t key, SubprocessOptions options) = 0;
  // `signal` (SIGTERM, or a preempted job's stop signal) to every process
  // of the job now, KILL after grace_ms. Unknown keys are ignored.
  // Thread-safe.
  virtual void Terminate(int64_t key, int signal, int64_t grace_ms) = 0;
  // Kills every job and stops reporting: once it returns no event is being
  // delivered nor will be. Thread-safe, idempotent; never called from an
  // event.
  virtual void Shutdown() = 0;
};

// How the real runner keeps track of every process of a job.
struct JobContainment {
  // Non-empty: each job gets the cgroup CGROUP_ROOT/job-<key>.
  std::string cgroup_root;
  // Each job's processes carry kJobMarkVar=<mark_prefix><key>/. A job of
  // several processes has the cgroup's folder rank-<rank> for each, and
  // each's mark goes on with <rank>/, so that one process's end takes only
  // its own with it.
  std::string mark_prefix;
};

// The real runner: a thread that owns a SubprocessSet and runs its poll
// loop. Jobs' processes die with this thread (SubprocessOptions'
// die_with_parent) and are killed when it is shut down.
class SubprocessRunner final : public ProcessRunner {
 public:
  explicit SubprocessRunner(const Clock* clock,
                            JobContainment containment = {});
  ~SubprocessRunner() override;  // Shutdown()s and joins

  void Attach(ProcessEvents* events) override;
  void Start(int64_t key, SubprocessOptions options) override;
  void Terminate(int64_t key, int signal, int64_t grace_ms) override;
  void Shutdown() override;

 private:
  // The processes of a job that has several (SubprocessOptions::ranks),
  // each in the set under a key of its own.
  struct RankGroup {
    std::map<int64_t, int> live;  // set key -> rank
    std::string cgroup;           // the job's; each rank's is inside it
    std::optional<absl::Status> start_error;
    std::optional<ExitInfo> failed;  // the first to fail
    ExitInfo end;                    // what the job's end reports
    bool stopping = false;           // Terminate()d, or a rank failed
  };
  void Loop();
  void Post(std::function<void()> command);
  void StartRanks(int64_t key, SubprocessOptions options);
  void LineOf(int64_t set_key, const OutputLine& line);
  void ExitOf(int64_t set_key, const ExitInfo& info);

  const Clock* const clock_;
  const JobContainment containment_;
  ProcessEvents* events_ = nullptr;
  std::unique_ptr<SubprocessSet> set_;  // the loop thread's only
  // The loop thread's only: jobs of several processes by key, which job
  // each of their set keys belongs to, and the next such set key (negative,
  // so never a job's key).
  std::map<int64_t, RankGroup> groups_;
  std::map<int64_t, int64_t> rank_jobs_;
  int64_t next_rank_key_ = -1;

  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Two threads may shut the runner down at once; the loop thread must be
  // joined exactly once (a second pthread_join of a joined thread waits
  // forever on glibc).
  absl::Mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_PROCESS_RUNNER_H_
