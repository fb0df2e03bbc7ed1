// The gRPC face of the scheduler. Handlers are thin: check the token, call
// the domain, map the Status. Unary and blob calls use the sync API; the
// long-lived worker stream uses the callback API and never blocks.
#ifndef DLBATCH_SCHEDULER_RPC_SERVICE_H_
#define DLBATCH_SCHEDULER_RPC_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "scheduler/rpc/access.h"
#include "scheduler/rpc/connection_gate.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/rpc/identity.h"
#include "scheduler/scheduler.h"
#include "scheduler/store/blob_store.h"

namespace dlbatch::scheduler {

// SubmitJob uses the callback API: on a loaded 2-core machine the sync
// server's hand-off between its poller and handler threads cost more than
// the submit itself.
class SchedulerService final
    : public v1::Scheduler::WithCallbackMethod_SubmitJob<
          v1::Scheduler::WithCallbackMethod_WatchEvents<
              v1::Scheduler::WithCallbackMethod_ReadDiary<
                  v1::Scheduler::WithCallbackMethod_WaitJobs<
                      v1::Scheduler::Service>>>> {
 public:
  // `identities` is borrowed. shared_visibility: every caller may read
  // every job's diary, progress and outputs (never another's env:, never
  // cancel another's job).
  // `credentials` is the table `identities` reads: AddCredential and
  // RevokeCredential change it after the store. `open_calls` holds the
  // long-lived calls, so a revoke ends them.
  SchedulerService(Scheduler* scheduler, BlobStore* blobs,
                   const Identities* identities, CredentialTable* credentials,
                   OpenCalls* open_calls, bool shared_visibility)
      : scheduler_(scheduler),
        blobs_(blobs),
        identities_(identities),
        credentials_(credentials),
        open_calls_(open_calls),
        shared_visibility_(shared_visibility) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobReply* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsReply* reply) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::Job* reply) override;
  // Followers without a thread each: reactors fed by the scheduler's
  // DiaryFollowHub (service_follow.cc).
  grpc::ServerWriteReactor<v1::DiaryChunk>* ReadDiary(
      grpc::CallbackServerContext* context,
      const v1::ReadDiaryRequest* request) override;
  grpc::Status CancelJobs(grpc::ServerContext* context,
                          const v1::CancelJobsRequest* request,
                          v1::CancelJobsReply* reply) override;
  grpc::ServerUnaryReactor* WaitJobs(grpc::CallbackServerContext* context,
                                     const v1::WaitJobsRequest* request,
                                     v1::WaitJobsReply* reply) override;
  grpc::Status RendezvousSet(grpc::ServerContext* context,
                             const v1::RendezvousSetRequest* request,
                             v1::RendezvousSetReply* reply) override;
  grpc::Status RendezvousGet(grpc::ServerContext* context,
                             const v1::RendezvousGetRequest* request,
                             v1::RendezvousGetReply* reply) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const v1::ListWorkersRequest* request,
                           v1::ListWorkersReply* reply) override;
  grpc::Status ListProfiles(grpc::ServerContext* context,
                            const v1::ListProfilesRequest* request,
                            v1::ListProfilesReply* reply) override;
  grpc::Status ListOutputs(grpc::ServerContext* context,
                           const v1::ListOutputsRequest* request,
                           v1::ListOutputsReply* reply) override;
  grpc::Status GetStats(grpc::ServerContext* context,
                        const v1::GetStatsRequest* request,
                        v1::Stats* reply) override;
  grpc::Status PurgeJobs(grpc::ServerContext* context,
                         const v1::PurgeJobsRequest* request,
                         v1::PurgeJobsReply* reply) override;
  // Long-lived: a reactor fed by the scheduler's event hub
  // (service_events.cc).
  grpc::ServerWriteReactor<v1::ClusterEvent>* WatchEvents(
      grpc::CallbackServerContext* context,
      const v1::WatchEventsRequest* request) override;
  grpc::Status StatBlobs(grpc::ServerContext* context,
                         const v1::StatBlobsRequest* request,
                         v1::StatBlobsReply* reply) override;
  grpc::Status UploadBlob(grpc::ServerContext* context,
                          grpc::ServerReader<v1::BlobChunk>* reader,
                          v1::BlobRef* reply) override;
  grpc::Status DownloadBlob(grpc::ServerContext* context,
                            const v1::DownloadBlobRequest* request,
                            grpc::ServerWriter<v1::BlobChunk>* writer) override;
  // Admins only (service_credentials.cc).
  grpc::Status AddCredential(grpc::ServerContext* context,
                             const v1::AddCredentialRequest* request,
                             v1::AddCredentialReply* reply) override;
  grpc::Status ListCredentials(grpc::ServerContext* context,
                               const v1::ListCredentialsRequest* request,
                               v1::ListCredentialsReply* reply) override;
  grpc::Status RevokeCredential(grpc::ServerContext* context,
                                const v1::RevokeCredentialRequest* request,
                                v1::RevokeCredentialReply* reply) override;

  // Per-user limits and usage, for admins only (service_limits.cc).
  grpc::Status SetUserLimit(grpc::ServerContext* context,
                            const v1::SetUserLimitRequest* request,
                            v1::UserLimitEntry* reply) override;
  grpc::Status ListUserLimits(grpc::ServerContext* context,
                              const v1::ListUserLimitsRequest* request,
                              v1::ListUserLimitsReply* reply) override;
  grpc::Status GetUsage(grpc::ServerContext* context,
                        const v1::GetUsageRequest* request,
                        v1::GetUsageReply* reply) override;

  // Worker administration (admins only) and job control (the owner or an
  // admin, as CancelJobs): service_control.cc.
  grpc::Status DrainWorker(grpc::ServerContext* context,
                           const v1::DrainWorkerRequest* request,
                           v1::WorkerInfo* reply) override;
  grpc::Status ResumeWorker(grpc::ServerContext* context,
                            const v1::ResumeWorkerRequest* request,
                            v1::WorkerInfo* reply) override;
  grpc::Status RemoveWorker(grpc::ServerContext* context,
                            const v1::RemoveWorkerRequest* request,
                            v1::RemoveWorkerReply* reply) override;
  grpc::Status ControlJobs(grpc::ServerContext* context,
                           const v1::ControlJobsRequest* request,
                           v1::ControlJobsReply* reply) override;

  // `dlbatch admin backup` (admins only) and `admin status` (users and
  // admins): service_backup.cc.
  grpc::Status BackupStore(
      grpc::ServerContext* context, const v1::BackupStoreRequest* request,
      grpc::ServerWriter<v1::BackupChunk>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest* request,
                         v1::SchedulerStatus* reply) override;

  // A one-time login URL of the web face (service_web.cc).
  grpc::Status CreateWebLogin(grpc::ServerContext* context,
                              const v1::CreateWebLoginRequest* request,
                              v1::CreateWebLoginReply* reply) override;
  // What makes CreateWebLogin's reply for a caller; unset: the scheduler
  // serves no web face.
  using WebLoginMaker =
      std::function<absl::StatusOr<v1::CreateWebLoginReply>(const Caller&)>;
  void set_web_login(WebLoginMaker make) { web_login_ = std::move(make); }

  // Calls that authenticate take their connection out of `gate`'s watch
  // (TCP connections; none is watched where this is not called).
  void set_connection_gate(ConnectionGate* gate) { gate_ = gate; }

 private:
  // Who calls; a call identified marks its connection as authenticated. A
  // worker credential is refused unless `worker_ok` (the blob calls its
  // workers make).
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context,
                                  bool worker_ok = false);
  absl::Status Authorize(const grpc::ServerContextBase& context,
                         bool worker_ok = false) {
    return Identify(context, worker_ok).status();
  }
  // An admin, or PERMISSION_DENIED saying that `what` is for admins.
  absl::StatusOr<Caller> IdentifyAdmin(const grpc::ServerContextBase& context,
                                       absl::string_view what);
  // Whether `caller` may read (diary, progress, outputs) or, with
  // `control`, cancel job `job_id` (MayAccessJob, with --shared-visibility).
  absl::Status MayAccess(const Caller& caller, int64_t job_id, bool control);
  // For a request naming jobs to act on (cancel, hold, ...): as
  // ForControllableJobs of access.h, with MayAccess.
  template <typename Request, typename Reply, typename Act>
  grpc::Status ForControllableJobs(const Caller& caller, const Request& request,
                                   Reply* reply, Act act) {
    return ToGrpcStatus(scheduler::ForControllableJobs(
        request, reply,
        [&](int64_t id) { return MayAccess(caller, id, /*control=*/true); },
        act));
  }
  // What `caller` may see of `job` (RedactJob).
  void Redact(const Caller& caller, v1::Job* job) const {
    RedactJob(caller, job);
  }
  // A rendezvous call with its attempt's secret authenticates too.
  void NoteRendezvousCaller(const grpc::ServerContextBase& context,
                            int64_t job_id, int attempt,
                            const std::string& secret);

  Scheduler* scheduler_;
  BlobStore* blobs_;
  const Identities* const identities_;
  CredentialTable* const credentials_;
  OpenCalls* const open_calls_;
  const bool shared_visibility_;
  ConnectionGate* gate_ = nullptr;
  WebLoginMaker web_login_;
  absl::Mutex admin_mu_;  // one credential change at a time
};

class WorkerLinkService final : public v1::WorkerLink::CallbackService {
 public:
  // Admins (root or the scheduler's user on the socket, admin tokens) and
  // worker credentials may register a worker; user tokens may not.
  WorkerLinkService(Scheduler* scheduler, const Identities* identities,
                    OpenCalls* open_calls)
      : scheduler_(scheduler),
        identities_(identities),
        open_calls_(open_calls) {}
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>* Connect(
      grpc::CallbackServerContext* context) override;
  void set_connection_gate(ConnectionGate* gate) { gate_ = gate; }

 private:
  Scheduler* scheduler_;
  const Identities* const identities_;
  OpenCalls* const open_calls_;
  ConnectionGate* gate_ = nullptr;
};

// A long-lived call's registration under its caller's credential, so that
// revoking the credential ends the call (ServerContext::TryCancel). Open
// once the call is admitted; Close first thing in the reactor's OnDone.
class RevocableCall {
 public:
  void Open(OpenCalls* calls, const std::string& credential,
            grpc::CallbackServerContext* context) {
    calls_ = calls;
    id_ = calls->Add(credential, [context] { context->TryCancel(); });
  }
  void Close() {
    if (calls_ != nullptr && id_ != 0) calls_->Remove(id_);
    id_ = 0;
  }

 private:
  OpenCalls* calls_ = nullptr;
  int64_t id_ = 0;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_SERVICE_H_
