// /api/v1/events: the cluster's changes as Server-Sent Events, from the
// scheduler's event hub as `dlbatch monitor`'s WatchEvents gets them. The
// stream's WatchQueue keeps at most one pending state per job and worker
// (the latest wins), so a slow browser costs bounded memory and never
// holds the scheduler up; writes start from the hub's wake thread or from
// the previous write's completion, one at a time.
//
// Many dashboards watch at once, so a change must cost each stream little:
// each entry's SSE text is made once for every stream (WatchEvent::Text,
// one text per variant of what RedactJob leaves), a write takes everything
// pending (up to kBatch), an idle stream waits kLingerMs for more before
// it writes, and a ?job= stream's queue takes that job's entries only.
#include <memory>
#include <string>
#include <unordered_map>
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

// One write's bound: entries, and their size hints (protobuf bytes; the
// JSON is about twice that).
constexpr size_t kBatch = 256;
constexpr size_t kBatchBytes = 32 * 1024;
// Up to this much later than at once, in exchange for one write instead of
// one per change (a few per second per stream under a busy cluster); well
// within the page's event-to-pixel goal.
constexpr int kLingerMs = 50;

// The renderings of a job entry (WatchEvent::Text's variants).
constexpr int kWholeJob = 0;     // as its owner and admins see it
constexpr int kRedactedJob = 1;  // as RedactJob leaves it for others

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
    WatchOptions options;
    options.only_job = job_;
    options.max_batch = kBatch;
    options.max_batch_bytes = kBatchBytes;
    options.linger_ms = kLingerMs;
    absl::StatusOr<std::shared_ptr<WatchQueue>> queue =
        scheduler_->watchers().Watch(v1::WatchEventsRequest(), this, options);
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

  // EventWriter: the queue never has two of these outstanding. Its
  // options let through only what this stream shows (only_job), so every
  // entry has a text.
  void WriteEvents(Batch events) override {
    std::string bytes;
    for (const auto& event : events) bytes += Text(*event);
    std::shared_ptr<StreamWriter> writer;
    std::shared_ptr<WatchQueue> queue;
    {
      absl::MutexLock lock(&mu_);
      writer = writer_;
      queue = queue_;
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
  // What this stream writes of `event`, made once for every stream that
  // shows the same variant.
  const std::string& Text(const WatchEvent& event) {
    if (const v1::Job* job = event.job()) {
      if (SeesWhole(*job)) {
        return event.Text(kWholeJob, [job] {
          return SseMessage("job", JsonText(JobJson(*job), true));
        });
      }
      // The same text for every caller RedactJob cuts it for (it takes
      // the same away from each): this one's makes it.
      return event.Text(kRedactedJob, [this, job] {
        v1::Job cut = *job;
        RedactJob(caller_, &cut);
        return SseMessage("job", JsonText(JobJson(cut), true));
      });
    }
    if (const v1::WorkerInfo* worker = event.worker()) {
      return event.Text(0, [worker] {
        return SseMessage("worker", JsonText(WorkerJson(*worker), true));
      });
    }
    static const std::string* const kReady =
        new std::string(SseMessage("ready", "{}"));
    return *kReady;
  }

  // Whether RedactJob leaves `job` as it is for this caller: no env to
  // take, or the caller may see it. Asked of RedactJob itself, once per
  // owner, so that its rule stays in one place.
  bool SeesWhole(const v1::Job& job) {
    if (job.spec().env().empty()) return true;
    auto [it, added] = sees_env_of_.try_emplace(job.user(), false);
    if (added) {
      v1::Job probe;
      probe.set_user(job.user());
      (*probe.mutable_spec()->mutable_env())["probe"] = "1";
      RedactJob(caller_, &probe);
      it->second = !probe.spec().env().empty();
    }
    return it->second;
  }

  v1::Job first_;  // Start's only
  // Whose jobs' env this caller sees, by owner; used by one write at a
  // time (the queue's serialisation).
  std::unordered_map<std::string, bool> sees_env_of_;
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
