// Fakes for the worker's collaborators: a process runner the test drives by
// hand, transfers that succeed (or wait on a gate), and a transport whose
// streams the test answers as the scheduler would.
#ifndef DLBATCH_TESTS_WORKER_WORKER_FAKES_H_
#define DLBATCH_TESTS_WORKER_WORKER_FAKES_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "worker/blob_transfers.h"
#include "worker/process_runner.h"
#include "worker/scheduler_link.h"

namespace dlbatch::worker {

// Waits up to `timeout` of real time for `ready`.
inline bool Eventually(const std::function<bool()>& ready,
                       absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!ready()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Records what the worker asks; the test reports starts, lines and exits
// (on its own thread, as the one runner thread would).
class FakeRunner final : public ProcessRunner {
 public:
  void Attach(ProcessEvents* events) override { events_ = events; }
  void Start(int64_t key, SubprocessOptions options) override {
    absl::MutexLock lock(&mu_);
    starts_.emplace_back(key, std::move(options));
  }
  void Terminate(int64_t key, int signal, int64_t grace_ms) override {
    absl::MutexLock lock(&mu_);
    terminates_.emplace_back(key, grace_ms);
    terminate_signals_.push_back(signal);
  }
  // Counts the call, then waits while the shutdown gate is closed.
  void Shutdown() override {
    absl::MutexLock lock(&mu_);
    ++shutdowns_;
    mu_.Await(absl::Condition(&shutdown_open_));
  }
  void SetShutdownOpen(bool open) {
    absl::MutexLock lock(&mu_);
    shutdown_open_ = open;
  }
  int shutdowns() {
    absl::MutexLock lock(&mu_);
    return shutdowns_;
  }

  // The key of the start whose environment names `job_id`, once asked for.
  std::optional<int64_t> WaitStart(int64_t job_id) {
    std::optional<int64_t> key;
    Eventually([&] {
      absl::MutexLock lock(&mu_);
      for (const auto& [k, o] : starts_) {
        for (const auto& [name, value] : o.env) {
          if (name == "DLBATCH_JOB_ID" && value == std::to_string(job_id))
            key = k;
        }
      }
      return key.has_value();
    });
    return key;
  }
  SubprocessOptions Options(int64_t key) {
    absl::MutexLock lock(&mu_);
    for (const auto& [k, o] : starts_) {
      if (k == key) return o;
    }
    return {};
  }
  size_t starts() {
    absl::MutexLock lock(&mu_);
    return starts_.size();
  }
  std::vector<std::pair<int64_t, int64_t>> terminates() {
    absl::MutexLock lock(&mu_);
    return terminates_;
  }
  // The first signal of each terminate, in order.
  std::vector<int> terminate_signals() {
    absl::MutexLock lock(&mu_);
    return terminate_signals_;
  }

  void Started(int64_t key, absl::Status s = absl::OkStatus()) {
    events_->ProcessStarted(key, std::move(s));
  }
  void Line(int64_t key, int stream, const std::string& text) {
    OutputLine line;
    line.stream = stream;
    line.time_ms = 1;
    line.text = text;
    events_->ProcessLine(key, line);
  }
  void Exit(int64_t key, int code) {
    ExitInfo info;
    info.exited = true;
    info.exit_code = code;
    events_->ProcessExited(key, info);
  }
  void Killed(int64_t key, int signal) {
    ExitInfo info;
    info.term_signal = signal;
    events_->ProcessExited(key, info);
  }

 private:
  ProcessEvents* events_ = nullptr;
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, SubprocessOptions>> starts_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> terminates_ ABSL_GUARDED_BY(mu_);
  std::vector<int> terminate_signals_ ABSL_GUARDED_BY(mu_);
  int shutdowns_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_open_ ABSL_GUARDED_BY(mu_) = true;
};

// Transfers that succeed at once; a closed gate holds fetches, output
// uploads or checkpoint files until opened.
class FakeTransfers final : public BlobTransfers {
 public:
  absl::Status Fetch(const std::string&, int64_t, const std::string&,
                     uint32_t) override {
    return Wait(&fetch_open_);
  }
  absl::StatusOr<v1::OutputFile> UploadFile(const std::string&,
                                            const std::string& rel) override {
    RETURN_IF_ERROR(Wait(&file_open_));
    v1::OutputFile f;
    f.set_path(rel);
    f.set_sha256("00");
    return f;
  }
  absl::StatusOr<std::vector<v1::OutputFile>> UploadOutputs(
      const std::string& dir, int64_t, std::vector<std::string>*) override {
    {
      absl::MutexLock lock(&mu_);
      uploads_.push_back(dir);
    }
    RETURN_IF_ERROR(Wait(&upload_open_));
    {
      // Uploads of a folder naming `held_` wait until it is released.
      absl::MutexLock lock(&mu_);
      auto released = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopped_ || held_.empty() ||
               dir.find(held_) == std::string::npos;
      };
      mu_.Await(absl::Condition(&released));
      if (stopped_) return absl::CancelledError("stopping");
    }
    v1::OutputFile f;
    f.set_path("result.txt");
    f.set_sha256("ab");
    f.set_size(3);
    return std::vector<v1::OutputFile>{f};
  }
  void Stop() override {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  void SetFetchOpen(bool open) {
    absl::MutexLock lock(&mu_);
    fetch_open_ = open;
  }
  // Holds the output uploads of folders containing `part` ("": none).
  void HoldUploadsOf(const std::string& part) {
    absl::MutexLock lock(&mu_);
    held_ = part;
  }
  void SetUploadOpen(bool open) {
    absl::MutexLock lock(&mu_);
    upload_open_ = open;
  }
  // Holds UploadFile (a checkpoint's files) while closed.
  void SetFileOpen(bool open) {
    absl::MutexLock lock(&mu_);
    file_open_ = open;
  }
  size_t uploads() {
    absl::MutexLock lock(&mu_);
    return uploads_.size();
  }

 private:
  absl::Status Wait(bool* open) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return *open || stopped_;
    };
    mu_.Await(absl::Condition(&ready));
    if (stopped_) return absl::CancelledError("stopping");
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  bool fetch_open_ ABSL_GUARDED_BY(mu_) = true;
  bool upload_open_ ABSL_GUARDED_BY(mu_) = true;
  bool file_open_ ABSL_GUARDED_BY(mu_) = true;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> uploads_ ABSL_GUARDED_BY(mu_);
  std::string held_ ABSL_GUARDED_BY(mu_);
};

// The scheduler's end of the worker's streams: answers a Register with
// Registered, records everything written (with the connection it came on),
// and lets the test send messages or break the connection.
class FakeTransport final : public LinkTransport {
 public:
  struct Written {
    int connection;  // 1 for the first stream
    v1::WorkerMessage message;
  };

  absl::StatusOr<std::unique_ptr<LinkStream>> Connect(int64_t) override {
    absl::MutexLock lock(&mu_);
    if (!reachable_) return absl::UnavailableError("fake: unreachable");
    ++connection_;
    incoming_.clear();
    broken_ = false;
    return std::make_unique<Stream>(this, connection_);
  }

  // Sends to the worker on the current connection.
  void Send(const v1::SchedulerMessage& m) {
    absl::MutexLock lock(&mu_);
    incoming_.push_back(m);
  }
  // The current connection breaks; with `reachable` false no new one opens.
  void Break(bool reachable) {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    reachable_ = reachable;
  }
  void SetReachable(bool reachable) {
    absl::MutexLock lock(&mu_);
    reachable_ = reachable;
  }
  int connection() {
    absl::MutexLock lock(&mu_);
    return connection_;
  }
  std::vector<Written> written() {
    absl::MutexLock lock(&mu_);
    return written_;
  }
  // The first message written that matches, waiting for it.
  std::optional<Written> WaitFor(
      const std::function<bool(const Written&)>& pred) {
    std::optional<Written> found;
    Eventually([&] {
      for (const auto& w : written()) {
        if (pred(w)) {
          found = w;
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  class Stream final : public LinkStream {
   public:
    Stream(FakeTransport* t, int connection) : t_(t), connection_(connection) {}
    bool Write(const v1::WorkerMessage& m) override {
      absl::MutexLock lock(&t_->mu_);
      if (Dead()) return false;
      t_->written_.push_back({connection_, m});
      if (m.has_register_()) {
        v1::SchedulerMessage reply;
        reply.mutable_registered()->set_worker_id(1);
        reply.mutable_registered()->set_heartbeat_interval_ms(1000);
        t_->incoming_.push_back(reply);
      }
      return true;
    }
    bool Read(v1::SchedulerMessage* m) override {
      absl::MutexLock lock(&t_->mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(t_->mu_) {
        return Dead() || !t_->incoming_.empty();
      };
      t_->mu_.Await(absl::Condition(&ready));
      if (Dead()) return false;
      *m = t_->incoming_.front();
      t_->incoming_.pop_front();
      return true;
    }
    void Cancel() override {
      absl::MutexLock lock(&t_->mu_);
      cancelled_ = true;
    }
    absl::Status Finish() override {
      return absl::UnavailableError("fake: broken");
    }

   private:
    bool Dead() const ABSL_SHARED_LOCKS_REQUIRED(t_->mu_) {
      return cancelled_ || connection_ != t_->connection_ || t_->broken_;
    }
    FakeTransport* const t_;
    const int connection_;
    bool cancelled_ ABSL_GUARDED_BY(t_->mu_) = false;
  };

  absl::Mutex mu_;
  bool reachable_ ABSL_GUARDED_BY(mu_) = true;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  int connection_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::SchedulerMessage> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<Written> written_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_TESTS_WORKER_WORKER_FAKES_H_
