#include "scheduler/rpc/service.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/blob_transfer.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"
#include "scheduler/slurm/registration.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

#define CHECK_TOKEN(context)                               \
  do {                                                     \
    if (auto _auth = Authorize(*(context)); !_auth.ok()) { \
      return ToGrpcStatus(_auth);                          \
    }                                                      \
  } while (0)

// Fault injection for tests, off unless DLBATCH_FAULT names the fault:
//   exit-after-submit-commit  _exit(137) once a new job is committed,
//                             before the submit is answered (a crash there).
// tests/integration/client_faults_test.cc uses it.
bool FaultInjected(const char* fault) {
  static const std::string named = [] {
    const char* env = std::getenv("DLBATCH_FAULT");
    return std::string(env != nullptr ? env : "");
  }();
  return !named.empty() && named == fault;
}

template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* reply) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *reply = std::move(result).value();
  return grpc::Status::OK;
}

}  // namespace

absl::StatusOr<Caller> SchedulerService::Identify(
    const grpc::ServerContextBase& context, bool worker_ok) {
  absl::StatusOr<Caller> caller = identities_->Identify(context);
  if (caller.ok() && gate_ != nullptr) gate_->Authenticated(context.peer());
  if (caller.ok() && !worker_ok) RETURN_IF_ERROR(RefuseWorker(*caller));
  return caller;
}

absl::StatusOr<Caller> SchedulerService::IdentifyAdmin(
    const grpc::ServerContextBase& context, absl::string_view what) {
  absl::StatusOr<Caller> caller = Identify(context);
  if (caller.ok()) RETURN_IF_ERROR(RequireAdmin(*caller, what));
  return caller;
}

absl::Status SchedulerService::MayAccess(const Caller& caller, int64_t job_id,
                                         bool control) {
  return MayAccessJob(caller, job_id, control, shared_visibility_,
                      [this](int64_t id) { return scheduler_->JobOwner(id); });
}

grpc::ServerUnaryReactor* SchedulerService::SubmitJob(
    grpc::CallbackServerContext* context, const v1::SubmitJobRequest* request,
    v1::SubmitJobReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  // A caller the kernel or a user's token named submits as itself,
  // whatever it says; an admin's token may submit for the user it names.
  v1::SubmitJobRequest own;
  const v1::SubmitJobRequest* submit = request;
  const bool as_named =
      !caller->from_kernel && caller->admin && !request->user().empty();
  if (!as_named && request->user() != caller->user) {
    own = *request;
    own.set_user(caller->user);
    submit = &own;
  }
  absl::StatusOr<v1::SubmitJobReply> result = scheduler_->Submit(*submit);
  if (result.ok() && !result->duplicate() &&
      FaultInjected("exit-after-submit-commit")) {
    spdlog::warn("DLBATCH_FAULT=exit-after-submit-commit: exiting");
    _exit(137);
  }
  reactor->Finish(Reply(std::move(result), reply));
  return reactor;
}

grpc::Status SchedulerService::ListJobs(grpc::ServerContext* context,
                                        const v1::ListJobsRequest* request,
                                        v1::ListJobsReply* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  v1::ListJobsRequest own;
  const v1::ListJobsRequest* list = request;
  if (request->mine()) {  // the caller as the scheduler knows it
    own = *request;
    own.set_user(caller->user);
    list = &own;
  }
  grpc::Status status = Reply(scheduler_->ListJobs(*list), reply);
  for (v1::Job& job : *reply->mutable_jobs()) Redact(*caller, &job);
  return status;
}

grpc::Status SchedulerService::GetJob(grpc::ServerContext* context,
                                      const v1::GetJobRequest* request,
                                      v1::Job* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status may = MayAccess(*caller, request->job_id(), false);
      !may.ok()) {
    return ToGrpcStatus(may);
  }
  grpc::Status status = Reply(scheduler_->GetJob(request->job_id()), reply);
  Redact(*caller, reply);
  return status;
}

grpc::Status SchedulerService::CancelJobs(grpc::ServerContext* context,
                                          const v1::CancelJobsRequest* request,
                                          v1::CancelJobsReply* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ForControllableJobs(*caller, *request, reply,
                             [&](const v1::CancelJobsRequest& allowed) {
                               return scheduler_->Cancel(allowed);
                             });
}

// The rendezvous calls authenticate with the attempt's secret instead of the
// token: they come from the job's own processes.
void SchedulerService::NoteRendezvousCaller(
    const grpc::ServerContextBase& context, int64_t job_id, int attempt,
    const std::string& secret) {
  if (gate_ == nullptr) return;
  const std::string want = scheduler_->rendezvous().SecretFor(job_id, attempt);
  if (ConstantTimeEqual(want, secret)) gate_->Authenticated(context.peer());
}

grpc::Status SchedulerService::RendezvousSet(
    grpc::ServerContext* context, const v1::RendezvousSetRequest* request,
    v1::RendezvousSetReply*) {
  NoteRendezvousCaller(*context, request->job_id(), request->attempt(),
                       request->secret());
  return ToGrpcStatus(scheduler_->rendezvous().Set(
      request->job_id(), request->attempt(), request->secret(), request->key(),
      request->value()));
}

grpc::Status SchedulerService::RendezvousGet(
    grpc::ServerContext* context, const v1::RendezvousGetRequest* request,
    v1::RendezvousGetReply* reply) {
  NoteRendezvousCaller(*context, request->job_id(), request->attempt(),
                       request->secret());
  absl::StatusOr<std::string> value = scheduler_->rendezvous().Get(
      request->job_id(), request->attempt(), request->secret(), request->key(),
      request->timeout_ms(), [&] { return context->IsCancelled(); });
  if (!value.ok()) return ToGrpcStatus(value.status());
  reply->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListWorkers(grpc::ServerContext* context,
                                           const v1::ListWorkersRequest*,
                                           v1::ListWorkersReply* reply) {
  CHECK_TOKEN(context);
  *reply = scheduler_->ListWorkers();
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListProfiles(grpc::ServerContext* context,
                                            const v1::ListProfilesRequest*,
                                            v1::ListProfilesReply* reply) {
  CHECK_TOKEN(context);
  *reply = scheduler_->ListProfiles();
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListOutputs(
    grpc::ServerContext* context, const v1::ListOutputsRequest* request,
    v1::ListOutputsReply* reply) {
  absl::StatusOr<Caller> caller = Identify(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status may = MayAccess(*caller, request->job_id(), false);
      !may.ok()) {
    return ToGrpcStatus(may);
  }
  return Reply(scheduler_->ListOutputs(request->job_id()), reply);
}

grpc::Status SchedulerService::GetStats(grpc::ServerContext* context,
                                        const v1::GetStatsRequest* request,
                                        v1::Stats* reply) {
  CHECK_TOKEN(context);
  *reply = scheduler_->admin().GetStats(request->reset_max());
  return grpc::Status::OK;
}

grpc::Status SchedulerService::PurgeJobs(grpc::ServerContext* context,
                                         const v1::PurgeJobsRequest* request,
                                         v1::PurgeJobsReply* reply) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "purging jobs");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(scheduler_->admin().Purge(*request), reply);
}

grpc::Status SchedulerService::StatBlobs(grpc::ServerContext* context,
                                         const v1::StatBlobsRequest* request,
                                         v1::StatBlobsReply* reply) {
  if (auto auth = Authorize(*context, /*worker_ok=*/true); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  for (const auto& sha : request->sha256())
    reply->add_present(blobs_->Size(sha).ok());
  return grpc::Status::OK;
}

grpc::Status SchedulerService::UploadBlob(
    grpc::ServerContext* context, grpc::ServerReader<v1::BlobChunk>* reader,
    v1::BlobRef* reply) {
  absl::StatusOr<Caller> caller = Identify(*context, /*worker_ok=*/true);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // A Slurm job's credential is readable by the job itself: it stores
  // that job's outputs and checkpoints while the job runs, and nothing at
  // any other time.
  if (const int64_t job = JobOfCredentialKey(caller->credential);
      job != 0 && !scheduler_->slurm().JobUploads(job)) {
    return ToGrpcStatus(absl::PermissionDeniedError(
        absl::StrCat("permission denied: the credential of dlbatch job ", job,
                     " uploads only while that job runs")));
  }
  v1::BlobChunk chunk;
  if (!reader->Read(&chunk)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty upload");
  }
  const std::string announced = chunk.sha256();
  reply->set_sha256(announced);
  reply->set_size(chunk.size());
  if (!announced.empty()) {
    if (auto size = blobs_->Size(announced);
        size.ok() && *size == chunk.size()) {
      return grpc::Status::OK;  // stored already; the sender stops sending
    }
  }
  // The size is checked against free space before any byte is taken.
  auto writer = blobs_->NewWriter(announced, chunk.size());
  if (!writer.ok()) return ToGrpcStatus(writer.status());
  absl::Status s;
  do {
    s = (*writer)->Append(chunk.data());
  } while (s.ok() && reader->Read(&chunk));
  if (s.ok()) s = (*writer)->Commit();
  if (!s.ok()) {
    spdlog::warn("upload of {} bytes failed: {}", reply->size(), s.ToString());
    return ToGrpcStatus(s);
  }
  reply->set_sha256((*writer)->sha256());
  return grpc::Status::OK;
}

grpc::Status SchedulerService::DownloadBlob(
    grpc::ServerContext* context, const v1::DownloadBlobRequest* request,
    grpc::ServerWriter<v1::BlobChunk>* writer) {
  absl::StatusOr<Caller> caller = Identify(*context, /*worker_ok=*/true);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // Blobs are named by content: knowing a name must not be enough to read
  // another user's outputs or attachments. A worker credential gets what
  // the jobs running on its workers need.
  if (caller->worker) {
    if (!scheduler_->users().WorkerNeedsBlob(caller->credential,
                                             request->sha256())) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrCat("permission denied: no job running on a worker of '",
                       caller->user, "' needs blob ", request->sha256())));
    }
  } else if (!caller->admin && !shared_visibility_) {
    absl::StatusOr<bool> held =
        scheduler_->UserHoldsBlob(caller->user, request->sha256());
    if (!held.ok()) return ToGrpcStatus(held.status());
    if (!*held) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrCat("permission denied: no job of ", caller->user,
                       " holds blob ", request->sha256())));
    }
  }
  auto size = blobs_->Size(request->sha256());
  if (!size.ok()) return ToGrpcStatus(size.status());
  std::string path = blobs_->PathFor(request->sha256());
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ToGrpcStatus(ErrnoStatus(errno, "open", path));
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  int64_t offset = std::clamp<int64_t>(request->offset(), 0, *size);
  v1::BlobChunk chunk;
  chunk.set_sha256(request->sha256());
  chunk.set_size(*size);
  // Read straight into the message: the bytes are copied once more, by the
  // serialisation.
  std::string* data = chunk.mutable_data();
  do {
    size_t want =
        static_cast<size_t>(std::min<int64_t>(*size - offset, kBlobChunkBytes));
    data->resize(want);
    auto n = PreadFull(fd.get(), data->data(), want, offset, path);
    if (!n.ok()) return ToGrpcStatus(n.status());
    if (*n < want) {
      return ToGrpcStatus(absl::DataLossError(
          absl::StrCat("blob ", request->sha256(), " is shorter than ", *size,
                       " bytes on the scheduler's disk")));
    }
    offset += static_cast<int64_t>(want);
    if (!writer->Write(chunk)) break;  // the reader went away
    chunk.clear_sha256();
    chunk.set_size(0);
  } while (offset < *size);
  return grpc::Status::OK;
}

// ---- the worker stream ----

namespace {

class WorkerStream;

// The scheduler's handle on a stream; outlives the reactor, after which it
// drops what it is given.
class StreamSession final : public WorkerSession {
 public:
  explicit StreamSession(WorkerStream* stream) : stream_(stream) {}
  void Send(const v1::SchedulerMessage& message) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Close(const std::string& why) override ABSL_LOCKS_EXCLUDED(mu_);
  void CloseRemoved(const std::string& why) override ABSL_LOCKS_EXCLUDED(mu_);

  // Reactor side.
  void OnWriteDone() ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Finishes the stream if that is due, after releasing mu_, which it
  // releases on every path.
  void MaybeFinishAndUnlock() ABSL_UNLOCK_FUNCTION(mu_);

  absl::Mutex mu_;
  WorkerStream* stream_ ABSL_GUARDED_BY(mu_);  // null once done
  // Its front is in flight while writing_.
  std::deque<v1::SchedulerMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool write_queue_first_ ABSL_GUARDED_BY(mu_) = false;  // finish once written
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

class WorkerStream final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::SchedulerMessage> {
 public:
  WorkerStream(Scheduler* scheduler, const absl::StatusOr<Caller>& caller,
               OpenCalls* open_calls, grpc::CallbackServerContext* context)
      : scheduler_(scheduler), session_(std::make_shared<StreamSession>(this)) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    session_->set_owner(caller->credential);
    revocable_.Open(open_calls, caller->credential, context);
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      session_->Close("the worker closed its stream");
      Gone();
      return;
    }
    if (incoming_.has_register_()) {
      session_->set_leaves_when_removed(
          incoming_.register_().leaves_when_removed());
    }
    scheduler_->OnWorkerMessage(session_, std::move(incoming_));
    incoming_.Clear();
    StartRead(&incoming_);
  }
  void OnWriteDone(bool) override { session_->OnWriteDone(); }
  void OnCancel() override { session_->Close("the stream was cancelled"); }
  void OnDone() override {
    revocable_.Close();
    Gone();
    session_->Detach();
    delete this;
  }

 private:
  void Gone() {
    if (gone_reported_) return;
    gone_reported_ = true;
    scheduler_->OnWorkerGone(session_);
  }

  Scheduler* scheduler_;
  std::shared_ptr<StreamSession> session_;
  v1::WorkerMessage incoming_;
  bool gone_reported_ = false;  // reactions on this stream are serialised
  RevocableCall revocable_;
  friend class StreamSession;
};

void StreamSession::Send(const v1::SchedulerMessage& message) {
  absl::ReleasableMutexLock lock(&mu_);
  if (stream_ == nullptr || finish_requested_) return;
  queue_.push_back(message);
  if (writing_) return;
  writing_ = true;
  const v1::SchedulerMessage* front = &queue_.front();
  WorkerStream* stream = stream_;
  lock.Release();
  // Safe unlocked: Finish waits while writing_, so the reactor lives on.
  stream->StartWrite(front);
}

void StreamSession::OnWriteDone() {
  mu_.Lock();
  queue_.pop_front();
  if (!queue_.empty() && (!finish_requested_ || write_queue_first_)) {
    const v1::SchedulerMessage* front = &queue_.front();
    WorkerStream* stream = stream_;
    mu_.Unlock();
    stream->StartWrite(front);
    return;
  }
  queue_.clear();
  writing_ = false;
  MaybeFinishAndUnlock();
}

void StreamSession::Close(const std::string& why) {
  mu_.Lock();
  if (stream_ == nullptr || finish_requested_) {
    mu_.Unlock();
    return;
  }
  finish_requested_ = true;
  finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
  MaybeFinishAndUnlock();
}

void StreamSession::CloseRemoved(const std::string& why) {
  if (!leaves_when_removed()) return Close(why);
  absl::ReleasableMutexLock lock(&mu_);
  if (stream_ == nullptr || finish_requested_) return;
  // `refused` goes in the stream, after the write in flight (what else is
  // queued no longer matters): a worker's own cancel of the call would
  // hide the status it ends with.
  while (queue_.size() > (writing_ ? 1u : 0u)) queue_.pop_back();
  v1::SchedulerMessage refused;
  refused.set_refused(why);
  queue_.push_back(std::move(refused));
  finish_requested_ = true;
  write_queue_first_ = true;
  finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
  if (writing_) return;  // OnWriteDone goes on with it
  writing_ = true;
  const v1::SchedulerMessage* front = &queue_.front();
  WorkerStream* stream = stream_;
  lock.Release();
  stream->StartWrite(front);
}

void StreamSession::MaybeFinishAndUnlock() {
  mu_.AssertHeld();
  if (!finish_requested_ || writing_ || finished_ || stream_ == nullptr) {
    mu_.Unlock();
    return;
  }
  finished_ = true;
  WorkerStream* stream = stream_;
  grpc::Status status = finish_status_;
  mu_.Unlock();
  stream->Finish(status);
}

void StreamSession::Detach() {
  absl::MutexLock lock(&mu_);
  stream_ = nullptr;
}

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>*
WorkerLinkService::Connect(grpc::CallbackServerContext* context) {
  absl::StatusOr<Caller> caller = identities_->Identify(*context);
  if (caller.ok() && gate_ != nullptr) gate_->Authenticated(context->peer());
  if (caller.ok() && !caller->admin && !caller->worker) {
    caller = absl::PermissionDeniedError(absl::StrCat(
        "permission denied: ", caller->user,
        " may not register a worker; a worker runs as root or as the "
        "scheduler's user on its socket, or presents a worker credential "
        "(`dlbatch admin worker-token NAME`) or an admin's token"));
  }
  return new WorkerStream(scheduler_, caller, open_calls_, context);
}

}  // namespace dlbatch::scheduler
