#include "common/helper_thread.h"

#include <utility>

namespace dlbatch {

HelperThread::~HelperThread() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    AwaitIdle();
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void HelperThread::Run(std::function<void()> task) {
  std::call_once(started_,
                 [this] { thread_ = std::thread([this] { Loop(); }); });
  {
    absl::MutexLock lock(&mu_);
    AwaitIdle();
    task_ = std::move(task);
  }
  cv_.SignalAll();
}

void HelperThread::Wait() {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
}

void HelperThread::AwaitIdle() {
  mu_.AssertHeld();
  while (task_) cv_.Wait(&mu_);
}

void HelperThread::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    while (!stop_ && !task_) cv_.Wait(&mu_);
    if (!task_) return;  // stopping, nothing left to run
    std::function<void()> task = task_;
    mu_.Unlock();
    task();
    mu_.Lock();
    task_ = nullptr;
    cv_.SignalAll();
  }
}

}  // namespace dlbatch
