// `dlbatch monitor`: the cluster and its jobs, live, from one WatchEvents
// stream. One thread reads the stream into the model and wakes the screen
// loop, which redraws only when something changed (and once a second while
// a job runs, for its elapsed time); it never polls the scheduler.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <iostream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "client/commands.h"
#include "client/diary_text.h"
#include "client/monitor_terminal.h"
#include "client/monitor_view.h"
#include "common/clock.h"
#include "common/status.h"
#include "proto/job_state.h"

namespace dlbatch::client {
namespace {

constexpr size_t kDiaryKeptLines = 5000;
constexpr char kKeysHelp[] = " j/k select  d diary  c cancel  / filter  q quit";

int64_t LocalNowMs() { return SystemClock::Get()->NowMs(); }

// The WatchEvents stream, read on a thread of its own into a model the
// screen loop reads under the same lock. Reconnects when the stream breaks
// (a scheduler restart) and starts over from a fresh snapshot.
class EventFeed {
 public:
  EventFeed(Connection* conn, std::function<void()> on_change)
      : conn_(conn), on_change_(std::move(on_change)) {}
  ~EventFeed() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (ctx_) ctx_->TryCancel();
      stop_cv_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
  }

  // Calls `f` with the model under the feed's lock; `f` must be quick.
  void Read(const std::function<void(const ClusterModel&, bool connected,
                                     const std::string& error,
                                     int64_t offset_ms)>& f) {
    absl::MutexLock lock(&mu_);
    f(model_, connected_, error_, offset_ms_);
  }

 private:
  void Run() {
    int64_t backoff_ms = 200;
    for (;;) {
      auto ctx = conn_->Context(/*deadline_ms=*/0);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        ctx_ = ctx.get();
      }
      v1::WatchEventsRequest request;
      auto reader = conn_->stub()->WatchEvents(ctx.get(), request);
      ClusterModel fresh;
      bool in_snapshot = true;
      v1::ClusterEvent event;
      while (reader->Read(&event)) {
        absl::MutexLock lock(&mu_);
        if (event.time_ms() > 0) offset_ms_ = event.time_ms() - LocalNowMs();
        if (in_snapshot && event.snapshot_done()) {
          model_ = std::move(fresh);
          in_snapshot = false;
          connected_ = true;
          error_.clear();
          backoff_ms = 200;
        } else {
          (in_snapshot ? fresh : model_).Apply(event);
        }
        if (!in_snapshot) on_change_();
      }
      grpc::Status status = reader->Finish();
      absl::MutexLock lock(&mu_);
      ctx_ = nullptr;
      if (stopping_) return;
      connected_ = false;
      error_ = std::string(conn_->Error(status).message());
      if (error_.empty()) error_ = "the stream ended";
      on_change_();
      stop_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(backoff_ms));
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 3000);
    }
  }

  Connection* const conn_;
  const std::function<void()> on_change_;
  std::thread thread_;
  absl::Mutex mu_;
  absl::CondVar stop_cv_;
  ClusterModel model_ ABSL_GUARDED_BY(mu_);
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  int64_t offset_ms_ ABSL_GUARDED_BY(mu_) = 0;  // scheduler clock minus ours
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// One job's diary, followed live on a thread of its own. Lines are labelled
// with their rank as `dlbatch diary` labels them (DiaryLabels; asking
// `several_parts` on the feed's thread).
class DiaryFeed {
 public:
  DiaryFeed(Connection* conn, int64_t job_id, std::function<void()> on_change,
            std::function<bool()> several_parts)
      : conn_(conn),
        job_id_(job_id),
        on_change_(std::move(on_change)),
        labels_(std::move(several_parts)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~DiaryFeed() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    thread_.join();
  }

  void Read(const std::function<void(const std::deque<std::string>&,
                                     const std::string&)>& f) {
    absl::MutexLock lock(&mu_);
    f(lines_, status_);
  }

 private:
  void Run() {
    auto ctx = conn_->Context(/*deadline_ms=*/0);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      ctx_ = ctx.get();
      status_ = "following";
    }
    v1::ReadDiaryRequest request;
    request.set_job_id(job_id_);
    request.set_follow(true);
    auto reader = conn_->stub()->ReadDiary(ctx.get(), request);
    v1::DiaryChunk chunk;
    while (reader->Read(&chunk)) {
      std::vector<std::string> shown;
      for (const auto& line : chunk.lines()) {
        // Escaped as `dlbatch diary` shows it, less the \r of progress bars.
        shown.push_back(absl::StrCat(
            labels_.Label(line) ? RankLabel(line) : "",
            absl::StrReplaceAll(
                EscapeDiaryText(absl::StrReplaceAll(line.text(), {{"\r", ""}})),
                {{"\t", "    "}})));
      }
      absl::MutexLock lock(&mu_);
      for (auto& text : shown) {
        lines_.push_back(std::move(text));
        if (lines_.size() > kDiaryKeptLines) lines_.pop_front();
      }
      if (chunk.end())
        status_ = absl::StrCat("job ", JobStateName(chunk.state()));
      on_change_();
    }
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    ctx_ = nullptr;
    if (!status.ok() && !stopping_) {
      status_ = std::string(conn_->Error(status).message());
      on_change_();
    }
  }

  Connection* const conn_;
  const int64_t job_id_;
  const std::function<void()> on_change_;
  DiaryLabels labels_;  // the feed's thread's only
  absl::Mutex mu_;
  std::deque<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::string status_ ABSL_GUARDED_BY(mu_) = "connecting";
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The interactive screen: what is selected, which mode the keys are in.
class MonitorUi {
 public:
  MonitorUi(Connection* conn, RawTerminal* term)
      : conn_(conn), term_(term), feed_(conn, [term] { term->Wake(); }) {}

  int Run() {
    feed_.Start();
    bool full = true;
    while (!quit_ && !term_->quit_requested()) {
      if (term_->TakeResize()) full = true;
      bool ticking = false;
      term_->Draw(Frame(&ticking), full);
      full = false;
      struct pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0},
                              {term_->wake_fd(), POLLIN, 0}};
      // A running job's elapsed time moves on; nothing else needs a timer.
      int n = ::poll(fds, 2, ticking ? 1000 : -1);
      if (n < 0) continue;  // EINTR: a signal, noted by its handler
      if (fds[1].revents & POLLIN) term_->Drain();
      if (fds[0].revents & (POLLHUP | POLLERR)) break;  // the terminal is gone
      if (fds[0].revents & POLLIN) {
        char buf[256];
        ssize_t got = ::read(STDIN_FILENO, buf, sizeof(buf));
        if (got <= 0) break;
        for (const Key& key :
             DecodeKeys(std::string_view(buf, static_cast<size_t>(got)))) {
          OnKey(key);
        }
      }
    }
    diary_.reset();
    feed_.Stop();
    return 0;
  }

 private:
  enum class Mode { kMain, kFilter, kConfirmCancel, kDiary };

  std::vector<std::string> Frame(bool* ticking) {
    int rows = 24, cols = 80;
    term_->Size(&rows, &cols);
    std::vector<std::string> lines;
    if (mode_ == Mode::kDiary && diary_) {
      diary_->Read(
          [&](const std::deque<std::string>& text, const std::string& status) {
            lines = RenderDiary(
                absl::StrCat("diary of job ", diary_job_, " (", status, ")"),
                text, " q/Esc back to the jobs", rows, cols);
          });
      return lines;
    }
    feed_.Read([&](const ClusterModel& model, bool connected,
                   const std::string& error, int64_t offset_ms) {
      listed_.clear();
      for (const v1::Job* job : ListedJobs(model, filter_))
        listed_.push_back(job->id());
      auto still = std::find(listed_.begin(), listed_.end(), selected_);
      if (still == listed_.end())
        selected_ = listed_.empty() ? 0 : listed_.front();
      for (const auto& [id, job] : model.jobs) {
        if (job.state() == v1::JOB_STATE_RUNNING ||
            job.state() == v1::JOB_STATE_CANCELLING) {
          *ticking = true;
        }
      }
      MonitorScreen screen;
      screen.rows = rows;
      screen.cols = cols;
      screen.title = connected ? conn_->address()
                     : error.empty()
                         ? "(connecting...)"
                         : absl::StrCat("(reconnecting: ", error, ")");
      screen.filter = filter_;
      screen.editing_filter = mode_ == Mode::kFilter;
      screen.selected_job = selected_;
      screen.footer = Footer();
      lines = RenderMain(model, screen, LocalNowMs() + offset_ms);
    });
    return lines;
  }

  std::string Footer() const {
    switch (mode_) {
      case Mode::kFilter:
        return " type to filter by name, user or state; Enter keeps, Esc "
               "clears";
      case Mode::kConfirmCancel:
        return absl::StrCat(" Cancel job ", selected_, "? [y/N]");
      default:
        return message_.empty() ? kKeysHelp : absl::StrCat(" ", message_);
    }
  }

  void Move(int delta) {
    if (listed_.empty()) return;
    auto it = std::find(listed_.begin(), listed_.end(), selected_);
    int at = it == listed_.end() ? 0 : static_cast<int>(it - listed_.begin());
    at = std::clamp(at + delta, 0, static_cast<int>(listed_.size()) - 1);
    selected_ = listed_[static_cast<size_t>(at)];
  }

  void OnKey(const Key& key) {
    if (key.kind == KeyKind::kChar && key.ch == 0x03) {  // Ctrl-C
      quit_ = true;
      return;
    }
    switch (mode_) {
      case Mode::kDiary:
        if (key.kind == KeyKind::kEscape ||
            (key.kind == KeyKind::kChar && key.ch == 'q')) {
          diary_.reset();
          mode_ = Mode::kMain;
        }
        return;
      case Mode::kConfirmCancel:
        mode_ = Mode::kMain;
        if (key.kind == KeyKind::kChar && (key.ch == 'y' || key.ch == 'Y')) {
          CancelSelected();
        } else {
          message_ = absl::StrCat("job ", selected_, " not cancelled");
        }
        return;
      case Mode::kFilter:
        if (key.kind == KeyKind::kEnter) {
          mode_ = Mode::kMain;
        } else if (key.kind == KeyKind::kEscape) {
          filter_.clear();
          mode_ = Mode::kMain;
        } else if (key.kind == KeyKind::kBackspace) {
          if (!filter_.empty()) filter_.pop_back();
        } else if (key.kind == KeyKind::kChar && key.ch >= 0x20 &&
                   key.ch < 0x7f) {
          filter_.push_back(key.ch);
        }
        return;
      case Mode::kMain:
        break;
    }
    message_.clear();
    switch (key.kind) {
      case KeyKind::kUp:
        Move(-1);
        return;
      case KeyKind::kDown:
        Move(1);
        return;
      case KeyKind::kPageUp:
        Move(-10);
        return;
      case KeyKind::kPageDown:
        Move(10);
        return;
      case KeyKind::kHome:
        Move(-(1 << 30));
        return;
      case KeyKind::kEnd:
        Move(1 << 30);
        return;
      case KeyKind::kEscape:
        filter_.clear();
        return;
      default:
        break;
    }
    if (key.kind != KeyKind::kChar) return;
    switch (key.ch) {
      case 'q':
        quit_ = true;
        break;
      case 'k':
        Move(-1);
        break;
      case 'j':
        Move(1);
        break;
      case 'g':
        Move(-(1 << 30));
        break;
      case 'G':
        Move(1 << 30);
        break;
      case '/':
        mode_ = Mode::kFilter;
        break;
      case 'd':
        if (selected_ != 0) {
          diary_job_ = selected_;
          const int64_t job = selected_;
          diary_ = std::make_unique<DiaryFeed>(
              conn_, job, [this] { term_->Wake(); },
              [this, job] {
                bool several = false;
                feed_.Read(
                    [&](const ClusterModel& model, bool, const auto&, int64_t) {
                      auto it = model.jobs.find(job);
                      several = it != model.jobs.end() &&
                                RunsSeveralProcesses(it->second);
                    });
                return several;
              });
          mode_ = Mode::kDiary;
        }
        break;
      case 'c':
        if (selected_ != 0) mode_ = Mode::kConfirmCancel;
        break;
      default:
        break;
    }
  }

  void CancelSelected() {
    v1::CancelJobsRequest request;
    request.add_job_ids(selected_);
    v1::CancelJobsReply reply;
    auto ctx = conn_->Context(/*deadline_ms=*/10000);
    absl::Status s =
        conn_->Error(conn_->stub()->CancelJobs(ctx.get(), request, &reply));
    if (!s.ok()) {
      message_ = std::string(s.message());
    } else if (reply.results_size() > 0 && !reply.results(0).error().empty()) {
      message_ = reply.results(0).error();
    } else {
      message_ = absl::StrCat("job ", selected_, " ",
                              reply.results_size() > 0
                                  ? JobStateName(reply.results(0).state())
                                  : "cancel requested");
    }
  }

  Connection* const conn_;
  RawTerminal* const term_;
  EventFeed feed_;
  std::unique_ptr<DiaryFeed> diary_;
  int64_t diary_job_ = 0;
  Mode mode_ = Mode::kMain;
  std::vector<int64_t> listed_;  // as last drawn
  int64_t selected_ = 0;
  std::string filter_;
  std::string message_;
  bool quit_ = false;
};

absl::StatusOr<int> PrintSnapshot(Connection& conn) {
  ClusterModel model;
  bool complete = false;
  grpc::Status status;
  // Retried while the scheduler is unreachable, from a fresh snapshot.
  for (;;) {
    const int64_t started = Connection::MonotonicMs();
    auto ctx = conn.Context(/*deadline_ms=*/30000);
    v1::WatchEventsRequest request;
    auto reader = conn.stub()->WatchEvents(ctx.get(), request);
    model = ClusterModel();
    v1::ClusterEvent event;
    while (reader->Read(&event)) {
      if (event.snapshot_done()) {
        if (event.time_ms() > 0) model.server_time_ms = event.time_ms();
        complete = true;
        break;
      }
      model.Apply(event);
    }
    ctx->TryCancel();
    status = reader->Finish();
    if (complete || !conn.RetryAfter(status, started)) break;
  }
  if (!complete) {
    RETURN_IF_ERROR(conn.Error(status));
    return absl::UnavailableError(
        "the scheduler ended the event stream before its snapshot");
  }
  int64_t now = model.server_time_ms > 0 ? model.server_time_ms : LocalNowMs();
  std::cout << PlainSnapshot(model, now) << std::flush;
  return 0;
}

}  // namespace

absl::StatusOr<int> Monitor(Connection& conn, bool once) {
  if (once || !::isatty(STDOUT_FILENO) || !::isatty(STDIN_FILENO))
    return PrintSnapshot(conn);
  ASSIGN_OR_RETURN(std::unique_ptr<RawTerminal> term, RawTerminal::Open());
  MonitorUi ui(&conn, term.get());
  return ui.Run();
}

}  // namespace dlbatch::client
