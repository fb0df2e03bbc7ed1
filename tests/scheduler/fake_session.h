// The scheduler's end of a worker stream, without gRPC: records what the
// scheduler sends so tests can wait for and inspect it.
#ifndef DLBATCH_TESTS_SCHEDULER_FAKE_SESSION_H_
#define DLBATCH_TESTS_SCHEDULER_FAKE_SESSION_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "scheduler/scheduler.h"

namespace dlbatch::scheduler {

// Thread-safe: the scheduler sends from its loop thread and client calls
// while the test reads.
class FakeSession final : public WorkerSession {
 public:
  using Predicate = std::function<bool(const v1::SchedulerMessage&)>;

  void Send(const v1::SchedulerMessage& message) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(message);
  }
  void Close(const std::string& why) override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    close_reason_ = why;
  }

  // Every message sent so far, in order.
  std::vector<v1::SchedulerMessage> Messages() const {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  // The messages sent so far that match `pred`, in order.
  std::vector<v1::SchedulerMessage> Matching(const Predicate& pred) const {
    absl::MutexLock lock(&mu_);
    std::vector<v1::SchedulerMessage> out;
    for (const auto& m : messages_) {
      if (pred(m)) out.push_back(m);
    }
    return out;
  }
  // The first message (sent so far or within `timeout` of real time) that
  // matches `pred`; nullopt if none came.
  std::optional<v1::SchedulerMessage> WaitFor(
      const Predicate& pred, absl::Duration timeout = absl::Seconds(5)) const {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        for (const auto& m : messages_) {
          if (pred(m)) return m;
        }
      }
      if (absl::Now() >= deadline) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  std::string close_reason() const {
    absl::MutexLock lock(&mu_);
    return close_reason_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::SchedulerMessage> messages_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string close_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_TESTS_SCHEDULER_FAKE_SESSION_H_
