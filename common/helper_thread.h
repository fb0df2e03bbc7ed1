// One thread kept for its owner's background work, one task at a time:
// blob transfers hash and write each 4 MiB chunk beside the next one's
// receive, and starting a thread per chunk (std::async) cost a clone, a
// stack and a join 256 times a GiB on each side.
#ifndef DLBATCH_COMMON_HELPER_THREAD_H_
#define DLBATCH_COMMON_HELPER_THREAD_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace dlbatch {

// Thread-safe; tasks run one after another in the order Run handed them
// over. The thread starts on the first Run.
class HelperThread {
 public:
  HelperThread() = default;
  ~HelperThread();  // waits for the task in flight, then ends the thread
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Waits for the previous task, then runs `task` on the helper thread.
  void Run(std::function<void()> task);
  // Returns once no task is in flight.
  void Wait();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> task_;  // guarded by mu_; set while one is in flight
  bool stop_ = false;           // guarded by mu_
  std::once_flag started_;
  std::thread thread_;  // set once, under started_
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_HELPER_THREAD_H_
