// One thread kept for its owner's background work, one task at a time:
// blob transfers hash and write each 4 MiB chunk beside the next one's
// receive, and starting a thread per chunk (std::async) cost a clone, a
// stack and a join 256 times a GiB on each side.
#ifndef DLBATCH_COMMON_HELPER_THREAD_H_
#define DLBATCH_COMMON_HELPER_THREAD_H_

#include <functional>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch {

// Thread-safe; tasks run one after another in the order Run handed them
// over. The thread starts on the first Run.
class HelperThread {
 public:
  HelperThread() = default;
  ~HelperThread() ABSL_LOCKS_EXCLUDED(
      mu_);  // waits for the task in flight, then ends the thread
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Waits for the previous task, then runs `task` on the helper thread.
  void Run(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once no task is in flight.
  void Wait() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once no task is in flight; mu_ stays held.
  void AwaitIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;                                 // task_ or stop_ changed
  std::function<void()> task_ ABSL_GUARDED_BY(mu_);  // set while in flight
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::once_flag started_;
  std::thread thread_;  // set once, under started_
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_HELPER_THREAD_H_
