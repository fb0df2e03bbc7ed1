#include "common/helper_thread.h"

#include <utility>

namespace dlbatch {

HelperThread::~HelperThread() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !task_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HelperThread::Run(std::function<void()> task) {
  std::call_once(started_,
                 [this] { thread_ = std::thread([this] { Loop(); }); });
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !task_; });
    task_ = std::move(task);
  }
  cv_.notify_all();
}

void HelperThread::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !task_; });
}

void HelperThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || task_; });
    if (!task_) return;  // stopping, nothing left to run
    std::function<void()> task = task_;
    lock.unlock();
    task();
    lock.lock();
    task_ = nullptr;
    cv_.notify_all();
  }
}

}  // namespace dlbatch
