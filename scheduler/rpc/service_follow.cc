// ReadDiary and WaitJobs: one reactor per call, fed by the scheduler's
// DiaryFollowHub. Neither blocks a thread: writes and the reply start from
// the hub's pool threads or from the previous write's completion.
#include <memory>

#include "common/endpoint.h"
#include "common/status.h"
#include "scheduler/rpc/service.h"

namespace dlbatch::scheduler {
namespace {

class DiaryStream final : public grpc::ServerWriteReactor<v1::DiaryChunk>,
                          public DiaryWriter {
 public:
  DiaryStream(DiaryFollowHub* hub, const v1::ReadDiaryRequest& request,
              const absl::StatusOr<Caller>& caller, OpenCalls* open_calls,
              grpc::CallbackServerContext* context)
      : hub_(hub) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    revocable_.Open(open_calls, caller->credential, context);
    call_ = hub_->ReadDiary(request, this);
    hub_->Start(call_);
  }

  // DiaryWriter; the hub never has two of these outstanding.
  void WriteChunk(v1::DiaryChunk chunk) override {
    out_ = std::move(chunk);
    StartWrite(&out_);
  }
  void FinishDiary(absl::Status status) override {
    Finish(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override { hub_->Written(call_, ok); }
  void OnCancel() override {
    if (call_) hub_->Cancel(call_);
  }
  void OnDone() override {
    revocable_.Close();
    if (call_) hub_->Detach(call_);
    delete this;
  }

 private:
  DiaryFollowHub* const hub_;
  DiaryFollowHub::Handle call_;  // null if refused
  v1::DiaryChunk out_;           // the write in flight
  RevocableCall revocable_;
};

class WaitCall final : public grpc::ServerUnaryReactor, public WaitReplier {
 public:
  WaitCall(DiaryFollowHub* hub, const v1::WaitJobsRequest& request,
           v1::WaitJobsReply* reply, const absl::StatusOr<Caller>& caller,
           OpenCalls* open_calls, grpc::CallbackServerContext* context)
      : hub_(hub), reply_(reply) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    revocable_.Open(open_calls, caller->credential, context);
    call_ = hub_->Wait(request, this);
    hub_->Start(call_);
  }

  void FinishWait(absl::StatusOr<v1::WaitJobsReply> reply) override {
    if (!reply.ok()) {
      Finish(ToGrpcStatus(reply.status()));
      return;
    }
    *reply_ = *std::move(reply);
    Finish(grpc::Status::OK);
  }

  void OnCancel() override {
    if (call_) hub_->Cancel(call_);
  }
  void OnDone() override {
    revocable_.Close();
    if (call_) hub_->Detach(call_);
    delete this;
  }

 private:
  DiaryFollowHub* const hub_;
  v1::WaitJobsReply* const reply_;
  DiaryFollowHub::Handle call_;  // null if refused
  RevocableCall revocable_;
};

}  // namespace

grpc::ServerWriteReactor<v1::DiaryChunk>* SchedulerService::ReadDiary(
    grpc::CallbackServerContext* context, const v1::ReadDiaryRequest* request) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (caller.ok()) {
    absl::Status may = MayAccess(*caller, request->job_id(), false);
    if (!may.ok()) caller = may;
  }
  return new DiaryStream(&scheduler_->followers(), *request, caller,
                         open_calls_, context);
}

grpc::ServerUnaryReactor* SchedulerService::WaitJobs(
    grpc::CallbackServerContext* context, const v1::WaitJobsRequest* request,
    v1::WaitJobsReply* reply) {
  return new WaitCall(&scheduler_->followers(), *request, reply,
                      Identify(*context), open_calls_, context);
}

}  // namespace dlbatch::scheduler
