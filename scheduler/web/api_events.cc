// /api/v1/events: the cluster's changes as Server-Sent Events, from the
// scheduler's event hub as `dlbatch monitor`'s WatchEvents gets them. The
// stream's WatchQueue keeps at most one pending state per job and worker
// (the latest wins), so a slow browser costs bounded memory and never
// holds the scheduler up; writes start from the hub's wake thread or from
// the previous write's completion, one at a time.
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "scheduler/rpc/access.h"
#include "scheduler/web/api.h"
#include "scheduler/web/api_params.h"

namespace dlbatch::scheduler::web {
namespace {

class ClusterEventSource final
    : public StreamSource,
      public EventWriter,
      public std::enable_shared_from_this<ClusterEventSource> {
 public:
  // `job` != 0: only that job's changes, after its state now (`first`).
  ClusterEventSource(Scheduler* scheduler, Caller caller, int64_t job,
                     v1::Job first)
      : scheduler_(scheduler),
        caller_(std::move(caller)),
        job_(job),
        first_(std::move(first)) {}

  void Start(std::shared_ptr<StreamWriter> writer) override {
    {
      absl::MutexLock lock(&mu_);
      writer_ = writer;
      self_ = shared_from_this();
    }
    absl::StatusOr<std::shared_ptr<WatchQueue>> queue =
        scheduler_->watchers().Watch(v1::WatchEventsRequest(), this);
    if (!queue.ok()) {
      Json error{{"code", absl::StatusCodeToString(queue.status().code())},
                 {"message", std::string(queue.status().message())}};
      auto self = shared_from_this();
      writer->Write(SseMessage("error", JsonText(Json{{"error", error}}, true)),
                    [self](bool) { self->FinishStream(); });
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      queue_ = *queue;
    }
    if (job_ == 0) {
      (*queue)->Pump();
      return;
    }
    // The job as it is now, whether or not the snapshot has it (an ended
    // job's may not), then its changes.
    RedactJob(caller_, &first_);
    auto self = shared_from_this();
    writer->Write(SseMessage("job", JsonText(JobJson(first_), true)),
                  [self, q = *queue](bool ok) {
                    if (ok) {
                      q->Pump();
                    } else {
                      q->Close();
                    }
                  });
  }

  void Cancel() override {
    std::shared_ptr<WatchQueue> queue;
    {
      absl::MutexLock lock(&mu_);
      queue = queue_;
    }
    if (queue) queue->Close();
  }

  // EventWriter: the queue never has two of these outstanding.
  void WriteEvent(v1::ClusterEvent event) override {
    std::string bytes;
    if (event.has_job()) {
      if (job_ == 0 || event.job().id() == job_) {
        v1::Job job = event.job();
        RedactJob(caller_, &job);
        bytes = SseMessage("job", JsonText(JobJson(job), true));
      }
    } else if (event.has_worker()) {
      if (job_ == 0)
        bytes =
            SseMessage("worker", JsonText(WorkerJson(event.worker()), true));
    } else if (event.snapshot_done()) {
      bytes = SseMessage("ready", "{}");
    }
    std::shared_ptr<StreamWriter> writer;
    std::shared_ptr<WatchQueue> queue;
    {
      absl::MutexLock lock(&mu_);
      writer = writer_;
      queue = queue_;
    }
    if (bytes.empty()) {
      // Another job's or a worker's: written at once. OnWritten pumps the
      // next entry, which may come back here: a loop, not a recursion.
      if (skipping_) {
        skip_again_ = true;
        return;
      }
      skipping_ = true;
      do {
        skip_again_ = false;
        queue->OnWritten(true);
      } while (skip_again_);
      skipping_ = false;
      return;
    }
    writer->Write(std::move(bytes), [queue](bool ok) { queue->OnWritten(ok); });
  }

  void FinishStream() override {
    std::shared_ptr<StreamWriter> writer;
    std::shared_ptr<WatchQueue> queue;
    std::shared_ptr<ClusterEventSource> self;
    {
      absl::MutexLock lock(&mu_);
      writer = std::move(writer_);
      queue = std::move(queue_);
      self = std::move(self_);
    }
    if (queue) {
      scheduler_->watchers().Unwatch(queue.get());
      queue->Detach();
    }
    if (writer) writer->Finish();
  }

 private:
  Scheduler* const scheduler_;
  const Caller caller_;
  const int64_t job_;
  v1::Job first_;  // Start's only
  // Used by one write at a time (the queue's serialisation), on the
  // thread that skipped an entry.
  bool skipping_ = false;
  bool skip_again_ = false;
  absl::Mutex mu_;
  std::shared_ptr<StreamWriter> writer_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<WatchQueue> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ClusterEventSource> self_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<HttpResponse> RestApi::Events(const HttpRequest& request,
                                             const Caller& caller) {
  int64_t job = 0;
  v1::Job first;
  if (request.HasQuery("job")) {
    ASSIGN_OR_RETURN(job, IntParam(request, "job", 1, INT64_MAX, 0));
    RETURN_IF_ERROR(MayAccess(caller, job, /*control=*/false));
    ASSIGN_OR_RETURN(first, scheduler_->GetJob(job));
  }
  HttpResponse response;
  response.content_type = "text/event-stream";
  response.stream = std::make_shared<ClusterEventSource>(scheduler_, caller,
                                                         job, std::move(first));
  return response;
}

}  // namespace dlbatch::scheduler::web
