// WatchEvents: one write reactor per stream, fed by the scheduler's event
// hub. It never blocks: writes start from the hub's wake thread or from the
// previous write's completion, one at a time (see event_hub.h).
#include <memory>

#include "common/endpoint.h"
#include "common/status.h"
#include "scheduler/rpc/service.h"

namespace dlbatch::scheduler {
namespace {

class WatchStream final : public grpc::ServerWriteReactor<v1::ClusterEvent>,
                          public EventWriter {
 public:
  WatchStream(Scheduler* scheduler, const v1::WatchEventsRequest& request,
              const absl::StatusOr<Caller>& caller, OpenCalls* open_calls,
              grpc::CallbackServerContext* context)
      : scheduler_(scheduler) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    revocable_.Open(open_calls, caller->credential, context);
    auto queue = scheduler_->watchers().Watch(request, this);
    if (!queue.ok()) {
      Finish(ToGrpcStatus(queue.status()));
      return;
    }
    queue_ = *std::move(queue);
    queue_->Pump();
  }

  // EventWriter; the queue never has two of these outstanding, and with
  // the default WatchOptions each holds one entry.
  void WriteEvents(Batch events) override {
    out_ = events.front()->ToProto();
    StartWrite(&out_);
  }
  void FinishStream() override { Finish(grpc::Status::OK); }

  void OnWriteDone(bool ok) override { queue_->OnWritten(ok); }
  void OnCancel() override {
    if (queue_) queue_->Close();
  }
  void OnDone() override {
    revocable_.Close();
    if (queue_) {
      scheduler_->watchers().Unwatch(queue_.get());
      queue_->Detach();
    }
    delete this;
  }

 private:
  Scheduler* scheduler_;
  std::shared_ptr<WatchQueue> queue_;  // null if refused
  v1::ClusterEvent out_;               // the write in flight
  RevocableCall revocable_;
};

}  // namespace

grpc::ServerWriteReactor<v1::ClusterEvent>* SchedulerService::WatchEvents(
    grpc::CallbackServerContext* context,
    const v1::WatchEventsRequest* request) {
  return new WatchStream(scheduler_, *request, Identify(*context), open_calls_,
                         context);
}

}  // namespace dlbatch::scheduler
